/* SPDX-License-Identifier: Apache-2.0 */
/* engine_test.c: engine creation from strings, files, options and $TE_CONFIG, and config errors. */
#include "itest.h"
#include "logcap.h"

#include <unistd.h>

#define LOOPBACK_YAML                                                                              \
	"engine: {name: A}\n"                                                                      \
	"transports:\n"                                                                            \
	"  - name: loopback\n"                                                                     \
	"    required: true\n"                                                                     \
	"    options: {progress: manual}\n"                                                        \
	"transfer: {timeout_ms: 2000, retries: 3, retry_backoff_us: 10}\n"

#define SENTINEL ((struct te_engine *)0x5e5e)

/* Write @text to a new temporary file; returns its path (g_free, unlink). */
static char *write_tmp(const char *text)
{
	g_autoptr(GError) err = NULL;
	char *path = NULL;
	int fd = g_file_open_tmp("te-itest-XXXXXX.yaml", &path, &err);

	g_assert_no_error(err);
	close(fd);
	g_assert_true(g_file_set_contents(path, text, -1, &err));
	g_assert_no_error(err);
	return path;
}

/* True if @msg contains "<name>:<line>:<col>" for some column. */
static bool has_location(const char *msg, const char *name, unsigned line)
{
	g_autofree char *escaped = g_regex_escape_string(name, -1);
	g_autofree char *pat = g_strdup_printf("%s:%u:[0-9]+", escaped, line);

	return g_regex_match_simple(pat, msg, 0, 0);
}

static void test_from_string(void)
{
	struct te_engine *e = NULL;

	assert_ok(te_engine_new_from_string(LOOPBACK_YAML, strlen(LOOPBACK_YAML), &e));
	g_assert_nonnull(e);
	g_assert_cmpstr(te_engine_name(e), ==, "A");
	te_engine_set_log_level(e, TE_LOG_DEBUG);
	te_engine_set_log_level(e, TE_LOG_WARN);
	te_engine_free(e);
	te_engine_free(NULL);
}

static void test_from_string_not_terminated(void)
{
	/* len bounds the text: trailing garbage after len must not be read. */
	g_autofree char *buf = g_strconcat(LOOPBACK_YAML, "bogus_key: [", NULL);
	struct te_engine *e = NULL;

	assert_ok(te_engine_new_from_string(buf, strlen(LOOPBACK_YAML), &e));
	g_assert_cmpstr(te_engine_name(e), ==, "A");
	te_engine_free(e);
}

static void test_from_file(void)
{
	g_autofree char *path = write_tmp(LOOPBACK_YAML);
	struct te_engine *e = NULL;

	assert_ok(te_engine_new_from_file(path, &e));
	g_assert_cmpstr(te_engine_name(e), ==, "A");
	te_engine_free(e);
	unlink(path);
}

static void test_from_missing_file(void)
{
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_file("/nonexistent/te.yaml", &e);

	g_test_message("missing file: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, <, 0);
	g_assert_true(e == SENTINEL);
	assert_contains(te_last_error(), "/nonexistent/te.yaml");
}

static void test_opts(void)
{
	struct te_engine_opts o = { .size = sizeof(o) };
	struct te_engine *e = NULL;

	o.config_yaml = LOOPBACK_YAML;
	o.config_yaml_len = strlen(LOOPBACK_YAML);
	o.config_name = "opts.yaml";
	o.log_level = -1;
	assert_ok(te_engine_new(&o, &e));
	g_assert_cmpstr(te_engine_name(e), ==, "A");
	te_engine_free(e);
}

static void test_opts_invalid(void)
{
	struct te_engine_opts o = { .size = sizeof(o) };
	struct te_engine *e = SENTINEL;

	assert_status(te_engine_new(NULL, &e), TE_ERR_INVALID_ARG);
	g_assert_true(e == SENTINEL);
	o.config_yaml = LOOPBACK_YAML;
	o.config_yaml_len = strlen(LOOPBACK_YAML);
	assert_status(te_engine_new(&o, NULL), TE_ERR_INVALID_ARG);
	assert_status(te_engine_new_from_string(LOOPBACK_YAML, strlen(LOOPBACK_YAML), NULL),
		      TE_ERR_INVALID_ARG);
	assert_status(te_engine_new_from_file(NULL, &e), TE_ERR_INVALID_ARG);
	g_assert_true(e == SENTINEL);
}

static void te_config_env_child(void)
{
	g_autofree char *path = write_tmp("engine: {name: from-env}\n"
					  "transports:\n"
					  "  - name: loopback\n"
					  "    required: true\n");
	struct te_engine_opts o = { .size = sizeof(o), .log_level = -1 };
	struct te_engine *e = NULL;

	g_setenv("TE_CONFIG", path, TRUE);
	assert_ok(te_engine_new(&o, &e));
	g_assert_cmpstr(te_engine_name(e), ==, "from-env");
	te_engine_free(e);
	unlink(path);
}

/*
 * setenv is not thread-safe: run in a fresh child process, where no engine
 * thread has been started yet.
 */
static void test_te_config_env(void)
{
	if (g_test_subprocess()) {
		te_config_env_child();
		return;
	}
	g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
	g_test_trap_assert_passed();
}

static void expect_config_error(const char *yaml, const char *name, unsigned line, const char *word)
{
	struct te_engine_opts o = { .size = sizeof(o), .log_level = -1 };
	struct te_engine *e = SENTINEL;
	enum te_status st;

	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.config_name = name;
	st = te_engine_new(&o, &e);
	g_test_message("config error (%s): %d %s: %s", name, st, te_status_str(st),
		       te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_CONFIG);
	g_assert_true(e == SENTINEL);
	if (!has_location(te_last_error(), name, line))
		g_error("\"%s\" does not name %s:%u:<col>", te_last_error(), name, line);
	if (word)
		assert_contains(te_last_error(), word);
}

static void test_bad_yaml_syntax(void)
{
	/* Unterminated flow map: libyaml reports it at or after line 2. */
	const char *yaml = "engine: {name: A}\n"
			   "transfer: {retries: 3\n"
			   "log: {level: warn}\n";
	struct te_engine_opts o = { .size = sizeof(o), .log_level = -1 };
	struct te_engine *e = SENTINEL;
	enum te_status st;

	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.config_name = "syntax.yaml";
	st = te_engine_new(&o, &e);
	g_test_message("syntax error: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_CONFIG);
	g_assert_true(e == SENTINEL);
	g_assert_true(g_regex_match_simple("syntax\\.yaml:[0-9]+:[0-9]+", te_last_error(), 0, 0));
}

static void test_unknown_key(void)
{
	expect_config_error("engine:\n"
			    "  name: A\n"
			    "  bogus_key: 1\n",
			    "unknown.yaml", 3, "bogus_key");
}

static void test_unknown_top_level_section(void)
{
	expect_config_error("engine: {name: A}\n"
			    "transportz: []\n",
			    "section.yaml", 2, "transportz");
}

static void test_bad_value_type(void)
{
	expect_config_error("engine: {name: A}\n"
			    "transfer:\n"
			    "  retries: lots\n",
			    "type.yaml", 3, "retries");
}

static void test_bad_value_in_file(void)
{
	/* From a file: the location names the file path. */
	g_autofree char *path = write_tmp("engine: {name: A}\n"
					  "transfer:\n"
					  "  timeout_ms: -5\n");
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_file(path, &e);

	g_test_message("file error: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_CONFIG);
	g_assert_true(e == SENTINEL);
	if (!has_location(te_last_error(), path, 3))
		g_error("\"%s\" does not name %s:3:<col>", te_last_error(), path);
	unlink(path);
}

static void test_string_error_has_location(void)
{
	/* From a plain string (no config_name): still line:column. */
	const char *yaml = "engine: {name: A}\nnope: 1\n";
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	g_test_message("string error: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_CONFIG);
	g_assert_true(e == SENTINEL);
	g_assert_true(g_regex_match_simple(":2:[0-9]+", te_last_error(), 0, 0));
	assert_contains(te_last_error(), "nope");
}

static void test_unknown_required_transport(void)
{
	struct itest_transport t[] = {
		{ .name = "no_such_transport", .required = true },
	};
	g_autofree char *yaml = itest_yaml("A", t, 1, NULL);
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	g_test_message("unknown transport: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_PLUGIN_NOT_FOUND);
	g_assert_true(e == SENTINEL);
	assert_contains(te_last_error(), "no_such_transport");
}

static void test_optional_plugins_skipped(void)
{
	struct itest_transport t[] = {
		{ .name = "no_such_transport", .required = false },
		{ .name = "init_fail", .required = false },
		{ .name = "loopback", .required = true },
	};
	g_autofree char *yaml = itest_yaml("A", t, G_N_ELEMENTS(t), NULL);
	struct logcap lines;
	struct te_engine_opts o = { .size = sizeof(o) };
	struct te_engine *e = NULL;
	g_autofree char *text = NULL;

	logcap_init(&lines);
	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.log_fn = logcap_fn;
	o.log_user = &lines;
	o.log_level = TE_LOG_DEBUG;
	assert_ok(te_engine_new(&o, &e));
	g_assert_nonnull(e);
	text = logcap_text(&lines);
	g_test_message("log:\n%s", text);
	/* Skipped optional plugins are logged, each by name. */
	g_assert_true(logcap_has(&lines, "no_such_transport"));
	g_assert_true(logcap_has(&lines, "init_fail"));
	te_engine_free(e);
	logcap_clear(&lines);
}

static void test_optional_only_usable(void)
{
	/* The engine still moves bytes with what was left after skipping. */
	struct itest_transport t[] = {
		{ .name = "init_fail", .required = false },
		{ .name = "loopback", .required = true, .options = "progress: auto" },
	};
	g_autofree char *ya = itest_yaml("A", t, 2, NULL);
	g_autofree char *yb = itest_yaml("B", t, 2, NULL);
	struct itest_pair p = { .a = itest_engine(ya), .b = itest_engine(yb) };
	struct itest_buf la, rb;
	struct te_request r;
	te_batch_id bid;

	itest_buf_new(&la, 4096, 0, 1);
	itest_buf_new(&rb, 4096, 0, 2);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	r = (struct te_request){ TE_OP_READ, p.seg, la.data, itest_raddr(&rb, 0), 4096 };
	assert_ok(te_batch_new(p.a, 1, &bid));
	assert_ok(te_batch_submit(p.a, bid, &r, 1));
	assert_ok(itest_wait(p.a, bid));
	g_assert_true(itest_range_is(&la, 0, 4096, &rb, 0));
	g_assert_cmpstr(itest_task(p.a, bid, 0).transport, ==, "loopback");
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

static void test_two_engines_same_plugin(void)
{
	/* The same module serves several engines of one process. */
	struct te_engine *a = itest_engine1("A", "loopback", NULL, NULL);
	struct te_engine *b = itest_engine1("B", "loopback", NULL, NULL);
	struct te_engine *c = itest_engine1("C", "loopback", "progress: auto", NULL);

	g_assert_cmpstr(te_engine_name(a), ==, "A");
	g_assert_cmpstr(te_engine_name(b), ==, "B");
	g_assert_cmpstr(te_engine_name(c), ==, "C");
	te_engine_free(b);
	te_engine_free(a);
	te_engine_free(c);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/engine/from-string", test_from_string);
	g_test_add_func("/engine/from-string-not-terminated", test_from_string_not_terminated);
	g_test_add_func("/engine/from-file", test_from_file);
	g_test_add_func("/engine/from-missing-file", test_from_missing_file);
	g_test_add_func("/engine/opts", test_opts);
	g_test_add_func("/engine/opts-invalid", test_opts_invalid);
	g_test_add_func("/engine/te-config-env", test_te_config_env);
	g_test_add_func("/engine/config/bad-yaml-syntax", test_bad_yaml_syntax);
	g_test_add_func("/engine/config/unknown-key", test_unknown_key);
	g_test_add_func("/engine/config/unknown-section", test_unknown_top_level_section);
	g_test_add_func("/engine/config/bad-value-type", test_bad_value_type);
	g_test_add_func("/engine/config/bad-value-in-file", test_bad_value_in_file);
	g_test_add_func("/engine/config/string-error-location", test_string_error_has_location);
	g_test_add_func("/engine/transport/unknown-required", test_unknown_required_transport);
	g_test_add_func("/engine/transport/optional-skipped", test_optional_plugins_skipped);
	g_test_add_func("/engine/transport/optional-then-usable", test_optional_only_usable);
	g_test_add_func("/engine/two-engines-same-plugin", test_two_engines_same_plugin);
	return g_test_run();
}
