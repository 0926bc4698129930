/* SPDX-License-Identifier: Apache-2.0 */
/* status_test.c: status names are total and the retryable class is exactly -40..-59. */
#include <glib.h>

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

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/status/names", test_every_status_named);
	g_test_add_func("/status/groups", test_groups);
	g_test_add_func("/status/states", test_states);
	return g_test_run();
}
