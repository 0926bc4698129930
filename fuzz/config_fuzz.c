/* SPDX-License-Identifier: Apache-2.0 */
/* config_fuzz.c: libFuzzer target for config_parse, checking error format and round trip. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "core/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Abort with a message: libFuzzer and the replay driver both report it as a crash. */
static void check(int cond, const char *what, const char *detail)
{
	if (cond)
		return;
	fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail ? detail : "");
	abort();
}

/* Every error reads "fuzz:<line>:<col>: <path>: <reason>" with 1-based positions. */
static void check_error(const char *err)
{
	const char *p = err;
	char *end;
	unsigned long v;

	check(err && g_str_has_prefix(err, "fuzz:"), "error without the name prefix", err);
	p += strlen("fuzz:");
	for (int i = 0; i < 2; i++) {
		v = strtoul(p, &end, 10);
		check(end != p && v >= 1 && *end == ':', "error without line:col", err);
		p = end + 1;
	}
	check(*p == ' ' && strstr(p + 1, ": ") != NULL, "error without path: reason", err);
	check(strchr(err, '\n') == NULL, "error message spans lines", err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config *cfg = NULL, *again = NULL;
	char *err = NULL, *yaml, *yaml2;
	enum te_status st;

	st = config_parse((const char *)data, size, "fuzz", &cfg, &err);
	if (st != TE_OK) {
		check(cfg == NULL, "config set on failure", NULL);
		check(st == TE_ERR_CONFIG, "unexpected status", err);
		check_error(err);
		g_free(err);
		return 0;
	}
	check(cfg && !err, "success without config or with an error", err);

	/* The effective configuration must parse back to itself. */
	yaml = config_to_yaml(cfg);
	if (strlen(yaml) <= CONFIG_MAX_INPUT) {
		st = config_parse(yaml, strlen(yaml), "fuzz", &again, &err);
		check(st == TE_OK, "config_to_yaml output does not parse", err);
		yaml2 = config_to_yaml(again);
		check(strcmp(yaml, yaml2) == 0, "round trip changed the configuration", yaml2);
		g_free(yaml2);
		config_free(again);
	}
	g_free(yaml);
	config_free(cfg);
	return 0;
}
