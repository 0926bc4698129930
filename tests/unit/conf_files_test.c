/* SPDX-License-Identifier: Apache-2.0 */
/* conf_files_test.c: every example YAML in conf/ loads and round-trips through config_to_yaml. */
#include <string.h>

#include <glib.h>

#include "core/config.h"

/* Fewer files than this means the wrong directory, not a pass. */
#define MIN_CONF_FILES 10

static void test_file(gconstpointer data)
{
	const char *path = data;
	struct config *cfg = NULL, *again = NULL;
	char *err = NULL;
	g_autofree char *y1 = NULL, *y2 = NULL;

	if (config_load_file(path, &cfg, &err) != TE_OK)
		g_error("%s", err);
	y1 = config_to_yaml(cfg);
	if (config_parse(y1, strlen(y1), path, &again, &err) != TE_OK)
		g_error("config_to_yaml output of %s does not parse: %s\n%s", path, err, y1);
	y2 = config_to_yaml(again);
	g_assert_cmpstr(y1, ==, y2);
	config_free(again);
	config_free(cfg);
}

/* conf/default.yaml documents the built-in default: same effective configuration. */
static void test_default_matches(gconstpointer data)
{
	g_autofree char *path = g_build_filename(data, "default.yaml", NULL);
	struct config *file = NULL, *builtin = NULL;
	char *err = NULL;
	g_autofree char *a = NULL, *b = NULL;

	if (config_load_file(path, &file, &err) != TE_OK)
		g_error("%s", err);
	g_assert_cmpint(config_parse(config_default_yaml, strlen(config_default_yaml), "builtin",
				     &builtin, &err),
			==, TE_OK);
	a = config_to_yaml(file);
	b = config_to_yaml(builtin);
	g_assert_cmpstr(a, ==, b);
	config_free(file);
	config_free(builtin);
}

/* Tests start engines from conf/loopback-test.yaml: it must name the loopback transport. */
static void test_loopback_file(gconstpointer data)
{
	g_autofree char *path = g_build_filename(data, "loopback-test.yaml", NULL);
	struct config *cfg = NULL;
	char *err = NULL;

	if (config_load_file(path, &cfg, &err) != TE_OK)
		g_error("%s", err);
	g_assert_cmpuint(cfg->n_transports, >=, 1);
	g_assert_cmpstr(cfg->transports[0].name, ==, "loopback");
	g_assert_true(cfg->transports[0].required);
	config_free(cfg);
}

/* g_ptr_array_sort passes pointers to the elements. */
static int cmp_name(gconstpointer a, gconstpointer b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(g_free);
	g_autoptr(GError) gerr = NULL;
	g_autofree char *dir = NULL;
	const char *name;
	GDir *d;

	g_test_init(&argc, &argv, NULL);
	if (argc > 1)
		dir = g_strdup(argv[1]);
	else if (g_getenv("TE_SOURCE_ROOT"))
		dir = g_build_filename(g_getenv("TE_SOURCE_ROOT"), "conf", NULL);
	else
		g_error("usage: %s CONF_DIR (or set TE_SOURCE_ROOT)", argv[0]);

	d = g_dir_open(dir, 0, &gerr);
	if (!d)
		g_error("%s", gerr->message);
	while ((name = g_dir_read_name(d)))
		if (g_str_has_suffix(name, ".yaml"))
			g_ptr_array_add(files, g_strdup(name));
	g_dir_close(d);
	if (files->len < MIN_CONF_FILES)
		g_error("%s: %u .yaml files, expected at least %d", dir, files->len,
			MIN_CONF_FILES);
	g_ptr_array_sort(files, cmp_name);

	for (guint i = 0; i < files->len; i++) {
		const char *f = files->pdata[i];
		g_autofree char *test = g_strdup_printf("/conf-files/load/%s", f);

		/* The test data lives as long as the process. */
		g_test_add_data_func_full(test, g_build_filename(dir, f, NULL), test_file, g_free);
	}
	g_test_add_data_func("/conf-files/default-matches-builtin", dir, test_default_matches);
	g_test_add_data_func("/conf-files/loopback-test", dir, test_loopback_file);
	return g_test_run();
}
