/* SPDX-License-Identifier: Apache-2.0 */
/* transfer_test.c: READ and WRITE through loopback in both progress modes, bytes verified. */
#include "itest.h"

#define SLICE 65536u
#define GUARD 4096u

static const char *const modes[] = { "manual", "auto" };

struct xfer_case {
	const char *progress;
	enum te_opcode op;
	uint64_t len;
	size_t loff; /* offset of the local range in A's buffer */
	size_t roff; /* offset of the remote range in B's buffer */
};

static char *progress_opts(const char *progress)
{
	return g_strdup_printf("progress: %s", progress);
}

static void pair_for(struct itest_pair *p, const char *progress, uint64_t slice)
{
	g_autofree char *opts = progress_opts(progress);
	g_autofree char *transfer = g_strdup_printf(
		"slice_size: %" PRIu64 ", timeout_ms: 60000, retries: 3, retry_backoff_us: 10",
		slice);

	itest_pair_new(p, "loopback", opts, transfer);
}

static void test_single(gconstpointer data)
{
	const struct xfer_case *c = data;
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r;
	struct te_task_info ti;
	struct te_batch_info bi;
	te_batch_id bid;
	size_t lo = c->loff, ro = c->roff, len = c->len;

	pair_for(&p, c->progress, SLICE);
	itest_buf_new(&la, lo + len + 64, GUARD, 0x1111);
	itest_buf_new(&rb, ro + len + 64, GUARD, 0x2222);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);

	r = (struct te_request){ c->op, p.seg, la.data + lo, itest_raddr(&rb, ro), len };
	assert_ok(te_batch_new(p.a, 1, &bid));
	assert_ok(te_batch_submit(p.a, bid, &r, 1));
	assert_ok(itest_wait(p.a, bid));

	if (c->op == TE_OP_READ) {
		g_assert_true(itest_range_is(&la, lo, len, &rb, ro));
		g_assert_true(itest_untouched_outside(&la, &lo, &len, 1));
		g_assert_true(itest_untouched_outside(&rb, NULL, NULL, 0));
	} else {
		g_assert_true(itest_range_is(&rb, ro, len, &la, lo));
		g_assert_true(itest_untouched_outside(&rb, &ro, &len, 1));
		g_assert_true(itest_untouched_outside(&la, NULL, NULL, 0));
	}

	ti = itest_task(p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpint(ti.status, ==, TE_OK);
	g_assert_cmpuint(ti.bytes, ==, len);
	g_assert_cmpuint(ti.length, ==, len);
	g_assert_cmpuint(ti.slices, ==, (len + SLICE - 1) / SLICE);
	g_assert_cmpstr(ti.transport, ==, "loopback");
	g_assert_nonnull(ti.device);
	g_assert_cmpstr(ti.detail, ==, "");

	bi = itest_batch(p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(bi.tasks, ==, 1);
	g_assert_cmpuint(bi.completed, ==, 1);
	g_assert_cmpuint(bi.failed, ==, 0);
	g_assert_cmpuint(bi.timed_out, ==, 0);
	g_assert_cmpuint(bi.canceled, ==, 0);
	g_assert_cmpuint(bi.bytes, ==, len);

	/* A finished batch waits instantly and reports the same outcome again. */
	assert_ok(te_batch_wait(p.a, bid, 0));
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

/* A batch of many requests, READ and WRITE mixed, lengths and offsets varied. */
static void test_many(gconstpointer data)
{
	enum {
		N = 1000,
		STRIDE = 4096
	};
	const char *progress = data;
	const uint64_t slice = 1024;
	struct itest_pair p;
	struct itest_buf la, rb;
	g_autofree struct te_request *r = g_new0(struct te_request, N);
	size_t lo[N], ro[N], len[N];
	size_t rd_lo[N], rd_len[N], wr_ro[N], wr_len[N];
	size_t n_rd = 0, n_wr = 0;
	struct te_batch_info bi;
	uint64_t total = 0;
	te_batch_id bid;

	pair_for(&p, progress, slice);
	itest_buf_new(&la, (size_t)N * STRIDE, GUARD, 0x3333);
	itest_buf_new(&rb, (size_t)N * STRIDE, GUARD, 0x4444);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);

	for (size_t i = 0; i < N; i++) {
		lo[i] = i * STRIDE + i % 7;
		ro[i] = i * STRIDE + i % 5;
		len[i] = 1 + (i * 37) % 4000;
		r[i] = (struct te_request){ i % 2 ? TE_OP_WRITE : TE_OP_READ, p.seg,
					    la.data + lo[i], itest_raddr(&rb, ro[i]), len[i] };
		total += len[i];
		if (i % 2) {
			wr_ro[n_wr] = ro[i];
			wr_len[n_wr++] = len[i];
		} else {
			rd_lo[n_rd] = lo[i];
			rd_len[n_rd++] = len[i];
		}
	}
	assert_ok(te_batch_new(p.a, N, &bid));
	assert_ok(te_batch_submit(p.a, bid, r, N));
	assert_ok(itest_wait(p.a, bid));

	for (size_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(p.a, bid, (uint32_t)i);

		if (ti.state != TE_STATE_COMPLETED || ti.bytes != len[i])
			g_error("task %zu: state %s bytes %" PRIu64 " (want %zu) detail %s", i,
				te_state_str(ti.state), ti.bytes, len[i], ti.detail);
		g_assert_cmpuint(ti.slices, ==, (len[i] + slice - 1) / slice);
		g_assert_cmpstr(ti.transport, ==, "loopback");
		if (i % 2)
			g_assert_true(itest_range_is(&rb, ro[i], len[i], &la, lo[i]));
		else
			g_assert_true(itest_range_is(&la, lo[i], len[i], &rb, ro[i]));
	}
	/* Sources are never written; destinations only inside their ranges. */
	g_assert_true(itest_untouched_outside(&la, rd_lo, rd_len, n_rd));
	g_assert_true(itest_untouched_outside(&rb, wr_ro, wr_len, n_wr));

	bi = itest_batch(p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(bi.tasks, ==, N);
	g_assert_cmpuint(bi.completed, ==, N);
	g_assert_cmpuint(bi.bytes, ==, total);
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

static void test_multi_submit(gconstpointer data)
{
	/* Task indices continue across submits on one batch. */
	const char *progress = data;
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r[10];
	te_batch_id bid;

	pair_for(&p, progress, SLICE);
	itest_buf_new(&la, 10 * 512, GUARD, 5);
	itest_buf_new(&rb, 10 * 512, GUARD, 6);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	for (size_t i = 0; i < 10; i++)
		r[i] = (struct te_request){ TE_OP_READ, p.seg, la.data + i * 512,
					    itest_raddr(&rb, (9 - i) * 512), 100 + i };
	assert_ok(te_batch_new(p.a, 10, &bid));
	assert_ok(te_batch_submit(p.a, bid, r, 3));
	assert_ok(itest_wait(p.a, bid));
	assert_ok(te_batch_submit(p.a, bid, r + 3, 7));
	assert_ok(itest_wait(p.a, bid));
	g_assert_cmpuint(itest_batch(p.a, bid).tasks, ==, 10);
	for (size_t i = 0; i < 10; i++) {
		struct te_task_info ti = itest_task(p.a, bid, (uint32_t)i);

		g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpuint(ti.length, ==, 100 + i);
		g_assert_true(itest_range_is(&la, i * 512, 100 + i, &rb, (9 - i) * 512));
	}
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

static void test_batch_slots_recycled(void)
{
	/* Far more batches than live slots over time: freed slots are reused. */
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r;
	te_batch_id old = 0;

	itest_pair_new(&p, "loopback", "progress: manual", "max_batches: 4");
	itest_buf_new(&la, 64, 0, 7);
	itest_buf_new(&rb, 64, 0, 8);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	r = (struct te_request){ TE_OP_READ, p.seg, la.data, itest_raddr(&rb, 0), 64 };
	for (int i = 0; i < 200; i++) {
		te_batch_id bid;

		assert_ok(te_batch_new(p.a, 1, &bid));
		g_assert_cmpuint(bid, !=, 0);
		/* A reused slot gets a new generation: the old handle stays stale. */
		g_assert_cmpuint(bid, !=, old);
		assert_ok(te_batch_submit(p.a, bid, &r, 1));
		assert_ok(itest_wait(p.a, bid));
		assert_ok(te_batch_free(p.a, bid));
		old = bid;
	}
	g_assert_true(itest_range_is(&la, 0, 64, &rb, 0));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

static void test_batch_new_limits(void)
{
	struct itest_pair p;
	te_batch_id b[4], extra = 0x77;

	itest_pair_new(&p, "loopback", "progress: manual", "max_batches: 4, max_batch_size: 100");
	assert_status(te_batch_new(p.a, 0, &extra), TE_ERR_INVALID_ARG);
	assert_status(te_batch_new(p.a, 101, &extra), TE_ERR_TOO_LARGE);
	assert_status(te_batch_new(p.a, 1, NULL), TE_ERR_INVALID_ARG);
	assert_status(te_batch_new(NULL, 1, &extra), TE_ERR_INVALID_ARG);
	g_assert_cmpuint(extra, ==, 0x77);
	for (int i = 0; i < 4; i++)
		assert_ok(te_batch_new(p.a, 100, &b[i]));
	assert_status(te_batch_new(p.a, 1, &extra), TE_ERR_BUSY);
	g_assert_cmpuint(extra, ==, 0x77);
	/* Empty batches are terminal (nothing pending) and can be freed. */
	for (int i = 0; i < 4; i++)
		assert_ok(te_batch_free(p.a, b[i]));
	assert_ok(te_batch_new(p.a, 1, &extra));
	assert_ok(te_batch_free(p.a, extra));
	itest_pair_free(&p);
}

static void add_single(const char *progress, enum te_opcode op, uint64_t len, size_t loff,
		       size_t roff)
{
	struct xfer_case *c = g_new0(struct xfer_case, 1);
	g_autofree char *path = g_strdup_printf("/transfer/%s/%s/%" PRIu64 "%s", progress,
						op == TE_OP_READ ? "read" : "write", len,
						loff || roff ? "-unaligned" : "");

	*c = (struct xfer_case){ progress, op, len, loff, roff };
	g_test_add_data_func_full(path, c, test_single, g_free);
}

/*
 * Manual progress with nobody in te_batch_wait: the engine's workers (here three,
 * transfer.worker_threads) must drive the transport; the caller only polls.
 */
/*
 * A buffer the peer registers after its segment was opened is reachable by the very next
 * submit (the core fetches the descriptor again and validates once more); a range still
 * outside every buffer is refused, and the other requests of that submit go through.
 */
static void test_late_registration(void)
{
	struct itest_pair p;
	struct itest_buf la, rb, late;
	struct te_request r[2];
	struct te_task_info ti;
	te_batch_id bid;

	pair_for(&p, "auto", SLICE);
	itest_buf_new(&la, 2 * 65536, GUARD, 0x1111);
	itest_buf_new(&rb, 65536, GUARD, 0x2222);
	itest_buf_new(&late, 65536, GUARD, 0x3333);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	itest_buf_register(&late, p.b, TE_MEM_REMOTE); /* after a opened b */

	r[0] = (struct te_request){ TE_OP_WRITE, p.seg, la.data, itest_raddr(&late, 0), 65536 };
	r[1] = (struct te_request){ TE_OP_WRITE, p.seg, la.data + 65536, itest_raddr(&rb, 0),
				    65536 };
	assert_ok(te_batch_new(p.a, 4, &bid));
	assert_ok(te_batch_submit(p.a, bid, r, 2));
	assert_ok(itest_wait(p.a, bid));
	g_assert_true(itest_range_is(&late, 0, 65536, &la, 0));
	g_assert_true(itest_range_is(&rb, 0, 65536, &la, 65536));
	/* Still outside after the refresh: refused with the reason; nothing else waits on it. */
	r[0].remote = itest_raddr(&late, 0) + (1u << 30);
	g_assert_cmpint(te_batch_submit(p.a, bid, r, 2), ==, TE_ERR_REMOTE_ACCESS);
	assert_contains(te_last_error(), "is outside the registered buffers of segment");
	g_assert_cmpint(itest_wait(p.a, bid), ==, TE_ERR_REMOTE_ACCESS);
	ti = itest_task(p.a, bid, 2);
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	ti = itest_task(p.a, bid, 3);
	g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
	itest_buf_free(&late);
}

static void test_workers_drive_manual(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r[16];
	struct te_batch_info bi;
	te_batch_id bid;
	gint64 until;

	itest_pair_new(&p, "loopback", "progress: manual",
		       "worker_threads: 3, slice_size: 4096, timeout_ms: 60000");
	itest_buf_new(&la, 16 * 65536, 64, 5);
	itest_buf_new(&rb, 16 * 65536, 64, 6);
	itest_buf_fill(&la);
	itest_buf_fill(&rb);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);
	for (int i = 0; i < 16; i++)
		r[i] = (struct te_request){ TE_OP_READ, p.seg, la.data + i * 65536,
					    (uint64_t)(uintptr_t)(rb.data + i * 65536), 65536 };
	assert_ok(te_batch_new(p.a, 16, &bid));
	assert_ok(te_batch_submit(p.a, bid, r, 16));
	until = g_get_monotonic_time() + 60 * G_USEC_PER_SEC;
	do {
		assert_ok(te_batch_status(p.a, bid, &bi));
		if (te_state_is_terminal(bi.state))
			break;
		g_usleep(1000);
	} while (g_get_monotonic_time() < until);
	g_assert_cmpint(bi.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(bi.bytes, ==, 16 * 65536);
	g_assert_true(itest_range_is(&la, 0, 16 * 65536, &rb, 0));
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

int main(int argc, char **argv)
{
	static const uint64_t sizes[] = { 1, 4096, 1u << 20, 64u << 20 };

	g_test_init(&argc, &argv, NULL);
	for (size_t m = 0; m < G_N_ELEMENTS(modes); m++) {
		for (int op = TE_OP_READ; op <= TE_OP_WRITE; op++) {
			for (size_t s = 0; s < G_N_ELEMENTS(sizes); s++)
				add_single(modes[m], op, sizes[s], 0, 0);
			add_single(modes[m], op, 4096 + 7, 3, 5);
			add_single(modes[m], op, (1u << 20) + 13, 1, 7);
			add_single(modes[m], op, SLICE + 1, 63, 1);
		}
		{
			g_autofree char *p1 = g_strdup_printf("/transfer/%s/batch-1000", modes[m]);
			g_autofree char *p2 =
				g_strdup_printf("/transfer/%s/multi-submit", modes[m]);

			g_test_add_data_func(p1, modes[m], test_many);
			g_test_add_data_func(p2, modes[m], test_multi_submit);
		}
	}
	g_test_add_func("/transfer/batch-slots-recycled", test_batch_slots_recycled);
	g_test_add_func("/transfer/batch-new-limits", test_batch_new_limits);
	g_test_add_func("/transfer/workers-drive-manual", test_workers_drive_manual);
	g_test_add_func("/transfer/late-registration", test_late_registration);
	return g_test_run();
}
