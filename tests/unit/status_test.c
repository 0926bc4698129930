/* SPDX-License-Identifier: Apache-2.0 */
/* status_test.c: status names are total and the retryable class is exactly -40..-59. */
#include <glib.h>
#include <string.h>

#include <te/te.h>

static void test_every_status_named(void)
{
	int named = 0;

	for (int s = -200; s <= 10; s++) {
		const char *str = te_status_str(s);

		g_assert_nonnull(str);
		if (g_strcmp0(str, "unknown status") != 0)
			named++;
	}
	/* Every defined enum value has its own name (46 defined today). */
	g_assert_cmpint(named, ==, 46);
	g_assert_cmpstr(te_status_str(TE_OK), ==, "ok");
	g_assert_cmpstr(te_status_str(TE_ERR_REMOTE_ACCESS), ==,
			"remote access outside registered buffers");
	g_assert_cmpstr(te_status_str(12345), ==, "unknown status");
	g_assert_cmpstr(te_status_str(-12345), ==, "unknown status");
}

static void test_groups(void)
{
	/* Fixed values cross the ABI: they must never change. */
	g_assert_cmpint(TE_ERR_INVALID_ARG, ==, -1);
	g_assert_cmpint(TE_ERR_LINK_DOWN, ==, -40);
	g_assert_cmpint(TE_ERR_PEER_UNREACHABLE, ==, -60);
	g_assert_cmpint(TE_ERR_METADATA, ==, -80);
	g_assert_cmpint(TE_ERR_UNSUPPORTED, ==, -100);
	g_assert_cmpint(TE_ERR_NOMEM, ==, -120);
	for (int s = -200; s <= 10; s++)
		g_assert_cmpint(te_status_is_retryable(s), ==, s <= -40 && s >= -59);
	g_assert_true(te_status_is_retryable(TE_ERR_CONN_RESET));
	g_assert_false(te_status_is_retryable(TE_ERR_TIMEOUT));
	g_assert_false(te_status_is_retryable(TE_ERR_REMOTE_ACCESS));
}

static void test_states(void)
{
	g_assert_cmpstr(te_state_str(TE_STATE_WAITING), ==, "WAITING");
	g_assert_cmpstr(te_state_str(TE_STATE_INVALID), ==, "INVALID");
	g_assert_cmpstr(te_state_str((enum te_state)99), ==, "UNKNOWN");
	g_assert_false(te_state_is_terminal(TE_STATE_PENDING));
	g_assert_true(te_state_is_terminal(TE_STATE_CANCELED));
}

/* The library's version agrees with the header's (meson's project version and te.h's macros). */
static void test_version(void)
{
	g_autofree char *prefix = g_strdup_printf("%d.%d.", TE_VERSION_MAJOR, TE_VERSION_MINOR);
	const char *v = te_version();

	g_assert_nonnull(v);
	g_assert_true(g_str_has_prefix(v, prefix));
	g_assert_cmpuint(strlen(v), >, strlen(prefix));
	for (const char *p = v + strlen(prefix); *p; p++)
		g_assert_true(g_ascii_isdigit(*p));
	g_assert_true(te_version() == v); /* one constant */
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/status/names", test_every_status_named);
	g_test_add_func("/status/groups", test_groups);
	g_test_add_func("/status/states", test_states);
	g_test_add_func("/status/version", test_version);
	return g_test_run();
}
