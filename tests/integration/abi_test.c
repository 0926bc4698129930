/* SPDX-License-Identifier: Apache-2.0 */
/* abi_test.c: every plugin load failure fails engine start with the file and the reason. */
#include "itest.h"

#define SENTINEL ((struct te_engine *)0xab1)

struct abi_case {
	const char *plugin;   /* test plugin name (file stem) */
	enum te_status want;  /* engine start status */
	const char *words[3]; /* substrings the message must contain besides the path */
};

static const struct abi_case abi_cases[] = {
	{ "not_a_plugin", TE_ERR_PLUGIN_INVALID, { NULL } },
	{ "no_entry", TE_ERR_PLUGIN_INVALID, { "te_plugin_entry_v1", NULL } },
	{ "wrong_major", TE_ERR_ABI_MISMATCH, { "major 2", NULL } },
	{ "wrong_major_desc", TE_ERR_ABI_MISMATCH, { "major 2", NULL } },
	{ "newer_minor", TE_ERR_ABI_MISMATCH, { "minor", NULL } },
	{ "missing_op", TE_ERR_PLUGIN_INVALID, { "submit", NULL } },
	{ "bad_desc_size", TE_ERR_PLUGIN_INVALID, { NULL } },
	{ "init_fail", TE_ERR_PLUGIN_INIT, { NULL } },
	/* TE_OK without an instance: refused, and fini is never called on NULL. */
	{ "null_instance", TE_ERR_PLUGIN_INVALID, { "init returned TE_OK but no instance", NULL } },
};

/*
 * Start an engine whose only transport is @name (loaded from @path when given) and
 * required; expect @want and a message naming @file and every word.
 */
static void expect_start_failure(const char *name, const char *path, const char *file,
				 enum te_status want, const char *const *words)
{
	struct itest_transport t = { .name = name, .path = path, .required = true };
	g_autofree char *yaml = itest_yaml("A", &t, 1, NULL);
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);
	const char *msg = te_last_error();

	g_test_message("%s (%s): %d %s: %s", name, path ? "path:" : "by name", st,
		       te_status_str(st), msg);
	if (st != want)
		g_error("%s: engine start returned %d (%s), want %d (%s); message: %s", name, st,
			te_status_str(st), want, te_status_str(want), msg);
	g_assert_true(e == SENTINEL);
	assert_contains(msg, file);
	for (size_t i = 0; words && i < 3 && words[i]; i++)
		assert_contains(msg, words[i]);
}

static char *need_plugin_file(const char *name)
{
	char *file = itest_plugin_file(name);

	if (!file)
		g_error("test plugin %s.so not found along TE_PLUGIN_PATH=%s", name,
			g_getenv("TE_PLUGIN_PATH") ? g_getenv("TE_PLUGIN_PATH") : "(unset)");
	return file;
}

static void test_by_path(gconstpointer data)
{
	const struct abi_case *c = data;
	g_autofree char *file = need_plugin_file(c->plugin);

	expect_start_failure(c->plugin, file, file, c->want, c->words);
}

static void test_by_name(gconstpointer data)
{
	const struct abi_case *c = data;
	g_autofree char *file = need_plugin_file(c->plugin);

	/* Found through $TE_PLUGIN_PATH; the message names the file it found. */
	expect_start_failure(c->plugin, NULL, file, c->want, c->words);
}

static void test_missing_file(void)
{
	expect_start_failure("x", "/nonexistent/x.so", "/nonexistent/x.so", TE_ERR_PLUGIN_NOT_FOUND,
			     NULL);
}

static void test_path_wins_over_search(void)
{
	/*
	 * A valid loopback.so is on TE_PLUGIN_PATH, but the explicit path: names a
	 * missing file: the loader must not fall back to the search path.
	 */
	expect_start_failure("loopback", "/nonexistent/loopback.so", "/nonexistent/loopback.so",
			     TE_ERR_PLUGIN_NOT_FOUND, NULL);
}

static void test_loopback_by_path(void)
{
	g_autofree char *file = need_plugin_file("loopback");
	struct itest_transport t = { .name = "loopback", .path = file, .required = true };
	g_autofree char *yaml = itest_yaml("A", &t, 1, NULL);
	struct te_engine *e = itest_engine(yaml);

	te_engine_free(e);
}

static void search_path_env_child(void)
{
	/* TE_PLUGIN_PATH is what finds test plugins by name: without it they vanish. */
	g_autofree char *saved = g_strdup(g_getenv("TE_PLUGIN_PATH"));
	struct itest_transport t = { .name = "never_complete", .required = true };
	g_autofree char *yaml = itest_yaml("A", &t, 1, NULL);
	struct te_engine *e = SENTINEL;
	enum te_status st;

	g_assert_nonnull(saved);
	/* The engine reads the variable at start. */
	g_setenv("TE_PLUGIN_PATH", "/nonexistent-dir", TRUE);
	st = te_engine_new_from_string(yaml, strlen(yaml), &e);
	g_test_message("empty search path: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_PLUGIN_NOT_FOUND);
	g_assert_true(e == SENTINEL);
	assert_contains(te_last_error(), "never_complete");

	/* Several directories, the right one last. */
	{
		g_autofree char *multi =
			g_strconcat("/nonexistent-a::/nonexistent-b:", saved, NULL);

		g_setenv("TE_PLUGIN_PATH", multi, TRUE);
		st = te_engine_new_from_string(yaml, strlen(yaml), &e);
		assert_status(st, TE_OK);
		te_engine_free(e);
	}
}

/*
 * setenv is not thread-safe: run in a fresh child process, where no engine
 * thread has been started yet.
 */
static void test_search_path_env(void)
{
	if (g_test_subprocess()) {
		search_path_env_child();
		return;
	}
	g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
	g_test_trap_assert_passed();
}

static void test_required_failure_after_good_one(void)
{
	/* A required failure fails start even after a good transport was loaded. */
	g_autofree char *file = need_plugin_file("missing_op");
	struct itest_transport t[] = {
		{ .name = "loopback", .required = true },
		{ .name = "missing_op", .path = file, .required = true },
	};
	g_autofree char *yaml = itest_yaml("A", t, 2, NULL);
	struct te_engine *e = SENTINEL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	g_test_message("good then bad: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_PLUGIN_INVALID);
	g_assert_true(e == SENTINEL);
	assert_contains(te_last_error(), file);
	assert_contains(te_last_error(), "submit");
}

/*
 * A plugin built for ABI 1.0 (minor 0, an ops table without 1.1's wait) loads into this
 * core and moves bytes with manual progress: the missing op answers as a stub and the
 * waiting thread yields instead of blocking in it.
 */
static void test_abi_1_0_plugin(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r[2];
	te_batch_id bid;

	itest_pair_new(&p, "abi_1_0", "progress: manual", "slice_size: 4096, timeout_ms: 60000");
	itest_buf_new(&la, 1u << 20, 4096, 0x10);
	itest_buf_new(&rb, 1u << 20, 4096, 0x20);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	r[0] = (struct te_request){ TE_OP_WRITE, p.seg, la.data, itest_raddr(&rb, 0), 300000 };
	r[1] = (struct te_request){ TE_OP_READ, p.seg, la.data + 600000, itest_raddr(&rb, 600000),
				    300000 };
	assert_ok(te_batch_new(p.a, 2, &bid));
	assert_ok(te_batch_submit(p.a, bid, r, 2));
	assert_ok(itest_wait(p.a, bid));
	g_assert_true(itest_range_is(&rb, 0, 300000, &la, 0));
	g_assert_true(itest_range_is(&la, 600000, 300000, &rb, 600000));
	g_assert_cmpuint(itest_batch(p.a, bid).bytes, ==, 600000);
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/abi/missing-file", test_missing_file);
	g_test_add_func("/abi/path-wins-over-search", test_path_wins_over_search);
	g_test_add_func("/abi/loopback-by-path", test_loopback_by_path);
	g_test_add_func("/abi/search-path-env", test_search_path_env);
	g_test_add_func("/abi/required-failure-after-good-one",
			test_required_failure_after_good_one);
	g_test_add_func("/abi/abi-1.0-plugin", test_abi_1_0_plugin);
	for (size_t i = 0; i < G_N_ELEMENTS(abi_cases); i++) {
		g_autofree char *p1 = g_strdup_printf("/abi/path/%s", abi_cases[i].plugin);
		g_autofree char *p2 = g_strdup_printf("/abi/name/%s", abi_cases[i].plugin);

		g_test_add_data_func(p1, &abi_cases[i], test_by_path);
		g_test_add_data_func(p2, &abi_cases[i], test_by_name);
	}
	return g_test_run();
}
