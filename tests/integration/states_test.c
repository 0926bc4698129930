/* SPDX-License-Identifier: Apache-2.0 */
/* states_test.c: every task state is reachable, and te_batch_wait reports each outcome. */
#include "itest.h"

static void fx_new(struct itest_fx *f, const char *plugin, const char *options,
		   const char *transfer)
{
	itest_fx_new(f, plugin, options, transfer, 1 << 16, 64);
}

/* One request of @len bytes at offset @off of both buffers. */
static struct te_request req(struct itest_fx *f, enum te_opcode op, size_t off, uint64_t len)
{
	return (struct te_request){ op, f->p.seg, f->la.data + off, itest_raddr(&f->rb, off), len };
}

static te_batch_id submit1(struct itest_fx *f, struct te_request r)
{
	te_batch_id bid;

	assert_ok(te_batch_new(f->p.a, 1, &bid));
	assert_ok(te_batch_submit(f->p.a, bid, &r, 1));
	return bid;
}

static void test_waiting(void)
{
	/*
	 * never_complete with queue_depth 1 takes exactly one slice and keeps it:
	 * the other tasks were never handed to the plugin, so they report WAITING
	 * (and stay WAITING, whatever the worker does). Cancel ends them all.
	 */
	enum {
		N = 16
	};
	struct itest_fx f;
	struct te_request r[N];
	struct te_batch_info bi;
	unsigned waiting = 0, pending = 0;
	te_batch_id bid;

	fx_new(&f, "never_complete", "queue_depth: 1", "timeout_ms: 60000");
	for (size_t i = 0; i < N; i++)
		r[i] = req(&f, TE_OP_READ, i * 1024, 1000);
	assert_ok(te_batch_new(f.p.a, N, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, N));
	assert_status(te_batch_wait(f.p.a, bid, 10 * 1000 * 1000), TE_INPROGRESS);
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_test_message("task %u: %s", i, te_state_str(ti.state));
		if (ti.state == TE_STATE_WAITING) {
			waiting++;
			g_assert_cmpuint(ti.bytes, ==, 0);
			g_assert_cmpint(ti.status, ==, TE_OK);
			g_assert_cmpstr(ti.detail, ==, "");
		} else {
			g_assert_cmpint(ti.state, ==, TE_STATE_PENDING);
			pending++;
		}
	}
	g_assert_cmpuint(pending, ==, 1);
	g_assert_cmpuint(waiting, ==, N - 1);
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_PENDING);
	g_assert_cmpuint(bi.tasks, ==, N);

	/* Cancel reaches the WAITING tasks that never left the core too. */
	assert_ok(te_batch_cancel(f.p.a, bid));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_CANCELED);
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_assert_cmpint(ti.state, ==, TE_STATE_CANCELED);
		g_assert_cmpint(ti.status, ==, TE_ERR_CANCELED);
	}
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_CANCELED);
	g_assert_cmpuint(bi.canceled, ==, N);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_backpressure(void)
{
	/*
	 * loopback with queue_depth 1 and manual progress: most slices wait for room in
	 * the plugin's queue; every task still completes with its bytes.
	 */
	enum {
		N = 64
	};
	struct itest_fx f;
	struct te_request r[N];
	te_batch_id bid;

	fx_new(&f, "loopback", "progress: manual, queue_depth: 1",
	       "timeout_ms: 60000, slice_size: 256");
	for (size_t i = 0; i < N; i++)
		r[i] = req(&f, i % 2 ? TE_OP_WRITE : TE_OP_READ, i * 1024, 1000);
	assert_ok(te_batch_new(f.p.a, N, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, N));
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_assert_true(ti.state == TE_STATE_WAITING || ti.state == TE_STATE_PENDING ||
			      ti.state == TE_STATE_COMPLETED);
	}
	assert_ok(itest_wait(f.p.a, bid));
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpuint(ti.slices, ==, 4);
		if (i % 2)
			g_assert_true(itest_range_is(&f.rb, i * 1024, 1000, &f.la, i * 1024));
		else
			g_assert_true(itest_range_is(&f.la, i * 1024, 1000, &f.rb, i * 1024));
	}
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_pending(void)
{
	struct itest_fx f;
	struct te_task_info ti;
	struct te_batch_info bi;
	te_batch_id bid;

	fx_new(&f, "never_complete", NULL, "timeout_ms: 60000");
	bid = submit1(&f, req(&f, TE_OP_WRITE, 0, 4096));
	/* The slice is handed over at submit and never comes back by itself. */
	assert_status(te_batch_wait(f.p.a, bid, 10 * 1000 * 1000), TE_INPROGRESS);
	ti = itest_task(f.p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_PENDING);
	g_assert_cmpint(ti.status, ==, TE_OK);
	g_assert_cmpstr(ti.transport, ==, "never_complete");
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_PENDING);
	g_assert_cmpuint(bi.completed + bi.failed + bi.timed_out + bi.canceled, ==, 0);
	assert_ok(te_batch_cancel(f.p.a, bid));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_CANCELED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_completed(void)
{
	struct itest_fx f;
	te_batch_id bid;

	fx_new(&f, "loopback", "progress: auto", NULL);
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 1 << 16));
	assert_status(itest_wait(f.p.a, bid), TE_OK);
	g_assert_cmpint(itest_task(f.p.a, bid, 0).state, ==, TE_STATE_COMPLETED);
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_COMPLETED);
	g_assert_true(itest_range_is(&f.la, 0, 1 << 16, &f.rb, 0));
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_failed(void)
{
	struct itest_fx f;
	struct te_task_info ti;
	struct te_batch_info bi;
	te_batch_id bid;

	fx_new(&f, "fail_perm", NULL, "timeout_ms: 60000, retries: 3, retry_backoff_us: 10");
	bid = submit1(&f, req(&f, TE_OP_WRITE, 0, 4096));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_PEER_REJECTED);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("fail_perm: %s %s retries %u detail \"%s\"", te_state_str(ti.state),
		       te_status_str(ti.status), ti.retries, ti.detail);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	g_assert_cmpint(ti.status, ==, TE_ERR_PEER_REJECTED);
	assert_contains(ti.detail, "injected permanent failure");
	/* Not retryable: exactly one attempt. */
	g_assert_cmpuint(ti.retries, ==, 0);
	g_assert_cmpstr(ti.transport, ==, "fail_perm");
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(bi.failed, ==, 1);
	/* Nothing landed in B. */
	g_assert_true(itest_untouched_outside(&f.rb, NULL, NULL, 0));
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_timeout(void)
{
	struct itest_fx f;
	struct te_task_info ti;
	struct te_batch_info bi;
	te_batch_id bid;

	fx_new(&f, "never_complete", NULL, "timeout_ms: 200");
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 4096));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_TIMEOUT);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("timeout: %s %s detail \"%s\"", te_state_str(ti.state),
		       te_status_str(ti.status), ti.detail);
	g_assert_cmpint(ti.state, ==, TE_STATE_TIMEOUT);
	g_assert_cmpint(ti.status, ==, TE_ERR_TIMEOUT);
	g_assert_cmpstr(ti.detail, !=, "");
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_TIMEOUT);
	g_assert_cmpuint(bi.timed_out, ==, 1);
	g_assert_true(itest_untouched_outside(&f.la, NULL, NULL, 0));
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_canceled(void)
{
	enum {
		N = 3
	};
	struct itest_fx f;
	struct te_request r[N];
	struct te_batch_info bi;
	te_batch_id bid;

	fx_new(&f, "never_complete", NULL, "timeout_ms: 60000");
	for (size_t i = 0; i < N; i++)
		r[i] = req(&f, TE_OP_WRITE, i * 4096, 4096);
	assert_ok(te_batch_new(f.p.a, N, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, N));
	assert_ok(te_batch_cancel(f.p.a, bid));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_CANCELED);
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_assert_cmpint(ti.state, ==, TE_STATE_CANCELED);
		g_assert_cmpint(ti.status, ==, TE_ERR_CANCELED);
	}
	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_CANCELED);
	g_assert_cmpuint(bi.canceled, ==, N);
	/* Cancel again on a terminal batch: harmless. */
	assert_ok(te_batch_cancel(f.p.a, bid));
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_CANCELED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_cancel_completed_stays(void)
{
	/* Completed tasks stay completed when their batch is canceled afterwards. */
	struct itest_fx f;
	te_batch_id bid;

	fx_new(&f, "loopback", "progress: manual", NULL);
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 4096));
	assert_ok(itest_wait(f.p.a, bid));
	assert_ok(te_batch_cancel(f.p.a, bid));
	g_assert_cmpint(itest_task(f.p.a, bid, 0).state, ==, TE_STATE_COMPLETED);
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_COMPLETED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_invalid(void)
{
	struct itest_fx f;
	struct te_request r;
	te_batch_id bid;

	fx_new(&f, "loopback", "progress: manual", NULL);
	r = req(&f, TE_OP_READ, 0, 0);
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_status(te_batch_submit(f.p.a, bid, &r, 1), TE_ERR_INVALID_ARG);
	g_assert_cmpint(itest_task(f.p.a, bid, 0).state, ==, TE_STATE_INVALID);
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_FAILED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_late_completion_after_timeout(void)
{
	/*
	 * late_cancel reports its slice only some time after the core gave up on it.
	 * The late report must not change the outcome, and must not touch freed memory.
	 */
	struct itest_fx f;
	struct te_task_info ti;
	te_batch_id bid;

	fx_new(&f, "late_cancel", NULL, "timeout_ms: 200, retries: 0");
	bid = submit1(&f, req(&f, TE_OP_WRITE, 0, 4096));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_TIMEOUT);
	g_assert_cmpint(itest_task(f.p.a, bid, 0).state, ==, TE_STATE_TIMEOUT);
	sleep_ms(150); /* the late report arrives meanwhile */
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("after the late report: %s %s bytes %" PRIu64, te_state_str(ti.state),
		       te_status_str(ti.status), ti.bytes);
	g_assert_cmpint(ti.state, ==, TE_STATE_TIMEOUT);
	g_assert_cmpint(ti.status, ==, TE_ERR_TIMEOUT);
	/* The late "success" moved nothing that counts. */
	g_assert_cmpuint(ti.bytes, ==, 0);
	g_assert_cmpint(itest_batch(f.p.a, bid).state, ==, TE_STATE_TIMEOUT);
	g_assert_cmpuint(itest_batch(f.p.a, bid).timed_out, ==, 1);
	g_assert_cmpuint(itest_batch(f.p.a, bid).completed, ==, 0);
	assert_status(te_batch_wait(f.p.a, bid, 0), TE_ERR_TIMEOUT);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_late_completion_after_free(void)
{
	/* Free right after the timeout: the late report lands after the free (ASan). */
	struct itest_fx f;
	te_batch_id bid, again;
	struct te_batch_info bi;

	fx_new(&f, "late_cancel", NULL, "timeout_ms: 200, retries: 0");
	bid = submit1(&f, req(&f, TE_OP_WRITE, 0, 4096));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_TIMEOUT);
	assert_ok(te_batch_free(f.p.a, bid));
	sleep_ms(100);
	/* The engine still works: a new batch in the (maybe reused) slot. */
	assert_ok(te_batch_new(f.p.a, 1, &again));
	bi = itest_batch(f.p.a, again);
	g_assert_cmpuint(bi.tasks, ==, 0);
	assert_status(te_batch_status(f.p.a, bid, &bi), TE_ERR_INVALID_HANDLE);
	assert_ok(te_batch_free(f.p.a, again));
	itest_fx_free(&f);
}

static void test_late_completion_after_cancel(void)
{
	struct itest_fx f;
	te_batch_id bid;

	fx_new(&f, "late_cancel", NULL, "timeout_ms: 60000");
	bid = submit1(&f, req(&f, TE_OP_WRITE, 0, 4096));
	assert_ok(te_batch_cancel(f.p.a, bid));
	(void)itest_wait(f.p.a, bid);
	g_assert_true(te_state_is_terminal(itest_task(f.p.a, bid, 0).state));
	assert_ok(te_batch_free(f.p.a, bid));
	sleep_ms(100);
	itest_fx_free(&f);
}

static void test_wait_returns(void)
{
	struct itest_fx f;
	te_batch_id bid;

	/* TE_OK */
	fx_new(&f, "loopback", "progress: manual", NULL);
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 100));
	assert_status(te_batch_wait(f.p.a, bid, ITEST_WAIT_NS), TE_OK);
	assert_ok(te_batch_free(f.p.a, bid));
	/* Empty batch: nothing to wait for. */
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_status(te_batch_wait(f.p.a, bid, 0), TE_OK);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);

	/* The failure status */
	fx_new(&f, "fail_perm", NULL, NULL);
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 100));
	assert_status(te_batch_wait(f.p.a, bid, ITEST_WAIT_NS), TE_ERR_PEER_REJECTED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);

	/* TE_INPROGRESS on a short timeout, also with 0 (poll) */
	fx_new(&f, "never_complete", NULL, "timeout_ms: 60000");
	bid = submit1(&f, req(&f, TE_OP_READ, 0, 100));
	assert_status(te_batch_wait(f.p.a, bid, 10 * 1000 * 1000), TE_INPROGRESS);
	assert_status(te_batch_wait(f.p.a, bid, 0), TE_INPROGRESS);
	assert_ok(te_batch_cancel(f.p.a, bid));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_CANCELED);
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/states/waiting", test_waiting);
	g_test_add_func("/states/backpressure", test_backpressure);
	g_test_add_func("/states/pending", test_pending);
	g_test_add_func("/states/completed", test_completed);
	g_test_add_func("/states/failed", test_failed);
	g_test_add_func("/states/timeout", test_timeout);
	g_test_add_func("/states/canceled", test_canceled);
	g_test_add_func("/states/cancel-completed-stays", test_cancel_completed_stays);
	g_test_add_func("/states/invalid", test_invalid);
	g_test_add_func("/states/late-completion-after-timeout",
			test_late_completion_after_timeout);
	g_test_add_func("/states/late-completion-after-free", test_late_completion_after_free);
	g_test_add_func("/states/late-completion-after-cancel", test_late_completion_after_cancel);
	g_test_add_func("/states/wait-returns", test_wait_returns);
	return g_test_run();
}
