/* SPDX-License-Identifier: Apache-2.0 */
/* engine_test.c: the engine's wiring: names, generations, advertised address, start unwinding. */
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "core/control.h"
#include "core/engine.h"
#include "fake.h"
#include "itest.h"

/* An engine on the loopback test plugin listening on @listen, with extra engine keys @extra. */
static struct te_engine *engine_at(const char *listen, const char *extra)
{
	g_autofree char *y = g_strdup_printf("engine: {listen: \"%s\"%s%s}\n"
					     "transports: [{name: loopback, required: true}]\n",
					     listen, extra ? ", " : "", extra ? extra : "");
	struct te_engine *te = NULL;

	assert_ok(te_engine_new_from_string(y, strlen(y), &te));
	return te;
}

/* Without engine.name the segment is named by its control address; generations differ. */
static void test_name_generation(void)
{
	struct te_engine *a = engine_at("127.0.0.1:0", NULL), *b = engine_at("127.0.0.1:0", NULL);
	struct engine *ea = fake_engine(a), *eb = fake_engine(b);

	g_assert_true(g_str_has_prefix(te_engine_name(a), "127.0.0.1:"));
	g_assert_cmpstr(te_engine_name(a), ==, control_address(ea));
	g_assert_cmpstr(te_engine_name(a), !=, te_engine_name(b));
	g_assert_cmphex(ea->generation, !=, eb->generation);
	g_assert_cmphex(ea->generation, !=, 0);
	te_engine_free(b);
	te_engine_free(a);
}

/* The descriptor carries a reachable address: never a wildcard; engine.advertise wins. */
static void test_advertise(void)
{
	struct te_engine *w = engine_at("0.0.0.0:0", NULL);
	struct te_engine *n = engine_at("127.0.0.1:0", "advertise: node-7.example");
	const char *aw = control_address(fake_engine(w));
	const char *an = control_address(fake_engine(n));
	const char *bound = strrchr(te_engine_name(n), ':');

	g_test_message("wildcard listener advertises %s; advertise: node-7.example gives %s", aw,
		       an);
	g_assert_false(g_str_has_prefix(aw, "0.0.0.0:"));
	g_assert_nonnull(strrchr(aw, ':'));
	/* The name was taken from the advertised address, with the bound port. */
	g_assert_true(g_str_has_prefix(an, "node-7.example:"));
	g_assert_cmpstr(strrchr(an, ':'), ==, bound);
	te_engine_free(n);
	te_engine_free(w);
}

/* A start that fails half way (required transport missing) unwinds every module it started. */
static void test_start_unwinds(void)
{
	static const char y[] = "engine: {listen: \"127.0.0.1:0\"}\n"
				"transports:\n"
				"  - {name: loopback, required: true}\n"
				"  - {name: no-such-transport, required: true}\n";
	struct te_engine *te = NULL;

	for (int i = 0; i < 3; i++) {
		g_assert_cmpint(te_engine_new_from_string(y, strlen(y), &te), ==,
				TE_ERR_PLUGIN_NOT_FOUND);
		g_assert_null(te);
		assert_contains(te_last_error(), "no-such-transport");
	}
	/* The listener it had bound is closed again: a new engine starts fine. */
	te = engine_at("127.0.0.1:0", NULL);
	te_engine_free(te);
}

/*
 * $TE_LOG_LEVEL and $TE_LOG_FILE steer an engine without a log callback: lines go to the file
 * with a UTC timestamp and the thread id, and at debug level each segment and each task says
 * which transport carries it. Bad values fail the start with the variable named.
 */
static void test_log_env(void)
{
	g_autofree char *dir = g_dir_make_tmp("te-log-XXXXXX", NULL);
	g_autofree char *path = g_build_filename(dir, "te.log", NULL);
	g_autofree char *text = NULL;
	g_autoptr(GRegex) line = NULL;
	static char src[4096], dst[4096];
	struct te_engine *a, *b;
	char *json = NULL;
	te_segment_id seg;
	te_batch_id batch;

	g_setenv("TE_LOG_LEVEL", "verbose", TRUE);
	a = NULL;
	g_assert_cmpint(te_engine_new_from_string("", 0, &a), ==, TE_ERR_CONFIG);
	g_assert_null(a);
	g_assert_cmpstr(te_last_error(), ==,
			"TE_LOG_LEVEL: 'verbose' is not one of error, warn, info, debug, trace "
			"(or 0..4)");
	g_setenv("TE_LOG_LEVEL", "debug", TRUE);
	g_setenv("TE_LOG_FILE", "/nonexistent-dir/te.log", TRUE);
	g_assert_cmpint(te_engine_new_from_string("", 0, &a), ==, TE_ERR_CONFIG);
	assert_contains(te_last_error(), "TE_LOG_FILE: cannot open '/nonexistent-dir/te.log'");
	g_setenv("TE_LOG_FILE", path, TRUE);
	a = engine_at("127.0.0.1:0", NULL);
	b = engine_at("127.0.0.1:0", NULL);
	g_unsetenv("TE_LOG_LEVEL");
	g_unsetenv("TE_LOG_FILE");
	memset(src, 7, sizeof(src));
	assert_ok(te_mem_register(a, src, sizeof(src), "cpu", TE_MEM_LOCAL));
	assert_ok(te_mem_register(b, dst, sizeof(dst), "cpu", TE_MEM_REMOTE));
	assert_ok(te_segment_export(b, &json, NULL));
	assert_ok(te_segment_import(a, json, strlen(json), &seg));
	te_free(json);
	assert_ok(te_batch_new(a, 1, &batch));
	{
		struct te_request q = { .opcode = TE_OP_WRITE,
					.segment = seg,
					.local = src,
					.remote = (uintptr_t)dst,
					.length = sizeof(src) };

		assert_ok(te_batch_submit(a, batch, &q, 1));
	}
	assert_ok(te_batch_wait(a, batch, 5000000000ll));
	g_assert_cmpuint(dst[4095], ==, 7);
	assert_ok(te_batch_free(a, batch));
	te_engine_free(a);
	te_engine_free(b);
	g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
	/* Every line: time, level, thread id, engine name (when there is one), text. */
	line = g_regex_new("^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6}Z "
			   "te\\[(error|warn|info|debug|trace)\\] \\d+( \\S+)?: .+$",
			   G_REGEX_MULTILINE, 0, NULL);
	{
		g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
		guint n = 0;

		for (guint i = 0; lines[i] && *lines[i]; i++, n++)
			if (!g_regex_match(line, lines[i], 0, NULL))
				g_error("log line %u has not the documented form: %s", i, lines[i]);
		g_assert_cmpuint(n, >, 3);
	}
	assert_contains(text, "te[debug]");
	assert_contains(text, ": transports in priority order: loopback");
	assert_contains(text, "task 0: WRITE 4096 B to '");
	assert_contains(text, ": transport loopback");
	g_unlink(path);
	g_rmdir(dir);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/engine/name-generation", test_name_generation);
	g_test_add_func("/engine/advertise", test_advertise);
	g_test_add_func("/engine/start-unwinds", test_start_unwinds);
	g_test_add_func("/engine/log-env", test_log_env);
	return g_test_run();
}
