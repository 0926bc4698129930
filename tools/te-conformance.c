/* SPDX-License-Identifier: Apache-2.0 */
/* te-conformance: run te's ABI and behaviour suite against a transport plugin module. */

/*
 * te-conformance PLUGIN.so [--config FILE] [--location LOC] ...
 *
 * First the module alone, in a child process (tools/conformance/abi.c): loading, descriptor,
 * name, exports, options, init, caps, devices, registration. Then two engines in two processes
 * (tools/conformance/checks.c): this process is the initiator and runs every check through te.h,
 * another te-conformance process (--target, tools/conformance/target.c) serves a guarded region.
 * The initiator loads the plugin through te-conformance's shim (tools/conformance/shim.c), which
 * checks the plugin's side of the contract and injects faults. One line per check:
 *   ok - NAME [(details)]  |  FAIL - NAME: why  |  skip - NAME: why
 * then "N skipped" and "N passed, N failed". Exit status 0 when nothing failed, 1 when a
 * check failed, 2 on a usage error. docs/man/te-conformance.1 is the manual.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance/conformance.h"
#include "te_build_config.h"

#ifndef TE_CONFORMANCE_SHIM
#define TE_CONFORMANCE_SHIM "te-conformance-shim.so"
#endif

/* The shim: $TE_CONFORMANCE_SHIM, next to this executable (a build tree), the install path. */
static char *find_shim(const char *self)
{
	const char *env = g_getenv("TE_CONFORMANCE_SHIM");
	g_autofree char *dir = g_path_get_dirname(self);
	char *beside;

	if (env && *env)
		return g_strdup(env);
	beside = g_build_filename(dir, "te-conformance-shim.so", NULL);
	if (g_file_test(beside, G_FILE_TEST_EXISTS))
		return beside;
	g_free(beside);
	return g_strdup(TE_CONFORMANCE_SHIM);
}

static void remove_tmpdir(const char *dir)
{
	g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
	const char *name;

	while (d && (name = g_dir_read_name(d))) {
		g_autofree char *p = g_build_filename(dir, name, NULL);

		(void)unlink(p);
	}
	(void)rmdir(dir);
}

static void run_checks(void *c)
{
	checks_run(c);
}

int main(int argc, char **argv)
{
	struct conf c = { 0 };
	gboolean version = FALSE, verbose = FALSE, no_shim = FALSE;
	g_autofree char *config = NULL, *location = NULL;
	g_auto(GStrv) skip = NULL, only = NULL;
	gint hang = 120;
	g_autoptr(GError) error = NULL;
	g_autoptr(GOptionContext) octx = NULL;
	g_autofree char *err = NULL;
	char real[PATH_MAX];
	int rc;
	const GOptionEntry entries[] = {
		{ "config", 'c', 0, G_OPTION_ARG_FILENAME, &config,
		  "The plugin's options: a YAML options mapping, a transports entry, or an engine "
		  "configuration with transports:",
		  "FILE" },
		{ "location", 'l', 0, G_OPTION_ARG_STRING, &location,
		  "Memory of the regions (cpu, cuda:0, hip:0, cxl:0; default: from the caps)",
		  "LOC" },
		{ "skip", 's', 0, G_OPTION_ARG_STRING_ARRAY, &skip,
		  "Skip the checks matching PATTERN (glob; repeatable)", "PATTERN" },
		{ "only", 'o', 0, G_OPTION_ARG_STRING_ARRAY, &only,
		  "Run only the checks matching PATTERN (glob; repeatable)", "PATTERN" },
		{ "no-shim", 0, 0, G_OPTION_ARG_NONE, &no_shim,
		  "Load the module itself, without the contract checks and fault injection", NULL },
		{ "hang-timeout", 0, 0, G_OPTION_ARG_INT, &hang,
		  "Seconds after which a check counts as hung (default 120)", "S" },
		{ "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose, "Engine logs and notes on stderr",
		  NULL },
		{ "version", 'V', 0, G_OPTION_ARG_NONE, &version, "Print versions and exit", NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};

	/* Target mode: one of the processes this tool starts. */
	if (argc > 1 && strcmp(argv[1], "--target") == 0) {
		signal(SIGPIPE, SIG_IGN);
		return target_main(argc - 1, argv + 1);
	}

	octx = g_option_context_new("PLUGIN.so");
	g_option_context_set_summary(
		octx, "Check a te transport plugin module against the plugin ABI and the engine's\n"
		      "expectations: the module alone (load, descriptor, exports, caps, devices),\n"
		      "then two engines in two processes (READ/WRITE 1 B to 64 MiB, batches,\n"
		      "back-pressure, cancel, deadlines, retries, failures, fini, reload, bad "
		      "input).\n"
		      "Prints one line per check and \"N passed, N failed\"; exit status 1 when a "
		      "check failed.");
	g_option_context_add_main_entries(octx, entries, NULL);
	if (!g_option_context_parse(octx, &argc, &argv, &error)) {
		fprintf(stderr, "te-conformance: %s (try --help)\n", error->message);
		return 2;
	}
	if (version) {
		printf("te-conformance %s (plugin ABI %d.%d)\n", TE_VERSION, TE_PLUGIN_ABI_MAJOR,
		       TE_PLUGIN_ABI_MINOR);
		return 0;
	}
	if (argc != 2) {
		fprintf(stderr, "te-conformance: expected one PLUGIN.so (try --help)\n");
		return 2;
	}
	if (!realpath(argv[1], real)) {
		fprintf(stderr, "te-conformance: %s: %s\n", argv[1], g_strerror(errno));
		return 2;
	}
	if (hang < 10) {
		fprintf(stderr, "te-conformance: --hang-timeout must be at least 10 s\n");
		return 2;
	}
	c.plugin = g_strdup(real);
	c.config = config;
	c.location = g_strdup(location);
	c.skip = skip;
	c.only = only;
	c.verbose = verbose;
	c.no_shim = no_shim;
	c.hang_s = (unsigned)hang;
	c.self = g_file_read_link("/proc/self/exe", NULL);
	if (!c.self)
		c.self = g_strdup(argv[0]);
	c.shim_path = find_shim(c.self);
	if (config && !options_parse(config, &c.opts, &err)) {
		fprintf(stderr, "te-conformance: %s\n", err);
		return 2;
	}
	c.tmpdir = g_dir_make_tmp("te-conformance-XXXXXX", &error);
	if (!c.tmpdir) {
		fprintf(stderr, "te-conformance: %s\n", error->message);
		return 2;
	}
	/* A dead target's stdin must not kill this process. */
	signal(SIGPIPE, SIG_IGN);
	report_init(&c);

	/* The module alone, in a child: before this process has any thread. */
	abi_run(&c);
	if (c.abi_ready && c.opts && !options_select(c.opts, c.name, &err)) {
		fprintf(stderr, "te-conformance: %s\n", err);
		remove_tmpdir(c.tmpdir);
		return 2;
	}
	/* The engine checks, in a process of their own: a plugin crashing the engine is a FAIL. */
	report_in_child(run_checks, &c, "engine");
	rc = report_summary();

	remove_tmpdir(c.tmpdir);
	options_free(c.opts);
	g_free(c.plugin);
	g_free(c.location);
	g_free(c.self);
	g_free(c.shim_path);
	g_free(c.tmpdir);
	g_free(c.name);
	return rc;
}
