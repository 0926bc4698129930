/* SPDX-License-Identifier: Apache-2.0 */
/* status_test.c: te_status_str, te_state_str, te_status_is_retryable and te_last_error. */
#include "itest.h"

static const int all_statuses[] = {
	TE_OK,
	TE_INPROGRESS,
	TE_ERR_INVALID_ARG,
	TE_ERR_INVALID_HANDLE,
	TE_ERR_OVERFLOW,
	TE_ERR_ADDRESS_OVERLAPPED,
	TE_ERR_NOT_REGISTERED,
	TE_ERR_OUT_OF_RANGE,
	TE_ERR_UNKNOWN_SEGMENT,
	TE_ERR_BATCH_FULL,
	TE_ERR_BUSY,
	TE_ERR_TOO_LARGE,
	TE_ERR_EXISTS,
	TE_ERR_NOT_FOUND,
	TE_ERR_LINK_DOWN,
	TE_ERR_CONN_RESET,
	TE_ERR_TRANSIENT,
	TE_ERR_AGAIN,
	TE_ERR_DEVICE_FAILED,
	TE_ERR_PATH_TIMEOUT,
	TE_ERR_PEER_UNREACHABLE,
	TE_ERR_REMOTE_ACCESS,
	TE_ERR_PEER_REJECTED,
	TE_ERR_PEER_RESTARTED,
	TE_ERR_PROTOCOL,
	TE_ERR_AUTH,
	TE_ERR_NO_TRANSPORT,
	TE_ERR_PEER_QUARANTINED,
	TE_ERR_METADATA,
	TE_ERR_METADATA_NOT_FOUND,
	TE_ERR_METADATA_MALFORMED,
	TE_ERR_METADATA_UNAVAILABLE,
	TE_ERR_UNSUPPORTED,
	TE_ERR_PLUGIN_NOT_FOUND,
	TE_ERR_PLUGIN_INVALID,
	TE_ERR_ABI_MISMATCH,
	TE_ERR_PLUGIN_INIT,
	TE_ERR_CONFIG,
	TE_ERR_NO_DEVICE,
	TE_ERR_MEMORY_TYPE,
	TE_ERR_NOMEM,
	TE_ERR_SYSTEM,
	TE_ERR_TIMEOUT,
	TE_ERR_CANCELED,
	TE_ERR_SHUTDOWN,
	TE_ERR_INTERNAL,
};

static void test_status_str_total(void)
{
	g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

	for (size_t i = 0; i < G_N_ELEMENTS(all_statuses); i++) {
		const char *s = te_status_str(all_statuses[i]);

		g_assert_nonnull(s);
		g_assert_cmpstr(s, !=, "");
		g_assert_cmpstr(s, !=, "unknown status");
		if (g_hash_table_contains(seen, s))
			g_error("status %d shares its text \"%s\" with another status",
				all_statuses[i], s);
		g_hash_table_add(seen, (gpointer)s);
	}
	g_assert_cmpstr(te_status_str(12345), ==, "unknown status");
	g_assert_cmpstr(te_status_str(-12345), ==, "unknown status");
	/* Unassigned values inside the groups are unknown too. */
	g_assert_cmpstr(te_status_str(-39), ==, "unknown status");
	g_assert_cmpstr(te_status_str(-99), ==, "unknown status");
	g_assert_cmpstr(te_status_str(2), ==, "unknown status");
	g_assert_cmpstr(te_status_str(INT32_MIN), ==, "unknown status");
}

static void test_status_retryable(void)
{
	/* The path/link group is exactly what the core may retry. */
	for (size_t i = 0; i < G_N_ELEMENTS(all_statuses); i++) {
		int s = all_statuses[i];
		bool want = s <= -40 && s >= -59;

		if (te_status_is_retryable(s) != want)
			g_error("te_status_is_retryable(%d %s) = %d, want %d", s, te_status_str(s),
				!want, want);
	}
	g_assert_false(te_status_is_retryable(12345));
}

static void test_state_str(void)
{
	static const struct {
		enum te_state state;
		const char *name;
	} states[] = {
		{ TE_STATE_WAITING, "WAITING" },     { TE_STATE_PENDING, "PENDING" },
		{ TE_STATE_COMPLETED, "COMPLETED" }, { TE_STATE_FAILED, "FAILED" },
		{ TE_STATE_TIMEOUT, "TIMEOUT" },     { TE_STATE_CANCELED, "CANCELED" },
		{ TE_STATE_INVALID, "INVALID" },
	};

	for (size_t i = 0; i < G_N_ELEMENTS(states); i++)
		g_assert_cmpstr(te_state_str(states[i].state), ==, states[i].name);
	g_assert_nonnull(te_state_str((enum te_state)99));
	g_assert_nonnull(te_state_str((enum te_state) - 1));

	g_assert_false(te_state_is_terminal(TE_STATE_WAITING));
	g_assert_false(te_state_is_terminal(TE_STATE_PENDING));
	g_assert_true(te_state_is_terminal(TE_STATE_COMPLETED));
	g_assert_true(te_state_is_terminal(TE_STATE_INVALID));
}

static gpointer last_error_thread(gpointer data)
{
	(void)data;
	/* A thread that made no failing call sees "". */
	return g_strdup(te_last_error());
}

static void test_last_error_thread_local(void)
{
	struct te_engine *e = (struct te_engine *)0x1;
	g_autofree char *other = NULL;
	GThread *t;

	/* Fail a call on this thread: NULL yaml. */
	g_assert_cmpint(te_engine_new_from_string(NULL, 5, &e), ==, TE_ERR_INVALID_ARG);
	g_assert_true(e == (struct te_engine *)0x1); /* untouched on failure */
	g_assert_nonnull(te_last_error());
	g_test_message("NULL yaml: %s", te_last_error());
	g_assert_cmpstr(te_last_error(), !=, "");

	t = g_thread_new("last-error", last_error_thread, NULL);
	other = g_thread_join(t);
	g_assert_cmpstr(other, ==, "");
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/status/str-total", test_status_str_total);
	g_test_add_func("/status/retryable", test_status_retryable);
	g_test_add_func("/status/state-str", test_state_str);
	g_test_add_func("/status/last-error-thread-local", test_last_error_thread_local);
	return g_test_run();
}
