/* SPDX-License-Identifier: Apache-2.0 */
/* concurrency_test.c: several threads submit to one segment while another polls status. */
#include "itest.h"

#include <stdatomic.h>

enum {
	THREADS = 4,
	REQS = 200, /* requests per thread's batch */
	STRIDE = 4096,
	ROUNDS = 25, /* batches per thread in the churn test */
};

struct shared {
	struct itest_pair p;
	struct itest_buf la, rb;
	te_batch_id bid[THREADS];
	atomic_int done; /* submitter threads finished */
	atomic_int failures;
};

struct worker {
	struct shared *s;
	int idx;
	enum te_status submit_st;
	enum te_status wait_st;
};

static size_t region(int t)
{
	return (size_t)t * REQS * STRIDE;
}

static size_t req_len(size_t i)
{
	return 1 + (i * 131) % (STRIDE - 1);
}

static gpointer submitter(gpointer data)
{
	struct worker *w = data;
	struct shared *s = w->s;
	struct te_request r[REQS];

	for (size_t i = 0; i < REQS; i++) {
		size_t off = region(w->idx) + i * STRIDE;

		r[i] = (struct te_request){ (i + (size_t)w->idx) % 2 ? TE_OP_WRITE : TE_OP_READ,
					    s->p.seg, s->la.data + off, itest_raddr(&s->rb, off),
					    req_len(i) };
	}
	w->submit_st = te_batch_submit(s->p.a, s->bid[w->idx], r, REQS);
	w->wait_st = te_batch_wait(s->p.a, s->bid[w->idx], ITEST_WAIT_NS);
	atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
	return NULL;
}

/* Poll every batch until all are terminal; counters must only move forward. */
static gpointer poller(gpointer data)
{
	struct shared *s = data;
	struct te_batch_info last[THREADS];
	gint64 deadline = g_get_monotonic_time() + ITEST_WAIT_NS / 1000 + 10 * G_USEC_PER_SEC;
	unsigned polls = 0;

	memset(last, 0, sizeof(last));
	for (;;) {
		int terminal = 0;

		for (int t = 0; t < THREADS; t++) {
			struct te_batch_info bi;
			enum te_status st = te_batch_status(s->p.a, s->bid[t], &bi);

			polls++;
			if (st != TE_OK || bi.bytes < last[t].bytes ||
			    bi.completed < last[t].completed || bi.tasks < last[t].tasks ||
			    (te_state_is_terminal(last[t].state) && last[t].tasks == REQS &&
			     !te_state_is_terminal(bi.state))) {
				g_test_message("poll of batch %d went backwards or failed (%s)", t,
					       te_status_str(st));
				atomic_fetch_add(&s->failures, 1);
				return NULL;
			}
			last[t] = bi;
			terminal += bi.tasks == REQS && te_state_is_terminal(bi.state);
		}
		if (terminal == THREADS &&
		    atomic_load_explicit(&s->done, memory_order_acquire) == THREADS)
			break;
		if (g_get_monotonic_time() > deadline) {
			g_test_message("poller: batches not terminal in time");
			atomic_fetch_add(&s->failures, 1);
			return NULL;
		}
		g_thread_yield();
	}
	g_test_message("poller: %u status calls", polls);
	return NULL;
}

static void test_threads_one_segment(gconstpointer data)
{
	const char *progress = data;
	g_autofree char *opts = g_strdup_printf("progress: %s", progress);
	struct shared *s = g_new0(struct shared, 1);
	struct worker w[THREADS];
	GThread *th[THREADS], *pt;

	itest_pair_new(&s->p, "loopback", opts, "slice_size: 1024, timeout_ms: 60000");
	itest_buf_new(&s->la, region(THREADS), 4096, 0xa);
	itest_buf_new(&s->rb, region(THREADS), 4096, 0xb);
	itest_buf_register(&s->la, s->p.a, TE_MEM_LOCAL);
	itest_buf_register(&s->rb, s->p.b, TE_MEM_REMOTE);
	itest_pair_connect(&s->p);
	for (int t = 0; t < THREADS; t++)
		assert_ok(te_batch_new(s->p.a, REQS, &s->bid[t]));

	pt = g_thread_new("poller", poller, s);
	for (int t = 0; t < THREADS; t++) {
		w[t] = (struct worker){ s, t, TE_INPROGRESS, TE_INPROGRESS };
		th[t] = g_thread_new("submitter", submitter, &w[t]);
	}
	for (int t = 0; t < THREADS; t++)
		g_thread_join(th[t]);
	g_thread_join(pt);

	g_assert_cmpint(atomic_load(&s->failures), ==, 0);
	for (int t = 0; t < THREADS; t++) {
		struct te_batch_info bi;

		assert_status(w[t].submit_st, TE_OK);
		assert_status(w[t].wait_st, TE_OK);
		bi = itest_batch(s->p.a, s->bid[t]);
		g_assert_cmpint(bi.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpuint(bi.completed, ==, REQS);
		for (size_t i = 0; i < REQS; i++) {
			size_t off = region(t) + i * STRIDE;

			if ((i + (size_t)t) % 2)
				g_assert_true(itest_range_is(&s->rb, off, req_len(i), &s->la, off));
			else
				g_assert_true(itest_range_is(&s->la, off, req_len(i), &s->rb, off));
		}
		assert_ok(te_batch_free(s->p.a, s->bid[t]));
	}
	itest_pair_free(&s->p);
	itest_buf_free(&s->la);
	itest_buf_free(&s->rb);
	g_free(s);
}

/* Churn: each thread creates, submits, waits and frees batches in a loop. */
static gpointer churner(gpointer data)
{
	struct worker *w = data;
	struct shared *s = w->s;

	w->submit_st = TE_OK;
	w->wait_st = TE_OK;
	for (int round = 0; round < ROUNDS; round++) {
		size_t off = region(w->idx) + (size_t)round * STRIDE;
		struct te_request r = { round % 2 ? TE_OP_WRITE : TE_OP_READ, s->p.seg,
					s->la.data + off, itest_raddr(&s->rb, off), STRIDE };
		te_batch_id bid;
		enum te_status st;

		st = te_batch_new(s->p.a, 1, &bid);
		if (st == TE_OK)
			st = te_batch_submit(s->p.a, bid, &r, 1);
		if (st == TE_OK)
			st = te_batch_wait(s->p.a, bid, ITEST_WAIT_NS);
		if (st != TE_OK) {
			w->wait_st = st;
			break;
		}
		st = te_batch_free(s->p.a, bid);
		if (st != TE_OK) {
			w->wait_st = st;
			break;
		}
	}
	atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
	return NULL;
}

/* Hammers the batch calls with handles that are never valid while churners run. */
static gpointer forger(gpointer data)
{
	struct shared *s = data;
	GRand *rnd = g_rand_new_with_seed(42);

	while (atomic_load_explicit(&s->done, memory_order_acquire) < THREADS) {
		te_batch_id forged = ((uint64_t)g_rand_int(rnd) << 32) | g_rand_int(rnd);
		struct te_batch_info bi;
		enum te_status st = te_batch_status(s->p.a, forged, &bi);

		/* A random value may in theory hit a live handle; it must never crash. */
		if (st != TE_ERR_INVALID_HANDLE && st != TE_OK)
			atomic_fetch_add(&s->failures, 1);
		g_thread_yield();
	}
	g_rand_free(rnd);
	return NULL;
}

static void test_churn(gconstpointer data)
{
	const char *progress = data;
	g_autofree char *opts = g_strdup_printf("progress: %s", progress);
	struct shared *s = g_new0(struct shared, 1);
	struct worker w[THREADS];
	GThread *th[THREADS], *ft;

	itest_pair_new(&s->p, "loopback", opts, "timeout_ms: 60000, max_batches: 8");
	itest_buf_new(&s->la, region(THREADS), 0, 0xc);
	itest_buf_new(&s->rb, region(THREADS), 0, 0xd);
	itest_buf_register(&s->la, s->p.a, TE_MEM_LOCAL);
	itest_buf_register(&s->rb, s->p.b, TE_MEM_REMOTE);
	itest_pair_connect(&s->p);

	ft = g_thread_new("forger", forger, s);
	for (int t = 0; t < THREADS; t++) {
		w[t] = (struct worker){ s, t, TE_OK, TE_OK };
		th[t] = g_thread_new("churner", churner, &w[t]);
	}
	for (int t = 0; t < THREADS; t++) {
		g_thread_join(th[t]);
		assert_status(w[t].wait_st, TE_OK);
	}
	g_thread_join(ft);
	g_assert_cmpint(atomic_load(&s->failures), ==, 0);
	/* The last round of each thread landed. */
	for (int t = 0; t < THREADS; t++) {
		size_t off = region(t) + (size_t)(ROUNDS - 1) * STRIDE;

		if ((ROUNDS - 1) % 2)
			g_assert_true(itest_range_is(&s->rb, off, STRIDE, &s->la, off));
		else
			g_assert_true(itest_range_is(&s->la, off, STRIDE, &s->rb, off));
	}
	itest_pair_free(&s->p);
	itest_buf_free(&s->la);
	itest_buf_free(&s->rb);
	g_free(s);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_data_func("/concurrency/threads-one-segment/manual", "manual",
			     test_threads_one_segment);
	g_test_add_data_func("/concurrency/threads-one-segment/auto", "auto",
			     test_threads_one_segment);
	g_test_add_data_func("/concurrency/churn/manual", "manual", test_churn);
	g_test_add_data_func("/concurrency/churn/auto", "auto", test_churn);
	return g_test_run();
}
