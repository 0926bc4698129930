/* SPDX-License-Identifier: Apache-2.0 */
/* progress.c: the worker threads, manual progress, and te_batch_wait driving it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/progress.h"
#include "core/retry.h"
#include "core/slice.h"
#include "core/transport.h"
#include "core/wake.h"

/* te_batch_wait keeps polling manual transports this long after their last completion */
#define BATCH_WAIT_SPIN_NS (2ull * 1000 * 1000)
/* ... back to back for this long, then blocking in a plugin's wait op between polls */
#define BATCH_WAIT_BUSY_NS (20ull * 1000)
/* ... at most this long at a time */
#define BATCH_WAIT_BLOCK_NS (500ull * 1000)
/* ... reading the clock once per this many empty polls */
#define BATCH_WAIT_IDLE_POLLS 4
/*
 * A batch on AUTO transports: te_batch_wait checks for its end this long before sleeping on
 * the batch's condition (one 4K READ at a time over tcp on loopback, 2 vCPUs: p50 36 us
 * against 38-40 us sleeping at once; unbounded spinning did no better).
 */
#define BATCH_WAIT_AUTO_SPIN_NS (30ull * 1000)

static inline void progress_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/*
 * A batch whose completions come from plugin threads: watch for its end until @until before
 * sleeping on its condition. A futex wake and the sleeper's way back onto a CPU cost more
 * than a short batch takes (one 4K READ over tcp on loopback). Pausing between checks; the
 * clock is read, and the CPU yielded to a plugin thread queued on it, every 64 checks (a
 * few microseconds).
 */
static void batch_wait_spin(struct batch *b, uint64_t until)
{
	unsigned n = 0;

	while (!batch_is_terminal(b)) {
		if ((++n & 63) == 0) {
			if (engine_now_ns() >= until)
				return;
			g_thread_yield();
		}
		progress_cpu_relax();
	}
}


/*
 * Whether a manual-progress transport has slices in flight; for te_batch_wait's poller
 * (@waiter) a hybrid one too (TE_PLUGIN_CAP_HYBRID_PROGRESS: only waiters poll it). Relaxed,
 * like the callers.
 */
static bool progress_manual_in_flight(struct engine *e, bool waiter)
{
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if ((tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL || (waiter && tp->hybrid)) &&
		    atomic_load_explicit(&tp->in_flight, memory_order_relaxed) > 0)
			return true;
	}
	return false;
}

/* Whether the engine has a hybrid-progress transport (te_batch_wait polls it). */
static bool progress_has_hybrid(struct engine *e)
{
	for (unsigned i = 0; i < e->n_tps; i++)
		if (e->tps[i]->hybrid)
			return true;
	return false;
}

/*
 * Nothing to reap: block in the manual (or hybrid) transport with slices in flight (ops.wait)
 * for at most @timeout_ns when it is the only one and can; else yield the CPU. A serialized
 * plugin is never blocked in: its call lock would stall every submitter meanwhile. Only
 * te_batch_wait's poller calls it. Returns false when a per-thread hybrid plugin has nothing
 * this thread can poll (TE_ERR_NOT_FOUND): its threads do the rest, polling stops.
 */
static bool progress_manual_wait(struct engine *e, uint64_t timeout_ns)
{
	struct transport *only = NULL;
	enum te_status st;

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (!tp->polled || !atomic_load_explicit(&tp->in_flight, memory_order_relaxed))
			continue;
		if (only || tp->serialized) {
			only = NULL;
			break;
		}
		only = tp;
	}
	st = only ? transport_wait(only, timeout_ns) : TE_ERR_UNSUPPORTED;
	if (st == TE_ERR_NOT_FOUND && only->per_thread)
		return false;
	if (st == TE_ERR_UNSUPPORTED)
		g_thread_yield();
	return true;
}

unsigned progress_once(struct engine *e, bool from_worker)
{
	unsigned work = 0;
	/* Relaxed: a stale view only costs one redundant or skipped poll. */
	bool skip_manual = from_worker && wake_user_driving(e, engine_now_ns());

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];
		/* Workers poll MANUAL transports; a waiter hybrid ones too. */
		bool poll = from_worker
				    ? !skip_manual && tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL
				    : tp->polled;

		if (poll && atomic_load_explicit(&tp->in_flight, memory_order_relaxed) > 0) {
			slice_progress_begin(tp);
			work += transport_progress(tp, 256);
			slice_progress_end();
		}
		work += slice_drain_backlog(e, tp);
	}
	return work;
}

/* Retries whose time has come, resubmitted outside the retry queue's lock. */
static unsigned progress_run_retries(struct engine *e, uint64_t now, uint64_t *next_out)
{
	struct slice *due = retry_take_due(e, now, next_out);
	unsigned n = 0;

	while (due) {
		struct slice *s = due;

		due = s->next;
		s->next = NULL;
		slice_retry(e, s);
		n++;
	}
	return n;
}

/* Work the worker must poll for: backlogs, and manual progress nobody else drives. */
static bool progress_has_pending_io(struct engine *e)
{
	bool drivers = wake_user_driving(e, engine_now_ns());

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (atomic_load(&tp->backlog_len))
			return true;
		if (!drivers && tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
		    atomic_load(&tp->in_flight))
			return true;
	}
	return false;
}

static gpointer progress_worker(gpointer data)
{
	struct engine *e = data;
	unsigned idle = 0;

	while (!atomic_load(&e->stopping)) {
		uint64_t now, next_retry, wake;
		unsigned work;

		work = progress_once(e, true);
		now = engine_now_ns();
		work += progress_run_retries(e, now, &next_retry);
		work += retry_check_deadlines(e, now);
		work += control_send_notifies(e);
		if (work) {
			idle = 0;
			continue;
		}
		if (progress_has_pending_io(e) && ++idle < 32) {
			/* Manual transports in flight: poll, yielding the core between tries. */
			g_thread_yield();
			continue;
		}
		wake = MIN(next_retry, retry_next_deadline(e));
		if (progress_has_pending_io(e))
			wake = MIN(wake, now + 50000); /* keep manual progress going at 50 us */
		else if (!atomic_load(&e->drivers) && progress_manual_in_flight(e, false))
			/* te_batch_wait drove them and returned: take over when that lapses. */
			wake = MIN(wake, MAX(now, atomic_load_explicit(&e->last_drive_ns,
								       memory_order_relaxed) +
							  WAKE_DRIVE_NS));
		wake = MIN(wake, now + 100000000ull);
		g_mutex_lock(&e->work_lock);
		atomic_store(&e->sleeping, progress_has_pending_io(e) ? 1 : 2);
		if (!atomic_load(&e->stopping) &&
		    (atomic_load(&e->sleeping) == 1 || !progress_has_pending_io(e)) &&
		    !retry_due_locked(e, now))
			g_cond_wait_until(&e->work_cond, &e->work_lock,
					  g_get_monotonic_time() + (gint64)((wake - now) / 1000) +
						  1);
		atomic_store(&e->sleeping, 0);
		g_mutex_unlock(&e->work_lock);
		idle = 0;
	}
	return NULL;
}

/*
 * Extra workers (transfer.worker_threads > 1) only drive manual-progress
 * transports and backlogs, so several manual plugins (or one with independent
 * queues) progress in parallel; retries, deadlines and notifies stay on worker 0.
 */
static gpointer progress_extra_worker(gpointer data)
{
	struct engine *e = data;

	while (!atomic_load(&e->stopping)) {
		if (progress_once(e, true))
			continue;
		if (progress_has_pending_io(e)) {
			g_thread_yield();
			g_usleep(20);
			continue;
		}
		g_mutex_lock(&e->work_lock);
		if (!atomic_load(&e->stopping))
			g_cond_wait_until(&e->work_cond, &e->work_lock,
					  g_get_monotonic_time() + 10000);
		g_mutex_unlock(&e->work_lock);
	}
	return NULL;
}

static void progress_mark_crowded(struct engine *e, uint64_t now)
{
	atomic_store_explicit(&e->crowded_until_ns, now + e->crowded_hold_ns, memory_order_relaxed);
}

/*
 * Whether more threads wait than may poll a per-thread hybrid transport (engine.h: waiters),
 * now or within crowded_hold_ns: then none polls. Each poller takes a CPU while it waits;
 * with more waiters than pollers, the others' work goes through the plugins' threads anyway,
 * which need those CPUs, as do the peers on the same host. Relaxed: a hint.
 */
static bool progress_crowded(struct engine *e, uint64_t now)
{
	if (atomic_load_explicit(&e->waiters, memory_order_relaxed) > e->max_pollers) {
		progress_mark_crowded(e, now);
		return true;
	}
	return now < atomic_load_explicit(&e->crowded_until_ns, memory_order_relaxed);
}

/*
 * Poll manual-progress transports for @b as the engine's one polling waiter (or hybrid ones
 * as one of at most max_pollers): while
 * completions keep coming (within BATCH_WAIT_SPIN_NS of the last one, or of @start, when
 * this wait began; providers like libfabric's tcp move data only while polled): back to
 * back for BATCH_WAIT_BUSY_NS after a completion, then sleeping in the plugin's wait op
 * (or yielding the CPU) between empty polls. Returns when @b is terminal or when it is
 * time to sleep (nothing completed lately: a dead or frozen peer; or @end passed; or,
 * @crowdable, the engine is crowded).
 */
static void batch_wait_poll(struct engine *e, struct batch *b, uint64_t start, uint64_t end,
			    bool crowdable)
{
	unsigned idle = 0;
	bool worked = false;

	while (!batch_is_terminal(b)) {
		uint64_t now, quiet;

		if (progress_once(e, false)) {
			idle = 0;
			worked = true;
			continue;
		}
		if (++idle < BATCH_WAIT_IDLE_POLLS)
			continue;
		idle = 0;
		now = engine_now_ns();
		/* No clock read per completion: the last one was at most a few polls ago. */
		if (worked) {
			atomic_store_explicit(&e->manual_work_ns, now, memory_order_relaxed);
			worked = false;
		}
		/* Since the last completion, or since this wait began. */
		quiet = now -
			MAX(start, atomic_load_explicit(&e->manual_work_ns, memory_order_relaxed));
		if (now >= end || quiet >= BATCH_WAIT_SPIN_NS ||
		    !progress_manual_in_flight(e, true))
			return;
		/* More waiters came meanwhile: leave them all to the plugins' threads. */
		if (crowdable && progress_crowded(e, now))
			return;
		/*
		 * A burst usually has more: poll back to back for a moment, as the raw provider
		 * loops do. Then sleep on the plugin's queues if it can, never past @end: a
		 * waiter polling an empty queue (libfabric's tcp: one epoll_wait per poll) takes
		 * the CPU and the socket locks from the peer that is sending.
		 */
		if (quiet >= BATCH_WAIT_BUSY_NS &&
		    !progress_manual_wait(e, MIN(BATCH_WAIT_BLOCK_NS, end - now)))
			return;
	}
}

/*
 * Hybrid transports with slices in flight: tell them a waiter polls them now (ops.drive), so
 * that their own threads keep away; returns which were told (bit i: e->tps[i]), for
 * batch_wait_undrive. Those past the 64th are polled without being told.
 */
static uint64_t batch_wait_drive(struct engine *e)
{
	uint64_t told = 0;

	for (unsigned i = 0; i < e->n_tps && i < 64; i++) {
		struct transport *tp = e->tps[i];

		if (tp->hybrid && atomic_load_explicit(&tp->in_flight, memory_order_relaxed) > 0) {
			transport_drive(tp, 1);
			told |= 1ull << i;
		}
	}
	return told;
}

static void batch_wait_undrive(struct engine *e, uint64_t told)
{
	for (unsigned i = 0; told && i < e->n_tps && i < 64; i++)
		if (told & (1ull << i))
			transport_drive(e->tps[i], 0);
}

/* Give up polling; wake the waiters standing by to take it over. */
static void batch_wait_unpoll(struct engine *e)
{
	atomic_store(&e->polling, false);
	batch_wake_any(e);
}

enum te_status progress_wait(struct engine *e, te_batch_id id, int64_t timeout_ns)
{
	uint64_t start = engine_now_ns();
	uint64_t end = timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
	struct batch *b;
	enum te_status st;
	bool spun = false, polls, per_thread;

	st = batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	/* Whether this thread may poll transports: MANUAL ones, or hybrid ones. */
	polls = e->has_manual || progress_has_hybrid(e);
	per_thread = polls && e->per_thread;
	if (e->has_manual)
		atomic_fetch_add(&e->drivers, 1);
	if (per_thread && atomic_fetch_add(&e->waiters, 1) + 1 > e->max_pollers)
		progress_mark_crowded(e, start);
	while (!batch_is_terminal(b)) {
		uint64_t now;

		/* Hybrid transports that serve each waiter's own work: poll alongside the others. */
		if (per_thread && !spun) {
			/*
			 * Polling burns a CPU while it waits: at most max_pollers at once, and
			 * none while more threads wait than that (progress_crowded), however long
			 * its batch (PROGRESS_CROWDED_HOLD_NS). The others wait as for AUTO
			 * transports (the plugins' threads serve them).
			 */
			if (atomic_fetch_add(&e->pollers, 1) < e->max_pollers &&
			    !progress_crowded(e, start)) {
				uint64_t told = batch_wait_drive(e);

				batch_wait_poll(e, b, start, end, true);
				batch_wait_undrive(e, told);
			}
			atomic_fetch_sub(&e->pollers, 1);
			if (batch_is_terminal(b))
				break;
			polls = false; /* quiet: the plugins' threads took over (sleep below) */
		}

		/*
		 * Drive manual-progress transports from the waiting thread, one waiter at a
		 * time: several threads polling one queue only take turns on its lock and on
		 * the CPUs the peers need. The others stand by until their batch ends (the
		 * poller reports it), the poller lets go, or 200 us pass.
		 */
		if (polls) {
			if (!atomic_load_explicit(&e->polling, memory_order_relaxed) &&
			    !atomic_exchange(&e->polling, true)) {
				uint64_t told = batch_wait_drive(e);

				batch_wait_poll(e, b, start, end, false);
				batch_wait_undrive(e, told);
				batch_wait_unpoll(e);
				if (batch_is_terminal(b))
					break;
			} else {
				now = engine_now_ns();
				if (now >= end)
					break;
				batch_wait_any(e, b,
					       g_get_monotonic_time() +
						       (gint64)MIN((end - now) / 1000, 200));
				continue;
			}
		}
		now = engine_now_ns();
		if (now >= end)
			break;
		if (!spun && !e->has_manual) {
			/* AUTO transports, or hybrid ones whose threads took over from the poll. */
			spun = true;
			batch_wait_spin(b, MIN(end, now + BATCH_WAIT_AUTO_SPIN_NS));
			continue;
		}
		{
			/* With manual transports, wake up soon to drive them again. */
			uint64_t until = e->has_manual ? MIN(end, now + 200000) : end;

			batch_wait_terminal(
				b, g_get_monotonic_time() +
					   (gint64)MIN((until - now) / 1000, (uint64_t)G_MAXINT32));
		}
	}
	if (per_thread)
		atomic_fetch_sub(&e->waiters, 1);
	if (e->has_manual) {
		atomic_store_explicit(&e->last_drive_ns, engine_now_ns(), memory_order_relaxed);
		atomic_fetch_sub(&e->drivers, 1);
	}
	if (!batch_is_terminal(b)) {
		batch_unref(b);
		return log_error(TE_INPROGRESS,
				 "te_batch_wait: batch not terminal after %" PRId64 " ns",
				 timeout_ns);
	}
	st = batch_result(b);
	batch_unref(b);
	return st;
}

bool progress_start(struct engine *e)
{
	const struct config *cfg = e->cfg;

	e->worker = g_thread_try_new("te-worker", progress_worker, e, NULL);
	if (e->worker && cfg->worker_threads > 1 && e->has_manual) {
		e->extra = g_new0(GThread *, cfg->worker_threads - 1);
		while (e->n_extra < cfg->worker_threads - 1) {
			GThread *t = g_thread_try_new("te-worker", progress_extra_worker, e, NULL);

			if (!t)
				break;
			e->extra[e->n_extra++] = t;
		}
	}
	return e->worker != NULL;
}

void progress_stop(struct engine *e)
{
	if (e->worker) {
		atomic_store(&e->stopping, true);
		g_mutex_lock(&e->work_lock);
		g_cond_broadcast(&e->work_cond);
		g_mutex_unlock(&e->work_lock);
		g_thread_join(e->worker);
		for (unsigned i = 0; i < e->n_extra; i++)
			g_thread_join(e->extra[i]);
		e->worker = NULL;
	}
	g_clear_pointer(&e->extra, g_free);
	e->n_extra = 0;
}
