/* SPDX-License-Identifier: Apache-2.0 */
/* retry_test.c: the core's retry policy and quarantine, driven by injected transient failures. */
#include "itest.h"

#define LEN (16u * 4096u)

static void fx_new(struct itest_fx *f, const char *options, const char *transfer)
{
	itest_fx_new(f, "fail_nth", options, transfer, LEN, 4096);
}

/* One request of @len bytes (4 KiB slices). */
static te_batch_id submit_len(struct itest_fx *f, enum te_opcode op, uint64_t len)
{
	struct te_request r = { op, f->p.seg, f->la.data, itest_raddr(&f->rb, 0), len };
	te_batch_id bid;

	assert_ok(te_batch_new(f->p.a, 1, &bid));
	assert_ok(te_batch_submit(f->p.a, bid, &r, 1));
	return bid;
}

static te_batch_id submit(struct itest_fx *f, enum te_opcode op)
{
	return submit_len(f, op, LEN);
}

static void test_retry_succeeds(gconstpointer data)
{
	const enum te_opcode *op = data;
	struct itest_fx f;
	struct te_task_info ti;
	size_t off = 0, len = LEN;
	te_batch_id bid;

	fx_new(&f, "fail_nth: 2, fail_count: 1",
	       "slice_size: 4096, timeout_ms: 60000, retries: 3, retry_backoff_us: 10");
	bid = submit(&f, *op);
	assert_status(itest_wait(f.p.a, bid), TE_OK);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("retried: %s retries %u slices %u bytes %" PRIu64, te_state_str(ti.state),
		       ti.retries, ti.slices, ti.bytes);
	g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpint(ti.status, ==, TE_OK);
	g_assert_cmpuint(ti.retries, >=, 1);
	g_assert_cmpuint(ti.slices, ==, LEN / 4096);
	g_assert_cmpuint(ti.bytes, ==, LEN);
	g_assert_cmpstr(ti.detail, ==, "");
	if (*op == TE_OP_READ) {
		g_assert_true(itest_range_is(&f.la, 0, LEN, &f.rb, 0));
		g_assert_true(itest_untouched_outside(&f.la, &off, &len, 1));
	} else {
		g_assert_true(itest_range_is(&f.rb, 0, LEN, &f.la, 0));
		g_assert_true(itest_untouched_outside(&f.rb, &off, &len, 1));
	}
	g_assert_cmpuint(itest_batch(f.p.a, bid).bytes, ==, LEN);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_retries_exhausted(void)
{
	/*
	 * Two slices: the second attempt and every later one fail, so the second slice
	 * uses up its two retries whichever way the plugin counts attempts.
	 */
	struct itest_fx f;
	struct te_task_info ti;
	te_batch_id bid;

	fx_new(&f, "fail_nth: 2, fail_count: 10",
	       "slice_size: 4096, timeout_ms: 60000, retries: 2, retry_backoff_us: 10");
	bid = submit_len(&f, TE_OP_WRITE, 2 * 4096);
	assert_status(itest_wait(f.p.a, bid), TE_ERR_TRANSIENT);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("exhausted: %s %s retries %u bytes %" PRIu64 " detail \"%s\"",
		       te_state_str(ti.state), te_status_str(ti.status), ti.retries, ti.bytes,
		       ti.detail);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	g_assert_cmpint(ti.status, ==, TE_ERR_TRANSIENT);
	assert_contains(ti.detail, "injected transient failure");
	g_assert_cmpuint(ti.retries, >=, 2);
	g_assert_cmpuint(ti.bytes, <, 2 * 4096);
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_FAILED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_no_retries(void)
{
	/* retries: 0 turns the first transient failure into the task's failure. */
	struct itest_fx f;
	struct te_task_info ti;
	te_batch_id bid;

	fx_new(&f, "fail_nth: 2, fail_count: 1",
	       "slice_size: 4096, timeout_ms: 60000, retries: 0, retry_backoff_us: 10");
	bid = submit(&f, TE_OP_READ);
	assert_status(itest_wait(f.p.a, bid), TE_ERR_TRANSIENT);
	ti = itest_task(f.p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(ti.retries, ==, 0);
	assert_contains(ti.detail, "injected transient failure");
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

/*
 * transfer.fallback: fail_nth (first in priority) fails every attempt with a
 * retryable status; with fallback the slices move to loopback and the bytes land,
 * without it the task fails. Both engines load both transports.
 */
static void fallback_case(bool fallback)
{
	const struct itest_transport tps[] = {
		{ "fail_nth", NULL, true, "fail_nth: 1, fail_count: 1000000" },
		{ "loopback", NULL, true, "progress: manual" },
	};
	g_autofree char *transfer = g_strdup_printf(
		"slice_size: 4096, timeout_ms: 60000, retries: 1, retry_backoff_us: 10, "
		"fallback: %s",
		fallback ? "true" : "false");
	g_autofree char *ya = itest_yaml("A", tps, 2, transfer);
	g_autofree char *yb = itest_yaml("B", tps, 2, transfer);
	struct te_engine *a = itest_engine(ya), *b = itest_engine(yb);
	struct itest_buf la, rb;
	struct te_task_info ti;
	struct te_request r;
	te_segment_id seg;
	te_batch_id bid;
	char *json = NULL;
	size_t len = 0;

	itest_buf_new(&la, 4 * 4096, 64, 11);
	itest_buf_new(&rb, 4 * 4096, 64, 22);
	itest_buf_fill(&la);
	itest_buf_fill(&rb);
	itest_buf_register(&la, a, TE_MEM_LOCAL);
	itest_buf_register(&rb, b, TE_MEM_REMOTE);
	assert_ok(te_segment_export(b, &json, &len));
	assert_ok(te_segment_import(a, json, len, &seg));
	te_free(json);
	r = (struct te_request){ TE_OP_WRITE, seg, la.data, (uint64_t)(uintptr_t)rb.data,
				 4 * 4096 };
	assert_ok(te_batch_new(a, 1, &bid));
	assert_ok(te_batch_submit(a, bid, &r, 1));
	{
		enum te_status wst = te_batch_wait(a, bid, ITEST_WAIT_NS);

		g_assert_cmpint(wst, !=, TE_INPROGRESS);
		g_assert_cmpint(wst, ==, fallback ? TE_OK : TE_ERR_TRANSIENT);
	}
	assert_ok(te_task_status(a, bid, 0, &ti));
	g_test_message("fallback %s: %s %s via %s, retries %u, detail \"%s\"",
		       fallback ? "on" : "off", te_state_str(ti.state), te_status_str(ti.status),
		       ti.transport, ti.retries, ti.detail);
	if (fallback) {
		g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpstr(ti.transport, ==, "loopback");
		g_assert_cmpuint(ti.bytes, ==, 4 * 4096);
		g_assert_true(itest_range_is(&rb, 0, 4 * 4096, &la, 0));
	} else {
		g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
		g_assert_cmpint(ti.status, ==, TE_ERR_TRANSIENT);
		g_assert_cmpstr(ti.transport, ==, "fail_nth");
		assert_contains(ti.detail, "injected transient failure");
	}
	assert_ok(te_batch_free(a, bid));
	assert_ok(te_segment_close(a, seg));
	te_engine_free(a);
	te_engine_free(b);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

static void test_fallback_on(void)
{
	fallback_case(true);
}

static void test_fallback_off(void)
{
	fallback_case(false);
}

static void test_quarantine(void)
{
	/*
	 * quarantine_after 1: the first failure pauses the device. The documented
	 * outcome is only that the task ends terminal: COMPLETED with every byte, or
	 * FAILED because the path was paused. After the pause a new batch completes.
	 */
	struct itest_fx f;
	struct te_task_info ti;
	te_batch_id bid;
	enum te_status st;

	fx_new(&f, "fail_nth: 2, fail_count: 1",
	       "slice_size: 4096, timeout_ms: 60000, retries: 3, retry_backoff_us: 10, "
	       "quarantine_after: 1, quarantine_ms: 50");
	bid = submit(&f, TE_OP_READ);
	st = itest_wait(f.p.a, bid);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("quarantine: wait %s, task %s %s retries %u detail \"%s\"",
		       te_status_str(st), te_state_str(ti.state), te_status_str(ti.status),
		       ti.retries, ti.detail);
	g_assert_true(te_state_is_terminal(ti.state));
	if (ti.state == TE_STATE_COMPLETED) {
		g_assert_cmpint(st, ==, TE_OK);
		g_assert_true(itest_range_is(&f.la, 0, LEN, &f.rb, 0));
	} else {
		g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
		g_assert_true(ti.status == TE_ERR_PEER_QUARANTINED ||
			      ti.status == TE_ERR_TRANSIENT || ti.status == TE_ERR_NO_DEVICE);
		g_assert_cmpint(st, ==, ti.status);
	}
	assert_ok(te_batch_free(f.p.a, bid));

	/* Well past the pause, the path is usable again (fail_nth fails no more). */
	sleep_ms(200);
	itest_buf_fill(&f.la);
	bid = submit(&f, TE_OP_READ);
	assert_status(itest_wait(f.p.a, bid), TE_OK);
	g_assert_true(itest_range_is(&f.la, 0, LEN, &f.rb, 0));
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

int main(int argc, char **argv)
{
	static const enum te_opcode rd = TE_OP_READ, wr = TE_OP_WRITE;

	g_test_init(&argc, &argv, NULL);
	g_test_add_data_func("/retry/succeeds/read", &rd, test_retry_succeeds);
	g_test_add_data_func("/retry/succeeds/write", &wr, test_retry_succeeds);
	g_test_add_func("/retry/exhausted", test_retries_exhausted);
	g_test_add_func("/retry/none", test_no_retries);
	g_test_add_func("/retry/quarantine", test_quarantine);
	g_test_add_func("/retry/fallback/on", test_fallback_on);
	g_test_add_func("/retry/fallback/off", test_fallback_off);
	return g_test_run();
}
