/* SPDX-License-Identifier: Apache-2.0 */
/* plugin_opts_test.c: te_plugin_opts.h, the option parsing every plugin shares. */

#include <glib.h>
#include <te/te_plugin_opts.h>

static void test_u64(void)
{
	static const struct {
		const char *s;
		bool suffix;
		uint64_t want;
	} good[] = {
		{ "0", false, 0 },
		{ "4096", false, 4096 },
		{ "18446744073709551615", false, UINT64_MAX },
		{ "4k", true, 4096 },
		{ "4K", true, 4096 },
		{ "4KiB", true, 4096 },
		{ "4kb", true, 4096 },
		{ "1MB", true, 1u << 20 },
		{ "2G", true, 2ull << 30 },
		{ "3T", true, 3ull << 40 },
		{ "3tib", true, 3ull << 40 },
		{ "7", true, 7 },
	};
	static const struct {
		const char *s;
		bool suffix;
	} bad[] = {
		{ "", false },
		{ "-1", false },
		{ "+1", false },
		{ " 1", false },
		{ "1 ", false },
		{ "0x10", false },
		{ "1.5", false },
		{ "4k", false },
		{ "4X", true },
		{ "4KiBB", true },
		{ "k", true },
		{ "16777216T", true },
		{ "18446744073709551616", false },
		{ "abc", false },
		{ "4iB", true },
	};
	uint64_t v;

	for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
		v = 12345;
		if (!te_plugin_parse_u64(good[i].s, good[i].suffix, 0, UINT64_MAX, &v))
			g_error("'%s' (suffix %d) refused", good[i].s, good[i].suffix);
		g_assert_cmpuint(v, ==, good[i].want);
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		v = 12345;
		if (te_plugin_parse_u64(bad[i].s, bad[i].suffix, 0, UINT64_MAX, &v))
			g_error("'%s' (suffix %d) accepted as %" G_GUINT64_FORMAT, bad[i].s,
				bad[i].suffix, v);
		g_assert_cmpuint(v, ==, 12345); /* untouched */
	}
	/* Range, after the suffix. */
	g_assert_true(te_plugin_parse_u64("4k", true, 4096, 4096, &v));
	g_assert_false(te_plugin_parse_u64("4k", true, 4097, 8192, &v));
	g_assert_false(te_plugin_parse_u64("9", false, 1, 8, &v));
	g_assert_false(te_plugin_parse_u64(NULL, false, 0, 8, &v));
}

static void test_bool_enum(void)
{
	static const char *const choices[] = { "auto", "adaptive", "busy", NULL };
	bool b = false;

	g_assert_true(te_plugin_parse_bool("YES", &b) && b);
	g_assert_true(te_plugin_parse_bool("off", &b) && !b);
	g_assert_true(te_plugin_parse_bool("On", &b) && b);
	g_assert_true(te_plugin_parse_bool("False", &b) && !b);
	/* The one boolean rule (core keys too): no 1/0, no y/n. */
	b = true;
	g_assert_false(te_plugin_parse_bool("1", &b));
	g_assert_false(te_plugin_parse_bool("0", &b));
	g_assert_false(te_plugin_parse_bool("y", &b));
	g_assert_true(b); /* untouched on failure */
	g_assert_false(te_plugin_parse_bool("maybe", &b));
	g_assert_false(te_plugin_parse_bool("", &b));
	g_assert_false(te_plugin_parse_bool(NULL, &b));
	g_assert_cmpint(te_plugin_parse_enum("busy", choices), ==, 2);
	g_assert_cmpint(te_plugin_parse_enum("auto", choices), ==, 0);
	g_assert_cmpint(te_plugin_parse_enum("Busy", choices), ==, -1);
	g_assert_cmpint(te_plugin_parse_enum("", choices), ==, -1);
}

/* A host whose config_foreach walks a fixed list. */
static const char *const fake_keys[] = { "window", "colour", "progress" };

static void fake_foreach(struct te_plugin_host_ctx *ctx, te_plugin_option_fn fn, void *user)
{
	(void)ctx;
	for (size_t i = 0; i < G_N_ELEMENTS(fake_keys); i++)
		fn(user, fake_keys[i], "x");
}

static void test_unknown_and_join(void)
{
	static const char *const names[] = { "window", "progress", "spin_us" };
	struct te_plugin_host host = { .size = sizeof(host), .config_foreach = fake_foreach };
	char bad[8], known[64], tiny[9];

	g_assert_true(te_plugin_unknown_option(&host, NULL, names, 3, bad, sizeof(bad)));
	g_assert_cmpstr(bad, ==, "colour");
	g_assert_false(te_plugin_unknown_option(&host, NULL, fake_keys, 3, bad, sizeof(bad)));
	g_assert_cmpstr(bad, ==, "");
	g_assert_cmpstr(te_plugin_join(names, 3, known, sizeof(known)), ==,
			"window, progress, spin_us");
	/* Cut short, NUL-terminated, never past the buffer. */
	g_assert_cmpstr(te_plugin_join(names, 3, tiny, sizeof(tiny)), ==, "window, ");
	g_assert_cmpstr(te_plugin_join(names, 0, known, sizeof(known)), ==, "");
}

/* A host whose config_get answers normalized values, as the core does for declared options. */
static const char *fake_get(struct te_plugin_host_ctx *ctx, const char *key)
{
	static const char *const kv[][2] = {
		{ "flag", "true" }, { "neg", "-42" },  { "bytes", "65536" },
		{ "mode", "busy" }, { "junk", "12x" }, { "off", "false" },
	};

	(void)ctx;
	for (size_t i = 0; i < G_N_ELEMENTS(kv); i++)
		if (strcmp(key, kv[i][0]) == 0)
			return kv[i][1];
	return NULL;
}

static void test_declared_readers(void)
{
	static const char *const choices[] = { "auto", "adaptive", "busy", NULL };
	struct te_plugin_host host = { .size = sizeof(host), .config_get = fake_get };

	g_assert_true(te_plugin_opt_bool(&host, NULL, "flag", false));
	g_assert_false(te_plugin_opt_bool(&host, NULL, "off", true));
	g_assert_true(te_plugin_opt_bool(&host, NULL, "absent", true));
	g_assert_cmpint(te_plugin_opt_int(&host, NULL, "neg", 0), ==, -42);
	g_assert_cmpint(te_plugin_opt_int(&host, NULL, "junk", 7), ==, 7);
	g_assert_cmpint(te_plugin_opt_int(&host, NULL, "absent", 9), ==, 9);
	g_assert_cmpuint(te_plugin_opt_size(&host, NULL, "bytes", 0), ==, 65536);
	g_assert_cmpuint(te_plugin_opt_size(&host, NULL, "neg", 5), ==, 5);
	g_assert_cmpint(te_plugin_opt_choice(&host, NULL, "mode", choices, 0), ==, 2);
	g_assert_cmpint(te_plugin_opt_choice(&host, NULL, "absent", choices, 1), ==, 1);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/plugin-opts/u64", test_u64);
	g_test_add_func("/plugin-opts/bool-enum", test_bool_enum);
	g_test_add_func("/plugin-opts/unknown-and-join", test_unknown_and_join);
	g_test_add_func("/plugin-opts/declared-readers", test_declared_readers);
	return g_test_run();
}
