/* SPDX-License-Identifier: Apache-2.0 */
/*
 * progress_test.c: te_batch_wait polls a per-thread hybrid transport, at most max_pollers,
 * and none while more threads wait than that (crowded).
 */
#include <string.h>

#include <glib.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/progress.h"
#include "fake.h"
#include "itest.h"

#define N_WAITERS 4
#define PT_MAX_HELD 512
/* A slice nobody polled for this long is completed by the plugin's own thread. */
#define PT_LATE_US 10000

/*
 * A per-thread hybrid plugin (TE_PLUGIN_CAP_HYBRID_PER_THREAD) over the fake: progress()
 * completes the calling thread's own slices, after holding for 1 ms so that concurrent
 * pollers overlap in it; its thread completes those nobody polled for PT_LATE_US (the
 * waiters left to wait as for an AUTO plugin).
 */
static struct {
	GMutex lock;
	struct {
		struct te_plugin_slice *s;
		GThread *owner;
		gint64 at_us;
	} held[PT_MAX_HELD];
	uint32_t n_held;
	_Atomic uint32_t in_progress, peak, progress_calls, late;
	_Atomic bool stop;
	struct transport *tp;
} pt;

static void pt_done(struct te_plugin_slice *s, enum te_status st)
{
	host_services.slice_done((struct te_plugin_host_ctx *)pt.tp, s, st,
				 st == TE_OK ? s->length : 0, st == TE_OK ? NULL : "pt: canceled");
}

/*
 * Complete up to @budget held slices of @owner (NULL: anyone's held since before @before_us,
 * counted in pt.late).
 */
static uint32_t pt_complete(GThread *owner, gint64 before_us, uint32_t budget)
{
	struct te_plugin_slice *done[PT_MAX_HELD];
	uint32_t n = 0;

	g_mutex_lock(&pt.lock);
	for (uint32_t i = 0; i < pt.n_held && n < budget;) {
		if (owner ? pt.held[i].owner == owner : pt.held[i].at_us < before_us) {
			done[n++] = pt.held[i].s;
			pt.held[i] = pt.held[--pt.n_held];
		} else {
			i++;
		}
	}
	g_mutex_unlock(&pt.lock);
	/* Counted before they end: a waiter that sees its batch end sees them counted. */
	if (!owner)
		atomic_fetch_add(&pt.late, n);
	for (uint32_t i = 0; i < n; i++)
		pt_done(done[i], TE_OK);
	return n;
}

static enum te_status pt_submit(struct te_plugin_inst *inst, struct te_plugin_slice **ps,
				uint32_t n, uint32_t *accepted_out)
{
	gint64 now = g_get_monotonic_time();

	(void)inst;
	g_mutex_lock(&pt.lock);
	g_assert_cmpuint(pt.n_held + n, <=, PT_MAX_HELD);
	for (uint32_t i = 0; i < n; i++) {
		pt.held[pt.n_held].s = ps[i];
		pt.held[pt.n_held].owner = g_thread_self();
		pt.held[pt.n_held].at_us = now;
		pt.n_held++;
	}
	g_mutex_unlock(&pt.lock);
	*accepted_out = n;
	return TE_OK;
}

static uint32_t pt_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	uint32_t in = atomic_fetch_add(&pt.in_progress, 1) + 1;
	uint32_t peak = atomic_load(&pt.peak);
	uint32_t n;

	(void)inst;
	while (in > peak && !atomic_compare_exchange_weak(&pt.peak, &peak, in))
		;
	atomic_fetch_add(&pt.progress_calls, 1);
	g_usleep(1000);
	n = pt_complete(g_thread_self(), 0, budget);
	atomic_fetch_sub(&pt.in_progress, 1);
	return n;
}

static enum te_status pt_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	bool found = false;

	(void)inst;
	g_mutex_lock(&pt.lock);
	for (uint32_t i = 0; i < pt.n_held; i++) {
		if (pt.held[i].s == slice) {
			pt.held[i] = pt.held[--pt.n_held];
			found = true;
			break;
		}
	}
	g_mutex_unlock(&pt.lock);
	if (found)
		pt_done(slice, TE_ERR_CANCELED);
	return TE_OK;
}

/* The plugin's own thread: serves the slices no waiter polls. */
static gpointer pt_thread(gpointer data)
{
	(void)data;
	while (!atomic_load(&pt.stop)) {
		g_usleep(1000);
		pt_complete(NULL, g_get_monotonic_time() - PT_LATE_US, UINT32_MAX);
	}
	return NULL;
}

static char pt_buf[N_WAITERS][16384];

/* An engine whose transport is the per-thread hybrid plugin above. */
static struct te_engine *pt_engine(const char *transfer, GThread **thread_out)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, transfer);
	struct engine *e = fake_engine(te);
	struct transport *tp = e->tps[0];

	g_mutex_lock(&pt.lock);
	pt.n_held = 0;
	g_mutex_unlock(&pt.lock);
	atomic_store(&pt.stop, false);
	atomic_store(&pt.late, 0);
	pt.tp = tp;
	fake_reset();
	fake_take_over(tp);
	/* What transport_start makes of a MULTI plugin with both caps and the progress op. */
	tp->hybrid = true;
	tp->polled = true;
	tp->per_thread = true;
	tp->plugin->ops.submit = pt_submit;
	tp->plugin->ops.cancel = pt_cancel;
	tp->plugin->ops.progress = pt_progress;
	/* An AUTO plugin and no MANUAL one: every waiter may poll, up to max_pollers. */
	g_assert_false(e->has_manual);
	g_assert_true(e->per_thread);
	g_assert_cmpint(te_mem_register(te, pt_buf, sizeof(pt_buf), "cpu", TE_MEM_REMOTE), ==,
			TE_OK);
	*thread_out = g_thread_new("pt", pt_thread, NULL);
	return te;
}

static void pt_engine_free(struct te_engine *te, GThread *thread)
{
	atomic_store(&pt.stop, true);
	g_thread_join(thread);
	g_assert_cmpuint(pt.n_held, ==, 0);
	te_engine_free(te);
}

struct waiter {
	struct te_engine *te;
	unsigned idx;
	enum te_status st_new, st_submit, st_wait, st_status, st_free;
	struct te_batch_info info;
};

static _Atomic uint32_t gate;

static gpointer waiter_run(gpointer data)
{
	struct waiter *w = data;
	char *buf = pt_buf[w->idx];
	struct te_request r[2] = {
		{ TE_OP_WRITE, TE_SEGMENT_LOCAL, buf, (uintptr_t)(buf + 8192), 4096 },
		{ TE_OP_READ, TE_SEGMENT_LOCAL, buf + 4096, (uintptr_t)(buf + 12288), 4096 },
	};
	te_batch_id id;

	/* All submit and wait at once. */
	atomic_fetch_add(&gate, 1);
	while (atomic_load(&gate) < N_WAITERS)
		g_thread_yield();
	w->st_new = te_batch_new(w->te, 2, &id);
	if (w->st_new != TE_OK)
		return NULL;
	w->st_submit = te_batch_submit(w->te, id, r, 2);
	w->st_wait = te_batch_wait(w->te, id, 10000000000ll);
	w->st_status = te_batch_status(w->te, id, &w->info);
	w->st_free = te_batch_free(w->te, id);
	return NULL;
}

static void waiter_check(const struct waiter *w)
{
	g_assert_cmpint(w->st_new, ==, TE_OK);
	g_assert_cmpint(w->st_submit, ==, TE_OK);
	g_assert_cmpint(w->st_wait, ==, TE_OK);
	g_assert_cmpint(w->st_status, ==, TE_OK);
	g_assert_cmpint(w->info.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(w->info.completed, ==, 2);
	g_assert_cmpint(w->st_free, ==, TE_OK);
}

/*
 * N_WAITERS threads each submit a batch and wait for it; returns the most in progress() at
 * once (pt.progress_calls: how often it was called).
 */
static uint32_t pt_round(struct te_engine *te)
{
	struct waiter w[N_WAITERS];
	GThread *t[N_WAITERS];

	atomic_store(&pt.peak, 0);
	atomic_store(&pt.progress_calls, 0);
	atomic_store(&gate, 0);
	memset(w, 0, sizeof(w));
	for (unsigned i = 0; i < N_WAITERS; i++) {
		w[i].te = te;
		w[i].idx = i;
		t[i] = g_thread_new("waiter", waiter_run, &w[i]);
	}
	for (unsigned i = 0; i < N_WAITERS; i++) {
		g_thread_join(t[i]);
		waiter_check(&w[i]);
	}
	g_assert_cmpint(atomic_load(&pt.in_progress), ==, 0);
	return atomic_load(&pt.peak);
}

/*
 * One batch of @n READs of 16 bytes (at most 512), submitted and waited for by this thread
 * alone; it must complete. Returns progress() calls.
 */
static uint32_t pt_alone(struct te_engine *te, uint32_t n)
{
	struct te_request r[512];
	struct te_batch_info info;
	te_batch_id id;

	g_assert_cmpuint(n, <=, G_N_ELEMENTS(r));
	for (uint32_t i = 0; i < n; i++)
		r[i] = (struct te_request){ TE_OP_READ, TE_SEGMENT_LOCAL, pt_buf[1] + 16 * i,
					    (uintptr_t)(pt_buf[2] + 16 * i), 16 };
	atomic_store(&pt.progress_calls, 0);
	g_assert_cmpint(te_batch_new(te, n, &id), ==, TE_OK);
	g_assert_cmpint(te_batch_submit(te, id, r, n), ==, TE_OK);
	g_assert_cmpint(te_batch_wait(te, id, 10000000000ll), ==, TE_OK);
	g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
	g_assert_cmpint(info.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(info.completed, ==, n);
	g_assert_cmpint(te_batch_free(te, id), ==, TE_OK);
	return atomic_load(&pt.progress_calls);
}

/* The default: half the CPUs, at least one. */
static void test_max_pollers_default(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);

	g_assert_cmpuint(fake_engine(te)->max_pollers, ==, MAX(1u, g_get_num_processors() / 2u));
	te_engine_free(te);
	te = itest_engine1("A", "loopback", NULL, "max_pollers: 0");
	g_assert_cmpuint(fake_engine(te)->max_pollers, ==, MAX(1u, g_get_num_processors() / 2u));
	te_engine_free(te);
}

/*
 * max_pollers: 1: never more than one waiter polls at a time, the others' slices end all
 * the same. With the waiters meeting, none polls (test_crowded); with no hold after a crowd,
 * the first of a round may poll until the others come.
 */
static void test_max_pollers_one(void)
{
	GThread *thread;
	struct te_engine *te = pt_engine("max_pollers: 1", &thread);

	g_assert_cmpuint(fake_engine(te)->max_pollers, ==, 1);
	fake_engine(te)->crowded_hold_ns = 0;
	/*
	 * Until some waiters were left to the plugin's thread (the rounds where the waiters
	 * came one after another show nothing).
	 */
	for (int round = 0; round < 20 && (round < 5 || !atomic_load(&pt.late)); round++)
		g_assert_cmpuint(pt_round(te), <=, 1);
	g_assert_cmpuint(atomic_load(&pt.late), >, 0);
	pt_engine_free(te, thread);
}

/* max_pollers: 4: the waiters poll at once (in some round: they must meet in progress()). */
static void test_max_pollers_four(void)
{
	GThread *thread;
	struct te_engine *te = pt_engine("max_pollers: 4", &thread);
	uint32_t peak = 0;

	g_assert_cmpuint(fake_engine(te)->max_pollers, ==, 4);
	for (int round = 0; round < 20 && peak < 2; round++) {
		peak = pt_round(te);
		g_test_message("round %d: at most %u waiters in progress() at once", round, peak);
		/* 4 waiters, 4 pollers allowed: not crowded, someone polled. */
		g_assert_cmpuint(atomic_load(&pt.progress_calls), >, 0);
	}
	g_assert_cmpuint(peak, >=, 2);
	g_assert_cmpuint(peak, <=, N_WAITERS);
	pt_engine_free(te, thread);
}

/*
 * More threads wait than may poll (max_pollers: 1, 4 waiters): none polls while they do, nor
 * for crowded_hold_ns after; their slices end all the same (the plugin's thread). A lone
 * waiter polls before the crowd and once the hold lapsed; in the hold, not even with a long
 * batch.
 */
static void test_crowded(void)
{
	GThread *thread;
	struct te_engine *te = pt_engine("max_pollers: 1", &thread);
	struct engine *e = fake_engine(te);
	uint32_t late;

	g_assert_cmpuint(e->crowded_hold_ns, ==, PROGRESS_CROWDED_HOLD_NS);
	e->crowded_hold_ns = 3600ull * 1000 * 1000 * 1000; /* lapses only when the test says */
	g_assert_cmpuint(pt_alone(te, 2), >, 0);
	g_assert_cmpuint(atomic_load(&pt.late), ==, 0);
	/* Until the waiters met (they came one after another: no crowd, possible, rare). */
	for (int round = 0; round < 20 && atomic_load(&e->crowded_until_ns) <= engine_now_ns();
	     round++)
		pt_round(te);
	g_assert_cmpuint(atomic_load(&e->crowded_until_ns), >, engine_now_ns());
	/* Crowded: nobody polls, the plugin's thread ends every slice. */
	late = atomic_load(&pt.late);
	g_assert_cmpuint(pt_round(te), ==, 0);
	g_assert_cmpuint(atomic_load(&pt.progress_calls), ==, 0);
	g_assert_cmpuint(atomic_load(&pt.late), ==, late + 2 * N_WAITERS);
	/* Within the hold, alone: it does not poll either. */
	late = atomic_load(&pt.late);
	g_assert_cmpuint(pt_alone(te, 2), ==, 0);
	g_assert_cmpuint(atomic_load(&pt.late), ==, late + 2);
	/* Nor with a long batch (256 tasks or more polled in the hold until 2026-12-06). */
	late = atomic_load(&pt.late);
	g_assert_cmpuint(pt_alone(te, 512), ==, 0);
	g_assert_cmpuint(atomic_load(&pt.late), ==, late + 512);
	g_assert_cmpuint(atomic_load(&e->crowded_until_ns), >, engine_now_ns());
	/* The hold lapsed: it polls again. */
	atomic_store(&e->crowded_until_ns, 0);
	g_assert_cmpuint(pt_alone(te, 2), >, 0);
	g_assert_cmpuint(atomic_load(&e->waiters), ==, 0);
	pt_engine_free(te, thread);
}

/* An out-of-range max_pollers fails te_engine_new with the key's place in the file. */
static void test_max_pollers_invalid(void)
{
	static const char *const bad[] = { "-1", "2000" };

	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *yaml = g_strdup_printf(
			"engine: {name: A}\ntransfer:\n  max_pollers: %s\n", bad[i]);
		g_autofree char *want = g_strdup_printf(
			"node.yaml:3:16: transfer.max_pollers: value %s out of range 0..1024",
			bad[i]);
		struct te_engine_opts o = { .size = sizeof(o),
					    .config_yaml = yaml,
					    .config_yaml_len = strlen(yaml),
					    .config_name = "node.yaml",
					    .log_level = -1 };
		struct te_engine *te = (struct te_engine *)(uintptr_t)0x1;

		g_assert_cmpint(te_engine_new(&o, &te), ==, TE_ERR_CONFIG);
		/* Outputs are untouched on failure. */
		g_assert_true(te == (struct te_engine *)(uintptr_t)0x1);
		g_assert_cmpstr(te_last_error(), ==, want);
	}
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/progress/max-pollers/default", test_max_pollers_default);
	g_test_add_func("/progress/max-pollers/one", test_max_pollers_one);
	g_test_add_func("/progress/max-pollers/four", test_max_pollers_four);
	g_test_add_func("/progress/max-pollers/crowded", test_crowded);
	g_test_add_func("/progress/max-pollers/invalid", test_max_pollers_invalid);
	return g_test_run();
}
