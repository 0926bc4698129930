/* SPDX-License-Identifier: Apache-2.0 */
/* batch_test.c: the batch handle table, batch reuse, and engine teardown with slices held. */
#include <inttypes.h>
#include <string.h>

#include <glib.h>

#include "core/batch.h"
#include "core/engine.h"
#include "core/slice.h"
#include "fake.h"
#include "itest.h"

static void test_handles(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, "max_batches: 2");
	struct engine *e = fake_engine(te);
	te_batch_id a, b, c, a2;
	struct batch *got;
	struct batch **list;
	uint32_t n;

	list = batch_list_live(e, true, &n);
	g_assert_cmpuint(n, ==, 0);
	g_free(list);
	g_assert_cmpint(batch_new(e, 4, &a), ==, TE_OK);
	g_assert_cmpint(batch_new(e, 4, &b), ==, TE_OK);
	/* Two slots: the third waits for a free one. */
	g_assert_cmpint(batch_new(e, 4, &c), ==, TE_ERR_BUSY);
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_OK);
	g_assert_true(got->engine == e);
	batch_unref(got);
	list = batch_list_live(e, true, &n);
	g_assert_cmpuint(n, ==, 2);
	/* The list holds a reference on each. */
	for (uint32_t i = 0; i < n; i++)
		batch_unref(list[i]);
	g_free(list);
	g_assert_cmpint(batch_free(e, a), ==, TE_OK);
	/* A freed handle is dead even when its slot is reused: the generation moved on. */
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_free(e, a), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_new(e, 4, &a2), ==, TE_OK);
	g_assert_cmpuint((uint32_t)a2, ==, (uint32_t)a);
	g_assert_cmphex(a2, !=, a);
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_ERR_INVALID_HANDLE);
	/* Forged handles: slot out of range, generation 0. */
	g_assert_cmpint(batch_get(e, (te_batch_id)1 << 32 | 7, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_get(e, (uint32_t)b, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_free(e, b), ==, TE_OK);
	g_assert_cmpint(batch_free(e, a2), ==, TE_OK);
	te_engine_free(te);
}

static char wbuf[1 << 16];

/* @n one-byte local WRITEs: wbuf[i] to wbuf[n + i]. */
static void wbuf_byte_writes(struct te_request *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		r[i] = (struct te_request){ .opcode = TE_OP_WRITE,
					    .segment = TE_SEGMENT_LOCAL,
					    .local = wbuf + i,
					    .remote = (uintptr_t)(wbuf + n + i),
					    .length = 1 };
}

/* A local WRITE of the first half of wbuf to its second half. */
static struct te_request half_write(void)
{
	return (struct te_request){ .opcode = TE_OP_WRITE,
				    .segment = TE_SEGMENT_LOCAL,
				    .local = wbuf,
				    .remote = (uintptr_t)(wbuf + sizeof(wbuf) / 2),
				    .length = sizeof(wbuf) / 2 };
}

/* A freed batch goes to the cache and comes back for the next batch_new of its size. */
static void test_cache(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	te_batch_id id;
	struct batch *first, *again;

	g_assert_cmpint(batch_new(e, 8, &id), ==, TE_OK);
	g_assert_cmpint(batch_get(e, id, &first), ==, TE_OK);
	batch_unref(first);
	g_assert_cmpint(batch_free(e, id), ==, TE_OK);
	g_assert_cmpuint(e->n_cached, ==, 1);
	g_assert_cmpint(batch_new(e, 8, &id), ==, TE_OK);
	g_assert_cmpint(batch_get(e, id, &again), ==, TE_OK);
	g_assert_true(again == first);
	g_assert_cmpuint(atomic_load(&again->n_tasks), ==, 0);
	batch_unref(again);
	g_assert_cmpuint(e->n_cached, ==, 0);
	g_assert_cmpint(batch_free(e, id), ==, TE_OK);
	te_engine_free(te);
}

/*
 * The engine's cached batches, once @want of them are there (at most 5 s): the last
 * reference to a finished batch may drop on a plugin thread after te_batch_wait returned.
 */
static unsigned cached_within(struct engine *e, unsigned want)
{
	gint64 end = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
	unsigned n;

	for (;;) {
		g_mutex_lock(&e->cache_lock);
		n = e->n_cached;
		g_mutex_unlock(&e->cache_lock);
		if (n == want || g_get_monotonic_time() > end)
			return n;
		g_usleep(1000);
	}
}

/*
 * batch_new with every slot in use (TE_ERR_BUSY) after taking a batch from the cache puts it
 * back, with the slice chunk it keeps; it freed the batch and lost the chunk before. Then
 * the next batch_new of that size gets it, and it moves data as a fresh one.
 */
static void test_cache_busy(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, "max_batches: 2");
	struct engine *e = fake_engine(te);
	struct te_request r = half_write();
	te_batch_id big, small1, small2, again;
	struct batch *first, *got;
	void *spare;

	fake_reset();
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, wbuf, sizeof(wbuf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	/* A batch of 256 that moved data: freed, it goes to the cache with its slice chunk. */
	g_assert_cmpint(batch_new(e, 256, &big), ==, TE_OK);
	g_assert_cmpint(te_batch_submit(te, big, &r, 1), ==, TE_OK);
	g_assert_cmpint(te_batch_wait(te, big, 5000000000ll), ==, TE_OK);
	g_assert_cmpint(batch_get(e, big, &first), ==, TE_OK);
	batch_unref(first);
	g_assert_cmpint(batch_free(e, big), ==, TE_OK);
	g_assert_cmpuint(cached_within(e, 1), ==, 1);
	g_assert_nonnull(first->spare);
	spare = first->spare;
	/* Both slots taken by batches too small for the cached one. */
	g_assert_cmpint(batch_new(e, 4, &small1), ==, TE_OK);
	g_assert_cmpint(batch_new(e, 4, &small2), ==, TE_OK);
	g_assert_cmpuint(e->n_cached, ==, 1);
	/* No slot: the cached batch is taken, then given back with its chunk. */
	g_assert_cmpint(batch_new(e, 256, &again), ==, TE_ERR_BUSY);
	g_assert_cmpstr(te_last_error(), !=, NULL);
	g_assert_nonnull(strstr(te_last_error(), "batch slots are in use"));
	g_assert_cmpuint(e->n_cached, ==, 1);
	g_assert_true(e->cache == first);
	g_assert_true(first->spare == spare);
	g_assert_cmpint(batch_free(e, small1), ==, TE_OK);
	g_assert_cmpint(batch_new(e, 256, &again), ==, TE_OK);
	g_assert_cmpint(batch_get(e, again, &got), ==, TE_OK);
	g_assert_true(got == first);
	batch_unref(got);
	g_assert_cmpint(te_batch_submit(te, again, &r, 1), ==, TE_OK);
	g_assert_cmpint(te_batch_wait(te, again, 5000000000ll), ==, TE_OK);
	g_assert_cmpint(batch_free(e, again), ==, TE_OK);
	g_assert_cmpint(batch_free(e, small2), ==, TE_OK);
	te_engine_free(te);
}

/*
 * A batch of 32768 tasks goes to the cache with its slice chunk, like a small one (it was
 * freed before, task array and chunk allocated and page-faulted again by the next batch of
 * that size), comes back for the next batch_new of its size and moves data again on the
 * chunk it kept.
 */
static void test_cache_large(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, "max_batch_size: 65536");
	struct engine *e = fake_engine(te);
	const uint32_t n = sizeof(wbuf) / 2;
	struct te_request *r = g_new(struct te_request, n);
	struct batch *first = NULL, *got;
	struct slice_chunk *spare = NULL;
	te_batch_id id;

	g_assert_cmpint(te_mem_register(te, wbuf, sizeof(wbuf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	wbuf_byte_writes(r, n);
	for (int round = 0; round < 2; round++) {
		memset(wbuf, 'a' + round, n);
		memset(wbuf + n, 0, n);
		g_assert_cmpint(te_batch_new(te, n, &id), ==, TE_OK);
		g_assert_cmpint(batch_get(e, id, &got), ==, TE_OK);
		batch_unref(got);
		if (round == 0) {
			first = got;
		} else {
			/* The cached one, its chunk reused: nothing allocated for this batch. */
			g_assert_true(got == first);
			g_assert_cmpuint(e->n_cached, ==, 0);
			g_assert_cmpuint(e->cache_bytes, ==, 0);
		}
		g_assert_cmpint(te_batch_submit(te, id, r, n), ==, TE_OK);
		if (round == 1)
			g_assert_true(got->chunks == spare);
		g_assert_cmpint(te_batch_wait(te, id, 10000000000ll), ==, TE_OK);
		for (uint32_t i = 0; i < n; i++)
			g_assert_cmpint(wbuf[n + i], ==, 'a' + round);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
		g_assert_cmpuint(cached_within(e, 1), ==, 1);
		g_assert_true(e->cache == first);
		spare = first->spare;
		g_assert_nonnull(spare);
		g_assert_cmpuint(spare->cap, >=, (size_t)n * e->slice_stride);
		g_assert_cmpuint(e->cache_bytes, ==, (size_t)n * sizeof(struct task) + spare->cap);
		g_assert_cmpuint(atomic_load(&e->live_batches), ==, 0);
	}
	g_free(r);
	te_engine_free(te);
}

/*
 * The core hands a plugin up to 1024 slices per submit call (POST_CHUNK): a batch of 1024
 * READs goes out in one tcp sendmsg (bench/README.md, 2026-12-06). A batch of 2300 one-slice
 * tasks: three calls of 1024, 1024 and 252, every task completed.
 */
static void test_submit_chunk(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	const uint32_t n = 2300;
	struct te_request *r = g_new(struct te_request, n);
	te_batch_id id;
	struct te_batch_info st;

	fake_reset();
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, wbuf, sizeof(wbuf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	wbuf_byte_writes(r, n);
	g_assert_cmpint(te_batch_new(te, n, &id), ==, TE_OK);
	g_assert_cmpint(te_batch_submit(te, id, r, n), ==, TE_OK);
	g_assert_cmpint(te_batch_wait(te, id, 10000000000ll), ==, TE_OK);
	g_assert_cmpint(te_batch_status(te, id, &st), ==, TE_OK);
	g_assert_cmpint(st.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(st.completed, ==, n);
	g_assert_cmpuint(st.bytes, ==, n);
	g_assert_cmpuint(atomic_load(&fake.submitted), ==, n);
	g_assert_cmpuint(atomic_load(&fake.max_n), ==, 1024);
	g_assert_cmpuint(atomic_load(&fake.submit_calls), ==, 3);
	g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
	g_free(r);
	te_engine_free(te);
}

/*
 * The cache holds at most BATCH_CACHE_MAX_BYTES: of two freed batches whose task arrays are
 * each just over half of it, the first is kept and the second freed, its handle and count
 * given back all the same.
 */
static void test_cache_bytes(void)
{
	uint32_t half = (uint32_t)(BATCH_CACHE_MAX_BYTES / sizeof(struct task) / 2 + 1);
	g_autofree char *transfer = g_strdup_printf("max_batch_size: %" PRIu32, half);
	struct te_engine *te = itest_engine1("A", "loopback", NULL, transfer);
	struct engine *e = fake_engine(te);
	te_batch_id a, b, again;
	struct batch *kept, *got;

	g_assert_cmpint(te_batch_new(te, half, &a), ==, TE_OK);
	g_assert_cmpint(te_batch_new(te, half, &b), ==, TE_OK);
	g_assert_cmpint(batch_get(e, a, &kept), ==, TE_OK);
	batch_unref(kept);
	g_assert_cmpint(te_batch_free(te, a), ==, TE_OK);
	g_assert_cmpuint(e->n_cached, ==, 1);
	g_assert_cmpuint(e->cache_bytes, ==, (size_t)half * sizeof(struct task));
	g_assert_cmpint(te_batch_free(te, b), ==, TE_OK);
	g_assert_cmpuint(e->n_cached, ==, 1);
	g_assert_cmpuint(e->cache_bytes, ==, (size_t)half * sizeof(struct task));
	g_assert_true(e->cache == kept);
	g_assert_cmpuint(atomic_load(&e->live_batches), ==, 0);
	g_assert_cmpint(te_batch_new(te, half, &again), ==, TE_OK);
	g_assert_cmpint(batch_get(e, again, &got), ==, TE_OK);
	batch_unref(got);
	g_assert_true(got == kept);
	g_assert_cmpuint(e->cache_bytes, ==, 0);
	g_assert_cmpint(te_batch_free(te, again), ==, TE_OK);
	te_engine_free(te);
}

/* Engine teardown with slices a transport still holds: canceled, handed back, freed. */
static void test_teardown_held(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	struct te_request r = half_write();
	struct te_batch_info info;
	te_batch_id id;

	fake_reset();
	fake.hold = true;
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, wbuf, sizeof(wbuf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	g_assert_cmpint(te_batch_new(te, 4, &id), ==, TE_OK);
	g_assert_cmpint(te_batch_submit(te, id, &r, 1), ==, TE_OK);
	g_assert_cmpuint(fake.n_held, >, 0);
	g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
	g_assert_cmpint(info.state, ==, TE_STATE_PENDING);
	g_assert_cmpint(te_batch_free(te, id), ==, TE_ERR_BUSY);
	/* Not freed by the user either: teardown cancels (the fake hands back) and frees. */
	te_engine_free(te);
	g_assert_cmpuint(fake.n_held, ==, 0);
	g_assert_cmpuint(atomic_load(&fake.cancels), >, 0);
}

/* Hybrid progress: what the fake's progress and drive ops saw. */
static struct {
	_Atomic uint32_t progress_calls, drive_calls, drive_bad;
	_Atomic uint32_t driving;
	GThread *progress_thread, *drive_thread;
} hy;

static uint32_t hybrid_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	uint32_t n;

	(void)inst;
	atomic_fetch_add(&hy.progress_calls, 1);
	hy.progress_thread = g_thread_self();
	/* Only between drive(1) and drive(0). */
	if (!atomic_load(&hy.driving))
		atomic_fetch_add(&hy.drive_bad, 1);
	g_mutex_lock(&fake.lock);
	n = MIN(fake.n_held, budget);
	g_mutex_unlock(&fake.lock);
	fake_complete_held(TE_OK);
	return n;
}

static void hybrid_drive(struct te_plugin_inst *inst, uint32_t driving)
{
	(void)inst;
	atomic_fetch_add(&hy.drive_calls, 1);
	hy.drive_thread = g_thread_self();
	/* Calls alternate 1, 0, 1, 0. */
	if (atomic_exchange(&hy.driving, driving) == driving)
		atomic_fetch_add(&hy.drive_bad, 1);
}

/*
 * A hybrid transport (AUTO with TE_PLUGIN_CAP_HYBRID_PROGRESS): the core's workers never poll
 * it; te_batch_wait polls it through progress() between drive(1) and drive(0), on the
 * waiting thread, and the completions it reaps end the batch.
 */
static void test_wait_hybrid(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	struct transport *tp = e->tps[0];
	static char buf[1 << 16];
	struct te_request r[2] = {
		{ TE_OP_WRITE, TE_SEGMENT_LOCAL, buf, (uintptr_t)(buf + sizeof(buf) / 2), 4096 },
		{ TE_OP_READ, TE_SEGMENT_LOCAL, buf + 4096, (uintptr_t)(buf + sizeof(buf) / 2),
		  4096 },
	};
	struct te_batch_info info;
	te_batch_id id;

	memset(&hy, 0, sizeof(hy));
	fake_reset();
	fake.hold = true;
	fake_take_over(tp);
	/* What transport_start makes of such caps (a MULTI plugin with the progress op). */
	tp->hybrid = true;
	tp->polled = true;
	tp->plugin->ops.progress = hybrid_progress;
	tp->plugin->ops.drive = hybrid_drive;
	g_assert_cmpint(te_mem_register(te, buf, sizeof(buf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	for (int round = 0; round < 3; round++) {
		g_assert_cmpint(te_batch_new(te, 2, &id), ==, TE_OK);
		g_assert_cmpint(te_batch_submit(te, id, r, 2), ==, TE_OK);
		g_assert_cmpint(atomic_load(&tp->in_flight), ==, 2);
		/* Nobody waits: the worker leaves the slices to the plugin's own threads. */
		g_usleep(20000);
		g_assert_cmpuint(atomic_load(&hy.progress_calls), ==, 0);
		g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
		g_assert_cmpint(info.state, ==, TE_STATE_PENDING);
		/* The waiter polls them itself, bracketed by drive(1) and drive(0). */
		g_assert_cmpint(te_batch_wait(te, id, 5000000000ll), ==, TE_OK);
		g_assert_cmpuint(atomic_load(&hy.progress_calls), >, 0);
		g_assert_true(hy.progress_thread == g_thread_self());
		g_assert_true(hy.drive_thread == g_thread_self());
		g_assert_cmpuint(atomic_load(&hy.drive_calls), ==, 2 * (round + 1));
		g_assert_cmpuint(atomic_load(&hy.driving), ==, 0);
		g_assert_cmpuint(atomic_load(&hy.drive_bad), ==, 0);
		g_assert_cmpint(atomic_load(&tp->in_flight), ==, 0);
		g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
		g_assert_cmpint(info.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpuint(info.completed, ==, 2);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
		atomic_store(&hy.progress_calls, 0);
	}
	te_engine_free(te);
}

/* A plugin thread completes the batch while te_batch_wait watches for it, then sleeps. */
static gpointer complete_later(gpointer data)
{
	g_usleep(GPOINTER_TO_UINT(data));
	fake_complete_held(TE_OK);
	return NULL;
}

static void test_wait_auto(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	static char buf[1 << 16];
	struct te_request r = { TE_OP_WRITE, TE_SEGMENT_LOCAL, buf,
				(uintptr_t)(buf + sizeof(buf) / 2), 4096 };
	/* Within the watch before sleeping, after it, and with nothing done by the deadline. */
	static const unsigned delays_us[] = { 0, 5, 20000 };

	fake_reset();
	fake.hold = true;
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, buf, sizeof(buf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	for (size_t i = 0; i < G_N_ELEMENTS(delays_us); i++) {
		struct te_batch_info info;
		te_batch_id id;
		GThread *t;

		g_assert_cmpint(te_batch_new(te, 1, &id), ==, TE_OK);
		g_assert_cmpint(te_batch_submit(te, id, &r, 1), ==, TE_OK);
		t = g_thread_new("complete", complete_later, GUINT_TO_POINTER(delays_us[i]));
		g_assert_cmpint(te_batch_wait(te, id, 10000000000ll), ==, TE_OK);
		g_thread_join(t);
		g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
		g_assert_cmpint(info.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
	}
	/* Nothing completes: the wait ends at its deadline, TE_INPROGRESS, the batch intact. */
	{
		te_batch_id id;

		g_assert_cmpint(te_batch_new(te, 1, &id), ==, TE_OK);
		g_assert_cmpint(te_batch_submit(te, id, &r, 1), ==, TE_OK);
		g_assert_cmpint(te_batch_wait(te, id, 1000000), ==, TE_INPROGRESS);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_ERR_BUSY);
		fake_complete_held(TE_OK);
		g_assert_cmpint(te_batch_wait(te, id, 0), ==, TE_OK);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
	}
	te_engine_free(te);
}

/*
 * te_batch_status while another thread ends the tasks: every answer is one state of the
 * batch, never a terminal state with fewer tasks counted as ended (the efa progress-modes
 * test once saw "COMPLETED with 7 of 8 completed": the counts and the state came from two
 * reads, with the last task ending in between).
 */
static void test_status_consistent(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	static char buf[1 << 16];
	struct te_request r[256];
	uint32_t terminal_seen = 0;

	fake_reset();
	fake.hold = true;
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, buf, sizeof(buf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	for (uint32_t i = 0; i < G_N_ELEMENTS(r); i++)
		r[i] = (struct te_request){ TE_OP_WRITE, TE_SEGMENT_LOCAL, buf + 64 * i,
					    (uintptr_t)(buf + sizeof(buf) / 2 + 64 * i), 64 };
	for (int round = 0; round < 200; round++) {
		struct te_batch_info info;
		te_batch_id id;
		GThread *t;

		g_assert_cmpint(te_batch_new(te, G_N_ELEMENTS(r), &id), ==, TE_OK);
		g_assert_cmpint(te_batch_submit(te, id, r, G_N_ELEMENTS(r)), ==, TE_OK);
		t = g_thread_new("complete", complete_later, GUINT_TO_POINTER(0));
		do {
			g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
			g_assert_cmpuint(info.tasks, ==, G_N_ELEMENTS(r));
			g_assert_cmpuint(info.failed + info.timed_out + info.canceled, ==, 0);
			if (te_state_is_terminal(info.state)) {
				g_assert_cmpint(info.state, ==, TE_STATE_COMPLETED);
				g_assert_cmpuint(info.completed, ==, info.tasks);
			} else {
				g_assert_cmpuint(info.completed, <, info.tasks);
			}
		} while (!te_state_is_terminal(info.state));
		terminal_seen++;
		g_thread_join(t);
		g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
	}
	g_assert_cmpuint(terminal_seen, ==, 200);
	te_engine_free(te);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/batch/handles", test_handles);
	g_test_add_func("/batch/cache", test_cache);
	g_test_add_func("/batch/cache-busy", test_cache_busy);
	g_test_add_func("/batch/cache-large", test_cache_large);
	g_test_add_func("/batch/cache-bytes", test_cache_bytes);
	g_test_add_func("/batch/submit-chunk", test_submit_chunk);
	g_test_add_func("/batch/teardown-held", test_teardown_held);
	g_test_add_func("/batch/wait-hybrid", test_wait_hybrid);
	g_test_add_func("/batch/wait-auto", test_wait_auto);
	g_test_add_func("/batch/status-consistent", test_status_consistent);
	return g_test_run();
}
