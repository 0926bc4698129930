/* SPDX-License-Identifier: Apache-2.0 */
/*
 * options_test.c: declared plugin options (ABI 1.2) at engine start: a bad option fails start
 * with file:line:col whether the transport is required or optional; defaults reach config_get.
 */
#include "itest.h"
#include "logcap.h"

#define SENTINEL ((struct te_engine *)0x0b75)

/* Start an engine from @yaml, named "opts.yaml" in messages, logging into @cap when given. */
static enum te_status start(const char *yaml, struct logcap *cap, struct te_engine **e)
{
	struct te_engine_opts o = {
		.size = sizeof(o),
		.config_yaml = yaml,
		.config_yaml_len = strlen(yaml),
		.config_name = "opts.yaml",
		.log_fn = cap ? logcap_fn : NULL,
		.log_user = cap,
		.log_level = cap ? TE_LOG_INFO : -1,
	};

	return te_engine_new(&o, e);
}

/* Engine start must fail with @want and exactly the message @msg. */
static void expect_failure(const char *yaml, enum te_status want, const char *msg)
{
	struct te_engine *e = SENTINEL;
	enum te_status st = start(yaml, NULL, &e);

	g_test_message("%d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, want);
	g_assert_true(e == SENTINEL);
	g_assert_cmpstr(te_last_error(), ==, msg);
}

/* The transport is required (line 4) or optional: the same error, at the same place. */
static void test_bad_option(gconstpointer data)
{
	const char *required = data;
	g_autofree char *range = g_strdup_printf("engine: {name: A}\n"
						 "transports:\n"
						 "  - name: declared\n"
						 "    required: %s\n"
						 "    options:\n"
						 "      workers: 65\n",
						 required);
	g_autofree char *unknown = g_strdup_printf("engine: {name: A}\n"
						   "transports:\n"
						   "  - name: declared\n"
						   "    required: %s\n"
						   "    options: {workres: 2}\n",
						   required);
	g_autofree char *type = g_strdup_printf("engine: {name: A}\n"
						"transports:\n"
						"  - name: loopback\n"
						"    required: true\n"
						"  - name: declared\n"
						"    required: %s\n"
						"    options:\n"
						"      progress: manual\n"
						"      verbose: 1\n",
						required);

	expect_failure(
		range, TE_ERR_CONFIG,
		"opts.yaml:6:16: transports[0].options.workers: value 65 out of range 1..64");
	expect_failure(unknown, TE_ERR_CONFIG,
		       "opts.yaml:5:15: transports[0].options.workres: unknown option of plugin "
		       "declared (did you mean \"workers\"?)");
	/* After a good transport started: the second one's error, the first one unwound. */
	expect_failure(type, TE_ERR_CONFIG,
		       "opts.yaml:9:16: transports[1].options.verbose: expected a boolean (true, "
		       "false, yes, no, on, off), got \"1\"");
}

static void test_missing_required_option(void)
{
	expect_failure("transports:\n"
		       "  - name: declared_req\n"
		       "    required: false\n"
		       "    options: {label: x}\n",
		       TE_ERR_CONFIG,
		       "opts.yaml:4:14: transports[0].options.token: missing required option of "
		       "plugin declared_req (a required string for tests)");
}

/* An in-tree plugin: tcp declares its options too. */
static void test_tcp(void)
{
	expect_failure("transports:\n"
		       "  - name: tcp\n"
		       "    options:\n"
		       "      lanes: 0\n",
		       TE_ERR_CONFIG,
		       "opts.yaml:4:14: transports[0].options.lanes: value 0 out of range 1..64");
}

/* An optional transport whose module is absent: its options cannot be and are not checked. */
static void test_absent_optional_unchecked(void)
{
	struct te_engine *e = NULL;

	g_assert_cmpint(start("transports:\n"
			      "  - name: no_such_plugin\n"
			      "    required: false\n"
			      "    options: {anything: at all}\n"
			      "  - name: loopback\n",
			      NULL, &e),
			==, TE_OK);
	te_engine_free(e);
}

/* The effective options reach config_get and config_foreach: the YAML's normalized, defaults. */
static void test_defaults_reach_plugin(void)
{
	static const char *const want[] = {
		"option progress=manual",  "option workers=1",
		"option queue_depth=4096", "option slice_size=1048576",
		"option max_slice_size=0", "option verbose=true",
		"option bias=-7",	   "option label=lo",
	};
	struct logcap cap;
	struct te_engine *e = NULL;
	g_autofree char *text = NULL;
	const char *at;

	logcap_init(&cap);
	g_assert_cmpint(start("transports:\n"
			      "  - name: declared\n"
			      "    options:\n"
			      "      verbose: YES\n"
			      "      slice_size: 1M\n"
			      "      bias: -7\n"
			      "      label: ~\n"
			      "      progress: manual\n",
			      &cap, &e),
			==, TE_OK);
	text = logcap_text(&cap);
	g_test_message("%s", text);
	/* In declaration order, each once; "note" has no default and was not set. */
	at = text;
	for (size_t i = 0; i < G_N_ELEMENTS(want); i++) {
		const char *hit = strstr(at, want[i]);

		if (!hit)
			g_error("'%s' not logged (in order) by the plugin:\n%s", want[i], text);
		at = hit + strlen(want[i]);
		g_assert_cmpuint(logcap_count(&cap, want[i], NULL), ==, 1);
	}
	g_assert_cmpuint(logcap_count(&cap, "option note=", NULL), ==, 0);
	te_engine_free(e);
	logcap_clear(&cap);
}

/* A module whose declarations are broken: refused like any invalid plugin. */
static void test_bad_declarations(void)
{
	g_autofree char *file = itest_plugin_file("bad_decl");
	g_autofree char *want = NULL;
	struct te_engine *e = NULL;

	g_assert_nonnull(file);
	want = g_strdup_printf("transport 'bad_decl' (required): %s: option 'workers': default "
			       "\"0\" is invalid: value 0 out of range 1..64",
			       file);
	expect_failure("transports:\n  - name: bad_decl\n    required: true\n",
		       TE_ERR_PLUGIN_INVALID, want);
	/* Optional: skipped with a warning, the engine starts on the others. */
	g_assert_cmpint(start("transports:\n"
			      "  - name: bad_decl\n"
			      "    required: false\n"
			      "  - name: loopback\n",
			      NULL, &e),
			==, TE_OK);
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_data_func("/options/bad/required", "true", test_bad_option);
	g_test_add_data_func("/options/bad/optional", "false", test_bad_option);
	g_test_add_func("/options/missing-required-option", test_missing_required_option);
	g_test_add_func("/options/tcp", test_tcp);
	g_test_add_func("/options/absent-optional-unchecked", test_absent_optional_unchecked);
	g_test_add_func("/options/defaults-reach-plugin", test_defaults_reach_plugin);
	g_test_add_func("/options/bad-declarations", test_bad_declarations);
	return g_test_run();
}
