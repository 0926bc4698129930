/* SPDX-License-Identifier: Apache-2.0 */
/* batch.c: batches of tasks split into slices, their states, retries and deadlines. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/batch.h"
#include "core/stage.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/mem.h"
#include "core/segment.h"
#include "core/transport.h"

#define SLICE_AT(chunk, i) ((struct slice *)((chunk)->data + (size_t)(i) * (chunk)->stride))
#define SLICE_OF(ps) ((struct slice *)(void *)(ps)) /* ps is the first member */
#define POST_CHUNK 256
/* te_batch_wait keeps polling manual transports this long after their last completion */
#define BATCH_WAIT_SPIN_NS (2ull * 1000 * 1000)
/* ... back to back for this long, then blocking in a plugin's wait op between polls */
#define BATCH_WAIT_BUSY_NS (20ull * 1000)
/* ... at most this long at a time */
#define BATCH_WAIT_BLOCK_NS (500ull * 1000)
/* ... reading the clock once per this many empty polls */
#define BATCH_WAIT_IDLE_POLLS 4

static bool batch_is_terminal(struct batch *b)
{
	uint32_t n = atomic_load_explicit(&b->n_tasks, memory_order_acquire);

	return atomic_load_explicit(&b->n_terminal, memory_order_acquire) >= n;
}

static void batch_wake(struct batch *b)
{
	struct engine *e = b->engine;

	if (atomic_load(&b->waiters) > 0) {
		g_mutex_lock(&b->wait_lock);
		g_cond_broadcast(&b->wait_cond);
		g_mutex_unlock(&b->wait_lock);
	}
	/* Waiters standing by while another polls (te_batch_wait): few, woken together. */
	if (e && atomic_load(&e->standby) > 0) {
		g_mutex_lock(&e->standby_lock);
		g_cond_broadcast(&e->standby_cond);
		g_mutex_unlock(&e->standby_lock);
	}
}

/* Fire an armed notify once the batch is terminal: sent only if all COMPLETED. */
static void batch_maybe_notify(struct batch *b)
{
	uint32_t armed = 1;

	if (atomic_load_explicit(&b->notify_state, memory_order_acquire) != 1 ||
	    !batch_is_terminal(b))
		return;
	if (!atomic_compare_exchange_strong(&b->notify_state, &armed, 2))
		return;
	if (atomic_load(&b->n_completed) == atomic_load(&b->n_tasks))
		control_queue_notify(b->engine, b->notify_addr, b->notify_msg);
	else
		ENGINE_LOG(b->engine, TE_LOG_DEBUG, "notify to %s not sent: batch did not complete",
			   b->notify_addr);
}

/* A task reached its terminal state: account it in the batch. */
static void task_terminal(struct task *t)
{
	struct batch *b = t->batch;
	uint32_t bad = atomic_load_explicit(&t->bad, memory_order_acquire);
	uint32_t term;

	if (t->invalid || (bad & TASK_BAD_FAILED))
		atomic_fetch_add_explicit(&b->n_failed, 1, memory_order_relaxed);
	else if (bad & TASK_BAD_TIMEOUT)
		atomic_fetch_add_explicit(&b->n_timeout, 1, memory_order_relaxed);
	else if (bad & TASK_BAD_CANCELED)
		atomic_fetch_add_explicit(&b->n_canceled, 1, memory_order_relaxed);
	else
		atomic_fetch_add_explicit(&b->n_completed, 1, memory_order_relaxed);
	/* seq_cst pairs with the waiter's increment of b->waiters (no lost wake-up). */
	term = atomic_fetch_add(&b->n_terminal, 1) + 1;
	if (term >= atomic_load_explicit(&b->n_tasks, memory_order_acquire)) {
		batch_maybe_notify(b);
		batch_wake(b);
	}
}

/* Record a failure's status and detail once per task (first failure wins). */
static void task_set_failure(struct task *t, enum te_status status, const char *detail)
{
	uint32_t expect = 0;

	if (!atomic_compare_exchange_strong(&t->claimed, &expect, 1))
		return;
	t->detail = g_strdup(detail ? detail : te_status_str(status));
	atomic_store_explicit(&t->status, status, memory_order_release);
}

static uint32_t bad_bit(enum te_status status)
{
	if (status == TE_ERR_CANCELED)
		return TASK_BAD_CANCELED;
	if (status == TE_ERR_TIMEOUT)
		return TASK_BAD_TIMEOUT;
	return TASK_BAD_FAILED;
}

/* Claim the terminal outcome of @s; false if someone else already did. */
static bool slice_claim(struct slice *s)
{
	uint32_t expect = 0;

	return atomic_compare_exchange_strong_explicit(&s->term, &expect, 1, memory_order_acq_rel,
						       memory_order_acquire);
}

static void slice_count_done(struct slice *s)
{
	struct task *t = s->task;

	if (atomic_fetch_add_explicit(&t->done, 1, memory_order_acq_rel) + 1 == t->n_slices)
		task_terminal(t);
}

/* Finish @s with an error (if it is still live). */
static void slice_fail(struct slice *s, enum te_status status, const char *detail)
{
	if (!slice_claim(s))
		return;
	task_set_failure(s->task, status, detail);
	atomic_fetch_or_explicit(&s->task->bad, bad_bit(status), memory_order_acq_rel);
	slice_count_done(s);
}

void batch_release_slice(struct slice *s)
{
	batch_unref(s->task->batch);
}

/* Why the core gave up on @s (deadline or te_batch_cancel), for its task's detail. */
static void slice_abort_why(const struct slice *s, enum te_status status, char *buf, size_t len)
{
	if (status == TE_ERR_TIMEOUT)
		snprintf(buf, len,
			 "%s: deadline of %" PRIu64 " ms passed (slice at remote 0x%" PRIx64
			 ", %" PRIu64 " bytes, attempt %u)",
			 s->tp->plugin->name, s->task->batch->engine->cfg->timeout_ms, s->ps.remote,
			 s->ps.length, s->ps.attempt + 1);
	else
		snprintf(buf, len, "canceled by te_batch_cancel");
}

/* --- posting to plugins ----------------------------------------------------- */

static void backlog_push(struct transport *tp, struct te_plugin_slice **ps, uint32_t n,
			 bool at_head)
{
	struct slice *head = NULL, *tail = NULL;

	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct slice *s = SLICE_OF(ps[i]);

		s->next = NULL;
		if (tail)
			tail->next = s;
		else
			head = s;
		tail = s;
	}
	g_mutex_lock(&tp->backlog_lock);
	if (at_head) {
		tail->next = tp->backlog_head;
		tp->backlog_head = head;
		if (!tp->backlog_tail)
			tp->backlog_tail = tail;
	} else {
		if (tp->backlog_tail)
			tp->backlog_tail->next = head;
		else
			tp->backlog_head = head;
		tp->backlog_tail = tail;
	}
	atomic_fetch_add(&tp->backlog_len, n);
	g_mutex_unlock(&tp->backlog_lock);
}

/*
 * Hand the *@n_io slices of @ps to the plugin. Slices already settled are dropped
 * first (order kept; *@n_io shrinks). Returns how many of the rest were consumed
 * (accepted, or failed because submit returned an error): ps[0..ret) are gone,
 * ps[ret..*n_io) are back-pressure for the caller to queue.
 */
static uint32_t post(struct engine *e, struct transport *tp, struct te_plugin_slice **ps,
		     uint32_t *n_io)
{
	bool manual = tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL;
	uint32_t acc = 0, n = 0;
	enum te_status st;

	/*
	 * seq_cst store then load of term pairs with batch_free's scan of in_plugin:
	 * a slice whose outcome is already settled (timed out, canceled) is never
	 * handed to a plugin once its batch may have released its memory.
	 */
	for (uint32_t i = 0; i < *n_io; i++) {
		struct slice *s = SLICE_OF(ps[i]);
		int32_t abort;

		atomic_store(&s->in_plugin, 1);
		/* seq_cst: pairs with batch_abort_slices (abort_status, then in_plugin). */
		abort = atomic_load(&s->abort_status);
		if (atomic_load(&s->term) || abort) {
			atomic_store(&s->in_plugin, 0);
			if (abort) {
				char why[TE_DETAIL_MAX];

				slice_abort_why(s, abort, why, sizeof(why));
				slice_fail(s, abort, why);
			}
			batch_release_slice(s);
			continue;
		}
		ps[n++] = ps[i];
	}
	*n_io = n;
	if (!n)
		return 0;
	/*
	 * Staged slices get their bounce buffers now (a WRITE's bytes are copied in); the first
	 * that finds the pool empty stops this post: it and those after it are back-pressure.
	 */
	for (uint32_t i = 0; i < n; i++) {
		struct slice *s = SLICE_OF(ps[i]);
		char why[TE_DETAIL_MAX];
		int32_t ab;

		if (!s->staged)
			continue;
		/*
		 * Device copies take time: the slice's deadline or a cancel may have come while
		 * an earlier slice's copy (or its own) ran. Such a slice ends here, unposted.
		 */
		ab = atomic_load(&s->abort_status);
		st = ab ? TE_OK : stage_attach(e, s, why, sizeof(why));
		if (st == TE_OK && !ab)
			ab = atomic_load(&s->abort_status);
		if (ab) {
			stage_release(e, s);
			atomic_store(&s->in_plugin, 0);
			slice_abort_why(s, ab, why, sizeof(why));
			slice_fail(s, ab, why);
			batch_release_slice(s);
			memmove(&ps[i], &ps[i + 1], (n - i - 1) * sizeof(ps[0]));
			n--;
			(*n_io)--;
			i--;
			continue;
		}
		if (st == TE_OK)
			continue;
		if (st == TE_ERR_AGAIN) {
			for (uint32_t k = i; k < n; k++)
				atomic_store_explicit(&SLICE_OF(ps[k])->in_plugin, 0,
						      memory_order_relaxed);
			n = i;
			break;
		}
		/* The copy or the pool failed: this slice ends here; the others go on. */
		atomic_store(&s->in_plugin, 0);
		slice_fail(s, st, why);
		batch_release_slice(s);
		memmove(&ps[i], &ps[i + 1], (n - i - 1) * sizeof(ps[0]));
		n--;
		(*n_io)--;
		i--;
	}
	if (!n)
		return 0;
	if (manual) /* seq_cst: pairs with the worker's sleeping store (engine_kick) */
		atomic_fetch_add(&tp->in_flight, n);
	transport_clear_error();
	if (tp->serialized)
		g_mutex_lock(&tp->call_lock);
	st = tp->plugin->ops.submit(tp->inst, ps, n, &acc);
	if (tp->serialized)
		g_mutex_unlock(&tp->call_lock);
	if (acc > n) {
		ENGINE_LOG(e, TE_LOG_ERROR, "%s: submit accepted %u of %u slices (plugin bug)",
			   tp->plugin->name, acc, n);
		acc = n;
	}
	if (acc) {
		for (uint32_t i = 0; i < acc; i++) {
			struct task *t = SLICE_OF(ps[i])->task;

			if (!atomic_load_explicit(&t->posted, memory_order_relaxed))
				atomic_store_explicit(&t->posted, 1, memory_order_relaxed);
		}
	}
	for (uint32_t i = acc; i < n; i++) {
		atomic_store_explicit(&SLICE_OF(ps[i])->in_plugin, 0, memory_order_relaxed);
		stage_release(e, SLICE_OF(ps[i])); /* taken again when posted again */
	}
	if (manual && acc < n)
		atomic_fetch_sub_explicit(&tp->in_flight, n - acc, memory_order_relaxed);
	if (st != TE_OK && acc < n) {
		char detail[TE_DETAIL_MAX];

		snprintf(detail, sizeof(detail), "%s: submit failed: %s%s%s", tp->plugin->name,
			 te_status_str(st), *transport_error(tp) ? ": " : "", transport_error(tp));
		for (uint32_t i = acc; i < n; i++) {
			slice_fail(SLICE_OF(ps[i]), st, detail);
			batch_release_slice(SLICE_OF(ps[i]));
		}
		return n;
	}
	return acc;
}

void batch_submit_slices(struct engine *e, struct transport *tp, struct slice **slices, uint32_t n)
{
	struct te_plugin_slice *ps[POST_CHUNK];

	while (n) {
		uint32_t k = MIN(n, (uint32_t)POST_CHUNK), acc, total = k;

		for (uint32_t i = 0; i < k; i++)
			ps[i] = &slices[i]->ps;
		/* Keep order behind an existing backlog: the worker drains it first. */
		if (atomic_load_explicit(&tp->backlog_len, memory_order_acquire)) {
			backlog_push(tp, ps, k, false);
			engine_kick(e);
		} else {
			acc = post(e, tp, ps, &k);
			if (acc < k) {
				backlog_push(tp, ps + acc, k - acc, false);
				engine_kick(e);
			} else if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
				   !engine_user_driving(e, engine_now_ns())) {
				engine_kick(e);
			}
		}
		slices += total;
		n -= total;
	}
}

unsigned batch_drain_backlog(struct engine *e, struct transport *tp)
{
	struct te_plugin_slice *ps[POST_CHUNK];
	uint32_t k = 0, acc;
	unsigned done = 0;

	if (!atomic_load_explicit(&tp->backlog_len, memory_order_acquire))
		return 0;
	g_mutex_lock(&tp->backlog_lock);
	while (tp->backlog_head && k < POST_CHUNK) {
		struct slice *s = tp->backlog_head;

		tp->backlog_head = s->next;
		if (!tp->backlog_head)
			tp->backlog_tail = NULL;
		atomic_fetch_sub(&tp->backlog_len, 1);
		s->next = NULL;
		if (atomic_load_explicit(&s->term, memory_order_acquire)) {
			/* Timed out or canceled while waiting: never reaches the plugin. */
			g_mutex_unlock(&tp->backlog_lock);
			batch_release_slice(s);
			done++;
			g_mutex_lock(&tp->backlog_lock);
			continue;
		}
		ps[k++] = &s->ps;
	}
	g_mutex_unlock(&tp->backlog_lock);
	if (!k)
		return done;
	/*
	 * Nobody else holds these batches: an accepted slice may complete and free its
	 * batch while post() still looks at it. Hold each batch across the call.
	 */
	for (uint32_t i = 0; i < k; i++)
		atomic_fetch_add_explicit(&SLICE_OF(ps[i])->task->batch->refs, 1,
					  memory_order_relaxed);
	{
		struct batch *held[POST_CHUNK];

		uint32_t held_n = k;

		for (uint32_t i = 0; i < k; i++)
			held[i] = SLICE_OF(ps[i])->task->batch;
		acc = post(e, tp, ps, &k);
		if (acc < k)
			backlog_push(tp, ps + acc, k - acc, true);
		for (uint32_t i = 0; i < held_n; i++)
			batch_unref(held[i]);
	}
	return done + acc;
}

/* --- completion ------------------------------------------------------------- */

static void device_failed(struct engine *e, struct transport *tp, uint32_t dev,
			  enum te_status status, const char *detail)
{
	uint32_t n;

	if (dev >= TRANSPORT_MAX_DEVICES)
		return;
	n = atomic_fetch_add_explicit(&tp->dev_failures[dev], 1, memory_order_relaxed) + 1;
	if (n >= e->cfg->quarantine_after && e->cfg->quarantine_ms) {
		uint64_t now = engine_now_ns();
		bool was_paused = atomic_load_explicit(&tp->dev_paused_until[dev],
						       memory_order_relaxed) > now;

		atomic_store_explicit(&tp->dev_failures[dev], 0, memory_order_relaxed);
		transport_pause_device(tp, dev, now + e->cfg->quarantine_ms * 1000000ull);
		/* One line per quarantine, not one per failing slice of a dead peer. */
		if (!was_paused)
			ENGINE_LOG(e, TE_LOG_WARN,
				   "%s: device %u quarantined for %" PRIu64
				   " ms after %u failure(s): %s",
				   tp->plugin->name, dev, e->cfg->quarantine_ms, n,
				   detail ? detail : te_status_str(status));
	}
}

/* Devices to avoid for a new attempt: quarantined ones, unless that is all of them. */
static uint64_t paused_devices(struct transport *tp, uint64_t now)
{
	uint64_t mask = 0, all;
	uint32_t n = tp->n_devices;

	/* Fast path: nothing was quarantined recently. */
	if (atomic_load_explicit(&tp->any_paused_until, memory_order_relaxed) <= now)
		return 0;
	for (uint32_t d = 0; d < n; d++)
		if (atomic_load_explicit(&tp->dev_paused_until[d], memory_order_relaxed) > now)
			mask |= 1ull << d;
	all = n >= 64 ? UINT64_MAX : (1ull << n) - 1;
	return n && (mask & all) == all ? 0 : mask;
}

/*
 * transfer.fallback: move a slice whose transport gave up on the peer to the next
 * transport (in priority order) that reaches the same segment with this memory.
 * Returns true when the slice was requeued (it keeps its batch reference).
 */
static bool slice_fallback(struct engine *e, struct slice *s, enum te_status status,
			   const char *detail, uint64_t now)
{
	struct task *t = s->task;
	struct segview *v = t->view;
	const struct descriptor_buffer *db;
	size_t bi;

	if (!e->cfg->fallback || !v || now >= s->ps.deadline_ns)
		return false;
	db = descriptor_find_buffer(v->desc, s->ps.remote, s->ps.length);
	if (!db)
		return false;
	bi = (size_t)(db - v->desc->buffers);
	for (unsigned n = s->seg_tp + 1; n < e->n_tps; n++) {
		struct transport *to = e->tps[n];
		uint32_t opbit = s->ps.opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_CAN_READ
								   : TE_PLUGIN_CAN_WRITE;

		bool native = (to->caps.mem_types & t->region->mem_type) && t->region->handles[n];

		if (!v->tps[n].peer || !v->rkeys[bi * e->n_tps + n] ||
		    (!native && !stage_possible(e, to, t->region->mem_type)) ||
		    !(to->caps.ops & opbit) ||
		    (to->caps.max_slice_size && s->ps.length > to->caps.max_slice_size))
			continue;
		ENGINE_LOG(e, TE_LOG_INFO, "%s -> %s fallback for a slice to %s after: %s",
			   s->tp->plugin->name, to->plugin->name, v->desc->name,
			   detail ? detail : te_status_str(status));
		s->tp = to;
		s->seg_tp = n;
		/* Staged or not may change with the transport (a slice here holds no buffer). */
		s->staged = !native;
		t->staged = !native;
		s->ps.local = s->stage_local;
		s->ps.local_mem = native ? t->region->handles[n] : NULL;
		s->ps.peer = v->tps[n].peer;
		s->ps.rkey = v->rkeys[bi * e->n_tps + n];
		s->ps.remote_base = db->addr;
		s->ps.excluded_devices = 0;
		s->ps.device = 0;
		s->ps.attempt++;
		atomic_fetch_add_explicit(&t->retries, 1, memory_order_relaxed);
		/* Reported transport: the one that carries the task now. */
		t->tp = to;
		s->retry_at_ns = now;
		engine_queue_retry(e, s);
		return true;
	}
	return false;
}

/* Failures that say "this transport cannot reach the peer now" (fallback candidates). */
static bool status_path_dead(enum te_status status)
{
	return te_status_is_retryable(status) || status == TE_ERR_PEER_UNREACHABLE ||
	       status == TE_ERR_NO_DEVICE || status == TE_ERR_PEER_QUARANTINED;
}

void batch_slice_done(struct transport *tp, struct te_plugin_slice *ps, enum te_status status,
		      uint64_t bytes, const char *detail)
{
	struct slice *s = SLICE_OF(ps);
	struct task *t = s->task;
	struct batch *b = t->batch;
	struct engine *e = b->engine;
	char stage_why[TE_DETAIL_MAX];
	int32_t abort;

	/*
	 * release only: if batch_abort_slices reads in_plugin before this store and this
	 * thread reads abort_status before its store, the slice ends with the plugin's own
	 * outcome (a report and a give-up at the same moment; never a retry: the deadline
	 * passed or the batch is canceled). Nothing waits on the slice either way.
	 */
	atomic_store_explicit(&s->in_plugin, 0, memory_order_release);
	if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL)
		atomic_fetch_sub_explicit(&tp->in_flight, 1, memory_order_relaxed);
	if (s->bounce != UINT32_MAX) {
		/* A staged READ's bytes go from the bounce buffer to its memory; then it is free. */
		enum te_status before = status;

		stage_detach(e, s, &status, stage_why, sizeof(stage_why));
		if (status != before) {
			detail = stage_why;
			bytes = 0;
		}
	}
	if (ps->device < TRANSPORT_MAX_DEVICES)
		atomic_store_explicit(&t->last_device, ps->device, memory_order_relaxed);
	abort = atomic_load_explicit(&s->abort_status, memory_order_acquire);
	/*
	 * A failure reported while te_batch_cancel runs (a transport may fail the other slices
	 * of a connection it aborts to cancel one) is a cancel too, not a FAILED task.
	 */
	if (!abort && status != TE_OK && atomic_load_explicit(&b->canceled, memory_order_acquire))
		abort = TE_ERR_CANCELED;
	if (abort) {
		/*
		 * The core gave up on it (deadline, te_batch_cancel) and waited for the plugin
		 * to let go: the outcome is the core's, whatever the report says (a WRITE
		 * reported TIMEOUT may have landed in part or in full, never later).
		 */
		char why[TE_DETAIL_MAX], core[TE_DETAIL_MAX];

		slice_abort_why(s, abort, core, sizeof(core));
		if (status != TE_OK && detail && *detail)
			snprintf(why, sizeof(why), "%s; %s", core, detail);
		else
			snprintf(why, sizeof(why), "%s", core);
		slice_fail(s, abort, why);
		batch_release_slice(s);
		return;
	}

	if (status == TE_OK && bytes == ps->length) {
		uint32_t d = ps->device;

		if (d < TRANSPORT_MAX_DEVICES &&
		    atomic_load_explicit(&tp->dev_failures[d], memory_order_relaxed))
			atomic_store_explicit(&tp->dev_failures[d], 0, memory_order_relaxed);
		if (slice_claim(s)) {
			atomic_fetch_add_explicit(&t->bytes, bytes, memory_order_relaxed);
			slice_count_done(s);
		}
		batch_release_slice(s);
		return;
	}
	if (status == TE_OK) {
		/* A short transfer is a plugin bug; never report it as success. */
		char why[TE_DETAIL_MAX];

		snprintf(why, sizeof(why),
			 "%s: slice reported %" PRIu64 " of %" PRIu64 " bytes (plugin bug)",
			 tp->plugin->name, bytes, ps->length);
		slice_fail(s, TE_ERR_INTERNAL, why);
		batch_release_slice(s);
		return;
	}
	if (status == TE_ERR_CONN_RESET || status == TE_ERR_PEER_UNREACHABLE ||
	    status == TE_ERR_PEER_RESTARTED || status == TE_ERR_LINK_DOWN)
		segment_mark_stale(e, t->seg); /* the peer may have restarted elsewhere */
	if (te_status_is_retryable(status)) {
		uint64_t now = engine_now_ns();
		uint64_t backoff_us = e->cfg->retry_backoff_us;

		/* Exhausted resources (or a transport's own reset) say nothing about the path. */
		if (status != TE_ERR_AGAIN)
			device_failed(e, tp, ps->device, status, detail);
		for (uint32_t i = 0; i < ps->attempt && backoff_us < e->cfg->retry_backoff_max_us;
		     i++)
			backoff_us *= 2;
		backoff_us = MIN(backoff_us, e->cfg->retry_backoff_max_us);
		if (!atomic_load_explicit(&s->term, memory_order_acquire) &&
		    !atomic_load_explicit(&b->canceled, memory_order_acquire) &&
		    ps->attempt < e->cfg->retries && now + backoff_us * 1000 < ps->deadline_ns) {
			ps->attempt++;
			atomic_fetch_add_explicit(&t->retries, 1, memory_order_relaxed);
			if (tp->n_devices > 1 && ps->device < 64) {
				uint64_t all = tp->n_devices >= 64 ? UINT64_MAX
								   : (1ull << tp->n_devices) - 1;

				ps->excluded_devices |= 1ull << ps->device;
				if ((ps->excluded_devices & all) == all)
					ps->excluded_devices = 0; /* every path failed once */
			}
			s->retry_at_ns = now + backoff_us * 1000;
			ENGINE_LOG(e, TE_LOG_DEBUG, "%s: retry %u of slice at 0x%" PRIx64 ": %s",
				   tp->plugin->name, ps->attempt, ps->remote,
				   detail ? detail : te_status_str(status));
			engine_queue_retry(e, s); /* keeps the slice's batch reference */
			return;
		}
	}
	if (status_path_dead(status) && !atomic_load_explicit(&s->term, memory_order_acquire) &&
	    !atomic_load_explicit(&b->canceled, memory_order_acquire) &&
	    slice_fallback(e, s, status, detail, engine_now_ns()))
		return;
	{
		char why[TE_DETAIL_MAX];

		if (ps->attempt)
			snprintf(why, sizeof(why), "%s (after %u attempts)",
				 detail ? detail : te_status_str(status), ps->attempt + 1);
		else
			snprintf(why, sizeof(why), "%s", detail ? detail : te_status_str(status));
		slice_fail(s, status, why);
	}
	batch_release_slice(s);
}

void batch_retry_slice(struct engine *e, struct slice *s)
{
	struct transport *tp = s->tp;
	enum te_status st;

	if (atomic_load_explicit(&s->term, memory_order_acquire)) {
		batch_release_slice(s);
		return;
	}
	if (atomic_load(&s->abort_status)) {
		char why[TE_DETAIL_MAX];
		int32_t abort = atomic_load(&s->abort_status);

		slice_abort_why(s, abort, why, sizeof(why));
		slice_fail(s, abort, why);
		batch_release_slice(s);
		return;
	}
	s->ps.excluded_devices |= paused_devices(tp, engine_now_ns());
	if (tp->n_devices && tp->n_devices < 64 &&
	    (s->ps.excluded_devices & ((1ull << tp->n_devices) - 1)) == (1ull << tp->n_devices) - 1)
		s->ps.excluded_devices = 0; /* never exclude every device */
	if (tp->serialized)
		g_mutex_lock(&tp->call_lock);
	st = tp->plugin->ops.retry_prepare(tp->inst, &s->ps);
	if (tp->serialized)
		g_mutex_unlock(&tp->call_lock);
	if (st != TE_OK && st != TE_ERR_UNSUPPORTED) {
		char why[TE_DETAIL_MAX];

		snprintf(why, sizeof(why), "%s: no path left for retry %u: %s", tp->plugin->name,
			 s->ps.attempt, te_status_str(st));
		slice_fail(s, st, why);
		batch_release_slice(s);
		return;
	}
	{
		/* Same reason as in batch_drain_backlog: hold the batch across posting. */
		struct batch *b = s->task->batch;

		atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
		batch_submit_slices(e, tp, &s, 1);
		batch_unref(b);
	}
}

/* --- public operations ------------------------------------------------------ */

/*
 * Release what the tasks pin (local regions, segments, views): once per batch,
 * either at te_batch_free when no plugin holds a slice any more, or at the last
 * reference otherwise (a transport still owns a timed-out slice).
 */
static void batch_release_tasks(struct batch *b)
{
	uint32_t n = atomic_load(&b->n_tasks);

	if (atomic_exchange(&b->tasks_released, 1))
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct task *t = &b->tasks[i];

		if (t->region)
			atomic_fetch_sub_explicit(&t->region->refs, 1, memory_order_release);
		if (t->seg)
			atomic_fetch_sub_explicit(&t->seg->busy, 1, memory_order_release);
		segview_unref(t->view);
		t->view = NULL;
	}
}

static bool batch_plugin_holds_slices(struct batch *b)
{
	for (struct slice_chunk *c = b->chunks; c; c = c->next)
		for (uint32_t i = 0; i < c->n; i++)
			if (atomic_load(&SLICE_AT(c, i)->in_plugin))
				return true;
	return false;
}

/*
 * Keep a few finished batches, their task arrays and largest slice chunk for
 * reuse: te_batch_new + submit then allocate nothing in a steady loop. Returns
 * true when @b went to the cache.
 */
static bool batch_recycle(struct batch *b, uint32_t used)
{
	struct engine *e = b->engine;
	struct slice_chunk *keep = NULL;

	if (b->alloc_cap > BATCH_CACHE_MAX_CAP || atomic_load(&e->stopping))
		return false;
	g_mutex_lock(&e->cache_lock);
	if (e->n_cached >= BATCH_CACHE_SIZE) {
		g_mutex_unlock(&e->cache_lock);
		return false;
	}
	g_mutex_unlock(&e->cache_lock);
	(void)used; /* batch_submit initialises every task it fills */
	while (b->chunks) {
		struct slice_chunk *c = b->chunks;

		b->chunks = c->next;
		if (!keep || c->cap > keep->cap) {
			g_free(keep);
			keep = c;
		} else {
			g_free(c);
		}
	}
	if (b->spare && (!keep || b->spare->cap > keep->cap)) {
		g_free(keep);
		keep = b->spare;
	} else if (b->spare) {
		g_free(b->spare);
	}
	b->spare = keep;
	if (b->notify_msg)
		g_bytes_unref(b->notify_msg);
	b->notify_msg = NULL;
	g_free(b->notify_addr);
	b->notify_addr = NULL;
	atomic_fetch_sub(&e->live_batches, 1);
	g_mutex_lock(&e->cache_lock);
	b->cache_next = e->cache;
	e->cache = b;
	e->n_cached++;
	g_mutex_unlock(&e->cache_lock);
	return true;
}

/* Free a cached batch for good (engine teardown). */
void batch_free_cached(struct batch *b)
{
	g_free(b->spare);
	g_mutex_clear(&b->wait_lock);
	g_cond_clear(&b->wait_cond);
	g_free(b->tasks);
	g_free(b);
}

static void batch_destroy(struct batch *b)
{
	struct engine *e = b->engine;
	uint32_t n = atomic_load(&b->n_tasks);

	batch_release_tasks(b);
	for (uint32_t i = 0; i < n; i++)
		g_free(b->tasks[i].detail);
	if (batch_recycle(b, n))
		return;
	g_free(b->spare);
	while (b->chunks) {
		struct slice_chunk *c = b->chunks;

		b->chunks = c->next;
		g_free(c);
	}
	g_mutex_clear(&b->wait_lock);
	g_cond_clear(&b->wait_cond);
	if (b->notify_msg)
		g_bytes_unref(b->notify_msg);
	g_free(b->notify_addr);
	g_free(b->tasks);
	atomic_fetch_sub(&e->live_batches, 1);
	g_free(b);
}

void batch_unref(struct batch *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		batch_destroy(b);
}

/* A cached batch whose task array fits @capacity (not wastefully large), reset. */
static struct batch *batch_from_cache(struct engine *e, uint32_t capacity)
{
	struct batch **pp, *b = NULL;

	g_mutex_lock(&e->cache_lock);
	for (pp = &e->cache; *pp; pp = &(*pp)->cache_next) {
		if ((*pp)->alloc_cap >= capacity && (*pp)->alloc_cap <= MAX(4 * capacity, 64u)) {
			b = *pp;
			*pp = b->cache_next;
			e->n_cached--;
			break;
		}
	}
	g_mutex_unlock(&e->cache_lock);
	if (!b)
		return NULL;
	/* Back to a new batch's state; tasks were zeroed when it was recycled. */
	b->slot = 0;
	b->chunks = NULL;
	b->cache_next = NULL;
	atomic_store(&b->n_tasks, 0);
	atomic_store(&b->n_terminal, 0);
	atomic_store(&b->n_completed, 0);
	atomic_store(&b->n_failed, 0);
	atomic_store(&b->n_timeout, 0);
	atomic_store(&b->n_canceled, 0);
	atomic_store(&b->canceled, 0);
	atomic_store(&b->tasks_released, 0);
	atomic_store(&b->notify_state, 0);
	atomic_store(&b->waiters, 0);
	return b;
}

enum te_status batch_new(struct engine *e, uint32_t capacity, te_batch_id *id_out)
{
	struct batch *b;
	uint32_t slot;

	if (!id_out)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_new: batch_out is NULL");
	if (capacity == 0)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_new: capacity is 0");
	if (capacity > e->cfg->max_batch_size)
		return log_error(TE_ERR_TOO_LARGE,
				 "te_batch_new: capacity %u exceeds transfer.max_batch_size %u",
				 capacity, e->cfg->max_batch_size);
	b = batch_from_cache(e, capacity);
	if (!b) {
		b = g_try_new0(struct batch, 1);
		if (!b)
			return log_error(TE_ERR_NOMEM, "te_batch_new: out of memory");
		b->tasks = g_try_new0(struct task, capacity);
		if (!b->tasks) {
			g_free(b);
			return log_error(TE_ERR_NOMEM, "te_batch_new: out of memory for %u tasks",
					 capacity);
		}
		b->alloc_cap = capacity;
		g_mutex_init(&b->wait_lock);
		g_cond_init(&b->wait_cond);
	}
	b->engine = e;
	b->capacity = capacity;
	atomic_init(&b->refs, 1);
	atomic_init(&b->min_deadline_ns, UINT64_MAX);

	g_mutex_lock(&e->slot_lock);
	if (e->free_head == UINT32_MAX) {
		g_mutex_unlock(&e->slot_lock);
		g_mutex_clear(&b->wait_lock);
		g_cond_clear(&b->wait_cond);
		g_free(b->tasks);
		g_free(b);
		return log_error(TE_ERR_BUSY,
				 "te_batch_new: all %u batch slots are in use "
				 "(transfer.max_batches)",
				 e->n_slots);
	}
	slot = e->free_head;
	e->free_head = e->slots[slot].next_free;
	e->slots[slot].batch = b;
	b->slot = slot;
	atomic_fetch_add(&e->live_batches, 1);
	*id_out = ((uint64_t)e->slots[slot].gen << 32) | slot;
	g_mutex_unlock(&e->slot_lock);
	return TE_OK;
}

/* Why transport @t cannot carry this request (NULL: it can). */
static const char *transport_unfit(struct engine *e, struct segview *v, unsigned t,
				   size_t buf_index, const struct mem_region *region,
				   uint32_t opcode, uint64_t now, bool staging,
				   enum te_status *st_out)
{
	struct transport *tp = e->tps[t];
	struct segview_tp *vt = &v->tps[t];
	uint32_t opbit = opcode == TE_OP_READ ? TE_PLUGIN_CAN_READ : TE_PLUGIN_CAN_WRITE;

	if (!vt->peer)
		return vt->why;
	if ((!(tp->caps.mem_types & region->mem_type) || !region->handles[t]) &&
	    !(staging && stage_possible(e, tp, region->mem_type))) {
		*st_out = TE_ERR_MEMORY_TYPE;
		return staging ? "memory type not supported, and no loaded transport owns it to "
				 "stage it"
			       : "memory type not supported";
	}
	if (!(tp->caps.ops & opbit))
		return opcode == TE_OP_READ ? "READ not supported" : "WRITE not supported";
	if (!v->rkeys[buf_index * e->n_tps + t])
		return "remote buffer has no key for it";
	if (atomic_load_explicit(&vt->paused_until_ns, memory_order_relaxed) > now) {
		*st_out = TE_ERR_PEER_QUARANTINED;
		return "peer quarantined after failures";
	}
	return NULL;
}

/*
 * Pick the transport for one request: the first in priority order that fits.
 * A quarantined peer stops the search unless transfer.fallback allows a lower
 * priority transport. On failure writes every candidate's reason into @why.
 */
static int select_transport(struct engine *e, struct segview *v, size_t buf_index,
			    const struct mem_region *region, uint32_t opcode, uint64_t now,
			    bool *staged_out, enum te_status *st_out, char *why, size_t why_len)
{
	enum te_status st = TE_ERR_NO_TRANSPORT;
	size_t used = 0;

	/*
	 * Memory a transport moves itself beats memory it would get through host staging; for
	 * device memory (a GPU's) on either side, a transport made for this host (nvlink, hip)
	 * comes first. Within each round the YAML order decides. Host memory on both sides: the
	 * YAML order alone.
	 */
	const char *rloc = v->desc->buffers[buf_index].location;
	bool device =
		region->mem_type != TE_PLUGIN_MEM_CPU || (rloc && *rloc && strncmp(rloc, "cpu", 3));

	for (int round = device ? 0 : 1; round < 2; round++) {
		for (unsigned t = 0; t < e->n_tps; t++) {
			enum te_status tst = TE_ERR_NO_TRANSPORT;
			const struct te_plugin_caps *c = &e->tps[t]->caps;

			if (round == 0 && !(c->flags & (TE_PLUGIN_CAP_SAME_HOST_ONLY |
							TE_PLUGIN_CAP_SAME_PROCESS_ONLY)))
				continue;
			if (!transport_unfit(e, v, t, buf_index, region, opcode, now, false,
					     &tst)) {
				*staged_out = false;
				return (int)t;
			}
			if (tst == TE_ERR_PEER_QUARANTINED && !e->cfg->fallback)
				break;
		}
	}
	for (unsigned t = 0; t < e->n_tps; t++) {
		enum te_status tst = TE_ERR_NO_TRANSPORT;
		const char *r =
			transport_unfit(e, v, t, buf_index, region, opcode, now, true, &tst);

		if (!r) {
			*staged_out = true;
			return (int)t;
		}
		if (tst != TE_ERR_NO_TRANSPORT && st == TE_ERR_NO_TRANSPORT)
			st = tst;
		if (used < why_len) {
			/* vt->why already names the transport. */
			bool named = r == v->tps[t].why;

			used += (size_t)g_snprintf(
				why + used, why_len - used, "%s%s%s%s", used ? "; " : "",
				named ? "" : e->tps[t]->plugin->name, named ? "" : ": ", r);
		}
		if (tst == TE_ERR_PEER_QUARANTINED && !e->cfg->fallback)
			break;
	}
	if (!e->n_tps)
		g_snprintf(why, why_len, "no transports installed");
	*st_out = st;
	return -1;
}

/* Slice size for a task of @length on transport @t (caps, YAML, max slices). */
static uint64_t task_slice_size(struct engine *e, unsigned t, uint64_t length, uint32_t *n_out)
{
	uint64_t ss = e->slice_size[t];
	uint64_t n = (length + ss - 1) / ss;

	if (n > e->cfg->max_slices_per_task) {
		n = e->cfg->max_slices_per_task;
		ss = (length + n - 1) / n;
		n = (length + ss - 1) / ss;
	}
	*n_out = (uint32_t)n;
	return ss;
}

static void task_reject(struct task *t, enum te_status st, const char *fmt, ...)
	G_GNUC_PRINTF(3, 4);
static void task_reject(struct task *t, enum te_status st, const char *fmt, ...)
{
	va_list ap;

	t->invalid = true;
	va_start(ap, fmt);
	t->detail = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	atomic_store_explicit(&t->claimed, 1, memory_order_relaxed);
	atomic_store_explicit(&t->status, st, memory_order_release);
}

static void atomic_min_u64(_Atomic uint64_t *p, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);

	while (v < cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_acq_rel,
								 memory_order_relaxed))
		;
}

static enum te_status batch_submit_requests(struct engine *e, te_batch_id id,
					    const struct te_request *reqs, size_t n, bool *missed)
{
	enum te_status first_err = TE_OK;
	struct slice_chunk *chunk = NULL;
	uint32_t base, n_invalid = 0, si = 0;
	uint64_t total_slices = 0, now, deadline;
	struct segview *local_view = NULL, *last_view = NULL;
	const struct descriptor_buffer *last_db = NULL;
	struct mem_region *last_region = NULL;
	struct batch *b;
	enum te_status st;
	size_t i;

	segment_refresh_stale(e);
	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (n && !reqs) {
		batch_unref(b);
		return log_error(TE_ERR_INVALID_ARG, "te_batch_submit: requests is NULL");
	}
	if (atomic_load(&b->canceled)) {
		batch_unref(b);
		return log_error(TE_ERR_CANCELED, "te_batch_submit: batch was canceled");
	}
	base = atomic_load_explicit(&b->n_tasks, memory_order_relaxed);
	if (n > b->capacity - base) {
		batch_unref(b);
		return log_error(TE_ERR_BATCH_FULL,
				 "te_batch_submit: %zu requests do not fit (capacity %u, %u used)",
				 n, b->capacity, base);
	}
	if (!n) {
		batch_unref(b);
		return TE_OK;
	}
	now = engine_now_ns();
	deadline = now + e->cfg->timeout_ms * 1000000ull;

	/* Pass 1: validate, choose transports, count slices. */
	g_rw_lock_reader_lock(&e->mem.lock);
	g_rw_lock_reader_lock(&e->seg_lock);
	for (i = 0; i < n; i++) {
		const struct te_request *r = &reqs[i];
		struct task *t = &b->tasks[base + i];
		const struct descriptor_buffer *db;
		struct mem_region *region = NULL;
		struct segview *v = NULL;
		struct segment *seg = NULL;
		char why[TE_DETAIL_MAX - 64];
		enum te_status sst;
		int tpi;

		/* Every field set here: recycled task arrays are not zeroed. */
		t->batch = b;
		t->region = NULL;
		t->view = NULL;
		t->seg = NULL;
		t->tp = NULL;
		t->n_slices = 0;
		t->opcode = r->opcode;
		t->length = r->length;
		t->detail = NULL;
		t->invalid = false;
		t->staged = false;
		atomic_init(&t->done, 0);
		atomic_init(&t->bad, 0);
		atomic_init(&t->posted, 0);
		atomic_init(&t->retries, 0);
		atomic_init(&t->last_device, 0);
		atomic_init(&t->bytes, 0);
		atomic_init(&t->status, 0);
		atomic_init(&t->claimed, 0);
		if (r->opcode != TE_OP_READ && r->opcode != TE_OP_WRITE) {
			task_reject(t, TE_ERR_INVALID_ARG,
				    "request %zu: opcode %d is neither READ (0) nor WRITE (1)", i,
				    (int)r->opcode);
			goto rejected;
		}
		if (r->length == 0 || !r->local) {
			task_reject(t, TE_ERR_INVALID_ARG, "request %zu: %s", i,
				    r->length == 0 ? "length is 0" : "local address is NULL");
			goto rejected;
		}
		if ((uintptr_t)r->local + r->length < (uintptr_t)r->local ||
		    r->remote + r->length < r->remote) {
			task_reject(t, TE_ERR_OVERFLOW,
				    "request %zu: %s range of %" PRIu64 " bytes wraps around", i,
				    (uintptr_t)r->local + r->length < (uintptr_t)r->local
					    ? "local"
					    : "remote",
				    r->length);
			goto rejected;
		}
		/* Consecutive requests usually hit the same region: try it first. */
		if (last_region && (uintptr_t)r->local >= last_region->addr &&
		    (uintptr_t)r->local + r->length - last_region->addr <= last_region->length) {
			region = last_region;
			sst = TE_OK;
		} else {
			sst = mem_lookup(e->mem.regions, (uintptr_t)r->local, r->length, &region);
		}
		if (sst != TE_OK) {
			task_reject(
				t, sst,
				sst == TE_ERR_NOT_REGISTERED
					? "request %zu: local address %p is not in a registered "
					  "region (+%" PRIu64 " bytes)"
					: "request %zu: local range [%p, +%" PRIu64
					  ") runs past the end of its registered region",
				i, r->local, r->length);
			goto rejected;
		}
		if (r->segment == TE_SEGMENT_LOCAL) {
			if (!local_view) {
				g_autofree char *err = NULL;

				sst = segment_local_view(e, &local_view, &err);
				if (sst != TE_OK) {
					task_reject(t, sst, "request %zu: local segment: %s", i,
						    err);
					goto rejected;
				}
			}
			v = local_view;
		} else {
			seg = segment_get_locked(e, r->segment);
			if (!seg) {
				task_reject(t, TE_ERR_UNKNOWN_SEGMENT,
					    "request %zu: segment id %u is not open", i,
					    r->segment);
				goto rejected;
			}
			if (seg->departed) {
				task_reject(t, TE_ERR_PEER_UNREACHABLE,
					    "request %zu: segment '%s' is gone: %s", i, seg->name,
					    seg->departed);
				goto rejected;
			}
			v = seg->view;
		}
		if (last_db && v == last_view && r->remote >= last_db->addr &&
		    r->remote + r->length - last_db->addr <= last_db->length)
			db = last_db;
		else
			db = descriptor_find_buffer(v->desc, r->remote, r->length);
		if (!db) {
			/*
			 * The peer may have registered it since its descriptor was fetched (or
			 * restarted elsewhere): the next submit fetches a fresh one.
			 */
			if (seg) {
				segment_mark_stale(e, seg);
				*missed = true;
			}
			task_reject(t, TE_ERR_REMOTE_ACCESS,
				    "request %zu: remote range [0x%" PRIx64 ", +%" PRIu64
				    ") is outside the registered buffers of segment '%s'",
				    i, r->remote, r->length, v->desc->name);
			goto rejected;
		}
		if (!(db->access &
		      (r->opcode == TE_OP_READ ? TE_MEM_REMOTE_READ : TE_MEM_REMOTE_WRITE))) {
			task_reject(t, TE_ERR_REMOTE_ACCESS,
				    "request %zu: remote buffer [0x%" PRIx64 ", +%" PRIu64
				    ") of segment '%s' is not registered for remote %s",
				    i, db->addr, db->length, v->desc->name,
				    r->opcode == TE_OP_READ ? "read" : "write");
			goto rejected;
		}
		last_region = region;
		last_db = db;
		last_view = v;
		tpi = select_transport(e, v, (size_t)(db - v->desc->buffers), region, r->opcode,
				       now, &t->staged, &sst, why, sizeof(why));
		if (tpi < 0) {
			task_reject(t, sst, "request %zu: no transport for segment '%s': %s", i,
				    v->desc->name, why);
			goto rejected;
		}
		t->tp = e->tps[tpi];
		t->region = region;
		atomic_fetch_add_explicit(&region->refs, 1, memory_order_relaxed);
		t->view = v;
		segview_ref(v);
		t->seg = seg;
		if (seg)
			atomic_fetch_add_explicit(&seg->busy, 1, memory_order_relaxed);
		task_slice_size(e, (unsigned)tpi, r->length, &t->n_slices);
		/* Remember which buffer: reuse last_device as scratch until posting. */
		atomic_store_explicit(&t->last_device, (uint32_t)(db - v->desc->buffers),
				      memory_order_relaxed);
		total_slices += t->n_slices;
		continue;
rejected:
		if (first_err == TE_OK) {
			first_err = atomic_load(&t->status);
			log_error(first_err, "te_batch_submit: %s", t->detail);
		}
		n_invalid++;
	}
	g_rw_lock_reader_unlock(&e->seg_lock);
	g_rw_lock_reader_unlock(&e->mem.lock);

	if (total_slices) {
		size_t bytes = sizeof(struct slice_chunk) + total_slices * e->slice_stride;

		if (b->spare && b->spare->cap >= bytes) {
			chunk = b->spare; /* recycled with the batch */
			b->spare = NULL;
		} else {
			chunk = total_slices <= UINT32_MAX ? g_try_malloc(bytes) : NULL;
			if (chunk)
				chunk->cap = bytes;
		}
		if (!chunk) {
			/* Undo pass 1 references; nothing was published yet. */
			for (i = 0; i < n; i++) {
				struct task *t = &b->tasks[base + i];

				if (t->region)
					atomic_fetch_sub(&t->region->refs, 1);
				if (t->seg)
					atomic_fetch_sub(&t->seg->busy, 1);
				segview_unref(t->view);
				g_free(t->detail);
				memset(t, 0, sizeof(*t));
			}
			segview_unref(local_view);
			batch_unref(b);
			return log_error(TE_ERR_NOMEM,
					 "te_batch_submit: no memory for %" PRIu64 " slices",
					 total_slices);
		}
		chunk->n = (uint32_t)total_slices;
		chunk->stride = e->slice_stride;
		chunk->next = b->chunks;
		b->chunks = chunk;
	}

	/* Pass 2: build slices. */
	for (i = 0; i < n; i++) {
		struct task *t = &b->tasks[base + i];
		const struct te_request *r = &reqs[i];
		const struct descriptor_buffer *db;
		struct segview_tp *vt;
		struct te_plugin_rkey *rkey;
		uint64_t ss, off = 0, excluded;
		uint32_t ns, bi, tpi;

		if (t->invalid)
			continue;
		tpi = t->tp->index;
		bi = atomic_load_explicit(&t->last_device, memory_order_relaxed);
		atomic_store_explicit(&t->last_device, UINT32_MAX, memory_order_relaxed);
		db = &t->view->desc->buffers[bi];
		vt = &t->view->tps[tpi];
		rkey = t->view->rkeys[bi * e->n_tps + tpi];
		ss = task_slice_size(e, tpi, r->length, &ns);
		excluded = paused_devices(t->tp, now);
		for (uint32_t k = 0; k < ns; k++, si++) {
			struct slice *s = SLICE_AT(chunk, si);
			uint64_t len = MIN(ss, r->length - off);

			s->ps.size = sizeof(s->ps);
			s->ps.opcode =
				r->opcode == TE_OP_READ ? TE_PLUGIN_OP_READ : TE_PLUGIN_OP_WRITE;
			s->ps.local = (char *)r->local + off;
			s->ps.remote = r->remote + off;
			s->ps.length = len;
			s->ps.local_mem = t->staged ? NULL : t->region->handles[tpi];
			s->staged = t->staged;
			s->bounce = UINT32_MAX;
			s->stage_local = s->ps.local;
			s->ps.peer = vt->peer;
			s->ps.rkey = rkey;
			s->ps.remote_base = db->addr;
			s->ps.deadline_ns = deadline;
			s->ps.excluded_devices = excluded;
			s->ps.attempt = 0;
			s->ps.device = 0;
			s->ps.priv = t->tp->caps.slice_priv_size ? (char *)s + sizeof(*s) : NULL;
			s->task = t;
			s->tp = t->tp;
			s->next = NULL;
			s->retry_at_ns = 0;
			atomic_init(&s->term, 0);
			atomic_init(&s->in_plugin, 0);
			atomic_init(&s->abort_status, 0);
			atomic_init(&s->abort_ns, 0);
			atomic_init(&s->cancel_sent, 0);
			s->seg_tp = tpi;
			off += len;
		}
	}

	/* Publish: from here completions may race with the rest of this function. */
	atomic_fetch_add_explicit(&b->refs, (int64_t)total_slices, memory_order_relaxed);
	atomic_min_u64(&b->min_deadline_ns, deadline);
	atomic_min_u64(&e->next_deadline_ns, deadline);
	atomic_store_explicit(&b->n_tasks, base + (uint32_t)n, memory_order_release);
	for (i = 0; i < n; i++)
		if (b->tasks[base + i].invalid)
			task_terminal(&b->tasks[base + i]);

	/* Pass 3: hand runs of slices with the same transport to their plugin. */
	for (uint32_t start = 0; start < si;) {
		struct transport *tp = SLICE_AT(chunk, start)->tp;
		struct slice *run[POST_CHUNK];
		uint32_t k = 0;

		while (start + k < si && k < POST_CHUNK && SLICE_AT(chunk, start + k)->tp == tp) {
			run[k] = SLICE_AT(chunk, start + k);
			k++;
		}
		batch_submit_slices(e, tp, run, k);
		start += k;
	}
	segview_unref(local_view);
	batch_unref(b);
	(void)n_invalid;
	return first_err;
}

enum te_status batch_submit(struct engine *e, te_batch_id id, const struct te_request *reqs,
			    size_t n)
{
	bool missed = false;
	enum te_status st = batch_submit_requests(e, id, reqs, n, &missed);

	/*
	 * A remote range outside the segment's descriptor was refused: the peer may have
	 * registered it (or restarted) since the descriptor was fetched. Fetch it now, so the
	 * next submit sees the peer as it is (not later: a descriptor kept until a later
	 * submit would pick up unrelated changes made meanwhile).
	 */
	if (missed)
		segment_refresh_stale(e);
	return st;
}

static enum te_state task_state(struct task *t)
{
	uint32_t bad;

	if (t->invalid)
		return TE_STATE_INVALID;
	if (atomic_load_explicit(&t->done, memory_order_acquire) < t->n_slices)
		return atomic_load_explicit(&t->posted, memory_order_relaxed) ? TE_STATE_PENDING
									      : TE_STATE_WAITING;
	bad = atomic_load_explicit(&t->bad, memory_order_acquire);
	if (bad & TASK_BAD_FAILED)
		return TE_STATE_FAILED;
	if (bad & TASK_BAD_TIMEOUT)
		return TE_STATE_TIMEOUT;
	if (bad & TASK_BAD_CANCELED)
		return TE_STATE_CANCELED;
	return TE_STATE_COMPLETED;
}

enum te_status batch_task_status(struct engine *e, te_batch_id id, uint32_t task,
				 struct te_task_info *info_out)
{
	struct batch *b;
	struct task *t;
	enum te_status st;
	uint32_t dev;

	if (!info_out)
		return log_error(TE_ERR_INVALID_ARG, "te_task_status: info_out is NULL");
	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (task >= atomic_load_explicit(&b->n_tasks, memory_order_acquire)) {
		uint32_t n = atomic_load(&b->n_tasks);

		batch_unref(b);
		return log_error(TE_ERR_INVALID_ARG, "te_task_status: task %u of %u submitted",
				 task, n);
	}
	t = &b->tasks[task];
	memset(info_out, 0, sizeof(*info_out));
	info_out->state = task_state(t);
	info_out->status = atomic_load_explicit(&t->status, memory_order_acquire);
	if (info_out->status != TE_OK && t->detail)
		g_strlcpy(info_out->detail, t->detail, sizeof(info_out->detail));
	if (info_out->state == TE_STATE_COMPLETED)
		info_out->status = TE_OK;
	info_out->bytes = atomic_load_explicit(&t->bytes, memory_order_relaxed);
	info_out->length = t->length;
	info_out->slices = t->n_slices;
	info_out->retries = atomic_load_explicit(&t->retries, memory_order_relaxed);
	info_out->transport = t->tp ? t->tp->plugin->name : "";
	dev = atomic_load_explicit(&t->last_device, memory_order_relaxed);
	info_out->device = !t->tp || dev >= t->tp->n_devices ? ""
			   : t->staged			     ? t->tp->staged_names[dev]
							     : t->tp->devices[dev].name;
	batch_unref(b);
	return TE_OK;
}

enum te_status batch_status(struct engine *e, te_batch_id id, struct te_batch_info *info_out)
{
	struct batch *b;
	enum te_status st;
	uint32_t n;

	if (!info_out)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_status: info_out is NULL");
	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	memset(info_out, 0, sizeof(*info_out));
	n = atomic_load_explicit(&b->n_tasks, memory_order_acquire);
	info_out->tasks = n;
	info_out->completed = atomic_load(&b->n_completed);
	info_out->failed = atomic_load(&b->n_failed);
	info_out->timed_out = atomic_load(&b->n_timeout);
	info_out->canceled = atomic_load(&b->n_canceled);
	for (uint32_t i = 0; i < n; i++)
		info_out->bytes += atomic_load_explicit(&b->tasks[i].bytes, memory_order_relaxed);
	if (!batch_is_terminal(b)) {
		info_out->state = TE_STATE_WAITING;
		for (uint32_t i = 0; i < n; i++)
			if (atomic_load_explicit(&b->tasks[i].posted, memory_order_relaxed)) {
				info_out->state = TE_STATE_PENDING;
				break;
			}
	} else if (info_out->failed) {
		info_out->state = TE_STATE_FAILED;
	} else if (info_out->timed_out) {
		info_out->state = TE_STATE_TIMEOUT;
	} else if (info_out->canceled) {
		info_out->state = TE_STATE_CANCELED;
	} else {
		info_out->state = TE_STATE_COMPLETED;
	}
	batch_unref(b);
	return TE_OK;
}

static enum te_status batch_result(struct batch *b)
{
	uint32_t n = atomic_load(&b->n_tasks);

	for (uint32_t i = 0; i < n; i++) {
		struct task *t = &b->tasks[i];
		enum te_state s = task_state(t);

		if (s != TE_STATE_COMPLETED) {
			enum te_status st = atomic_load_explicit(&t->status, memory_order_acquire);

			log_error(st, "task %u: %s", i, t->detail ? t->detail : te_status_str(st));
			return st != TE_OK ? st : TE_ERR_INTERNAL;
		}
	}
	return TE_OK;
}

/*
 * Poll manual-progress transports for @b as the engine's one polling waiter: while
 * completions keep coming (within BATCH_WAIT_SPIN_NS of the last one, or of @start, when
 * this wait began; providers like libfabric's tcp move data only while polled): back to
 * back for BATCH_WAIT_BUSY_NS after a completion, then sleeping in the plugin's wait op
 * (or yielding the CPU) between empty polls. Returns when @b is terminal or when it is
 * time to sleep (nothing completed lately: a dead or frozen peer; or @end passed).
 */
static void batch_wait_poll(struct engine *e, struct batch *b, uint64_t start, uint64_t end)
{
	unsigned idle = 0;
	bool worked = false;

	while (!batch_is_terminal(b)) {
		uint64_t now, quiet;

		if (engine_progress_once(e, false)) {
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
		if (now >= end || quiet >= BATCH_WAIT_SPIN_NS || !engine_manual_in_flight(e))
			return;
		/*
		 * A burst usually has more: poll back to back for a moment, as the raw provider
		 * loops do. Then sleep on the plugin's queues if it can, never past @end: a
		 * waiter polling an empty queue (libfabric's tcp: one epoll_wait per poll) takes
		 * the CPU and the socket locks from the peer that is sending.
		 */
		if (quiet >= BATCH_WAIT_BUSY_NS)
			engine_manual_wait(e, MIN(BATCH_WAIT_BLOCK_NS, end - now));
	}
}

/* Give up polling; wake the waiters standing by to take it over. */
static void batch_wait_unpoll(struct engine *e)
{
	atomic_store(&e->polling, false);
	if (atomic_load(&e->standby)) {
		g_mutex_lock(&e->standby_lock);
		g_cond_broadcast(&e->standby_cond);
		g_mutex_unlock(&e->standby_lock);
	}
}

enum te_status batch_wait(struct engine *e, te_batch_id id, int64_t timeout_ns)
{
	uint64_t start = engine_now_ns();
	uint64_t end = timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
	struct batch *b;
	enum te_status st;

	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (e->has_manual)
		atomic_fetch_add(&e->drivers, 1);
	while (!batch_is_terminal(b)) {
		uint64_t now;

		/*
		 * Drive manual-progress transports from the waiting thread, one waiter at a
		 * time: several threads polling one queue only take turns on its lock and on
		 * the CPUs the peers need. The others stand by until their batch ends (the
		 * poller reports it), the poller lets go, or 200 us pass.
		 */
		if (e->has_manual) {
			if (!atomic_load_explicit(&e->polling, memory_order_relaxed) &&
			    !atomic_exchange(&e->polling, true)) {
				batch_wait_poll(e, b, start, end);
				batch_wait_unpoll(e);
				if (batch_is_terminal(b))
					break;
			} else {
				now = engine_now_ns();
				if (now >= end)
					break;
				atomic_fetch_add(&e->standby, 1);
				g_mutex_lock(&e->standby_lock);
				if (!batch_is_terminal(b) && atomic_load(&e->polling))
					g_cond_wait_until(
						&e->standby_cond, &e->standby_lock,
						g_get_monotonic_time() +
							(gint64)MIN((end - now) / 1000, 200));
				g_mutex_unlock(&e->standby_lock);
				atomic_fetch_sub(&e->standby, 1);
				continue;
			}
		}
		now = engine_now_ns();
		if (now >= end)
			break;
		atomic_fetch_add(&b->waiters, 1);
		g_mutex_lock(&b->wait_lock);
		if (!batch_is_terminal(b)) {
			/* With manual transports, wake up soon to drive them again. */
			uint64_t until = e->has_manual ? MIN(end, now + 200000) : end;
			gint64 mono = g_get_monotonic_time() +
				      (gint64)MIN((until - now) / 1000, (uint64_t)G_MAXINT32);

			g_cond_wait_until(&b->wait_cond, &b->wait_lock, mono);
		}
		g_mutex_unlock(&b->wait_lock);
		atomic_fetch_sub(&b->waiters, 1);
	}
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

/*
 * Give up on every live slice of @b with @status (only those past their deadline when
 * @only_expired). A slice no plugin holds ends now. One a plugin holds is canceled there and
 * ends when the plugin hands it back (batch_slice_done), so that a task is never reported
 * while its bytes may still move (a WRITE reported TIMEOUT or CANCELED never lands later);
 * a plugin that has not let go cancel_grace_ms after max(cancel, deadline) is reported
 * anyway, and the slice's memory stays pinned until the plugin lets go.
 */
static void batch_abort_slices(struct batch *b, enum te_status status, uint64_t now,
			       bool only_expired, uint64_t *next_deadline_out)
{
	struct engine *e = b->engine;
	uint64_t next = UINT64_MAX, grace_ns = e->cfg->cancel_grace_ms * 1000000ull;
	uint64_t stamp = now ? now : engine_now_ns();
	char first_late[TE_DETAIL_MAX] = "";
	uint32_t n_late = 0;

	/*
	 * First mark every slice given up on, then ask plugins to cancel: a plugin that fails
	 * other slices while canceling one (tcp aborts the connection that carries it) reports
	 * slices that already carry the core's outcome, not a FAILED of its own.
	 */
	for (struct slice_chunk *c = b->chunks; c; c = c->next) {
		for (uint32_t i = 0; i < c->n; i++) {
			struct slice *s = SLICE_AT(c, i);
			int32_t expect = 0;

			if (atomic_load_explicit(&s->term, memory_order_acquire))
				continue;
			if (only_expired && s->ps.deadline_ns > now) {
				next = MIN(next, s->ps.deadline_ns);
				continue;
			}
			/* The first reason wins: a cancel stays a cancel past the deadline. */
			if (atomic_compare_exchange_strong(&s->abort_status, &expect, status))
				atomic_store_explicit(&s->abort_ns, stamp, memory_order_relaxed);
		}
	}
	for (struct slice_chunk *c = b->chunks; c; c = c->next) {
		for (uint32_t i = 0; i < c->n; i++) {
			struct slice *s = SLICE_AT(c, i);
			char why[TE_DETAIL_MAX];
			uint32_t unsent = 0;
			uint64_t force_at;
			int32_t abort;

			if (atomic_load_explicit(&s->term, memory_order_acquire))
				continue;
			abort = atomic_load(&s->abort_status);
			if (!abort || (only_expired && s->ps.deadline_ns > now))
				continue;
			slice_abort_why(s, abort, why, sizeof(why));
			/* seq_cst: pairs with post() and batch_slice_done (in_plugin first). */
			if (!atomic_load(&s->in_plugin)) {
				slice_fail(s, abort, why);
				continue;
			}
			if (atomic_compare_exchange_strong(&s->cancel_sent, &unsent, 1)) {
				struct transport *tp = s->tp;

				/* The plugin may have just finished it: cancel tolerates that. */
				if (tp->serialized)
					g_mutex_lock(&tp->call_lock);
				(void)tp->plugin->ops.cancel(tp->inst, &s->ps);
				if (tp->serialized)
					g_mutex_unlock(&tp->call_lock);
			}
			force_at = MAX(atomic_load_explicit(&s->abort_ns, memory_order_relaxed),
				       s->ps.deadline_ns) +
				   grace_ns;
			if (now >= force_at && atomic_load(&s->in_plugin)) {
				char late[TE_DETAIL_MAX];

				snprintf(late, sizeof(late),
					 "%s; %s did not hand the slice back within %" PRIu64
					 " ms (its memory stays in use until it does)",
					 why, s->tp->plugin->name, e->cfg->cancel_grace_ms);
				/* One warning per batch and pass, not one per slice. */
				if (!n_late++)
					g_strlcpy(first_late, late, sizeof(first_late));
				slice_fail(s, abort, late);
			} else if (!atomic_load_explicit(&s->term, memory_order_acquire)) {
				next = MIN(next, force_at);
			}
		}
	}
	if (n_late == 1)
		ENGINE_LOG(e, TE_LOG_WARN, "%s", first_late);
	else if (n_late)
		ENGINE_LOG(e, TE_LOG_WARN, "%s (and %u more slices of this batch)", first_late,
			   n_late - 1);
	if (next_deadline_out)
		*next_deadline_out = next;
}

enum te_status batch_cancel(struct engine *e, te_batch_id id)
{
	struct batch *b;
	enum te_status st;

	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	atomic_store(&b->canceled, 1);
	batch_abort_slices(b, TE_ERR_CANCELED, 0, false, NULL);
	batch_unref(b);
	return TE_OK;
}

unsigned batch_check_deadlines(struct engine *e, uint64_t now)
{
	struct batch **list;
	uint32_t n = 0;
	unsigned expired = 0;

	if (atomic_load_explicit(&e->next_deadline_ns, memory_order_acquire) > now)
		return 0;
	atomic_store(&e->next_deadline_ns, UINT64_MAX);
	list = g_new(struct batch *, e->n_slots);
	g_mutex_lock(&e->slot_lock);
	for (uint32_t i = 0; i < e->n_slots; i++) {
		struct batch *b = e->slots[i].batch;

		if (!b || batch_is_terminal(b))
			continue;
		atomic_fetch_add(&b->refs, 1);
		list[n++] = b;
	}
	g_mutex_unlock(&e->slot_lock);
	for (uint32_t i = 0; i < n; i++) {
		struct batch *b = list[i];
		uint64_t next = UINT64_MAX;

		if (atomic_load(&b->min_deadline_ns) <= now) {
			batch_abort_slices(b, TE_ERR_TIMEOUT, now, true, &next);
			atomic_store(&b->min_deadline_ns, next);
			expired++;
		} else {
			next = atomic_load(&b->min_deadline_ns);
		}
		atomic_min_u64(&e->next_deadline_ns, next);
		batch_unref(b);
	}
	g_free(list);
	return expired;
}

enum te_status batch_free(struct engine *e, te_batch_id id)
{
	uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
	struct batch *b;

	g_mutex_lock(&e->slot_lock);
	if (slot >= e->n_slots || !e->slots[slot].batch || e->slots[slot].gen != gen) {
		g_mutex_unlock(&e->slot_lock);
		return log_error(TE_ERR_INVALID_HANDLE,
				 "te_batch_free: batch handle 0x%" PRIx64 " is not live", id);
	}
	b = e->slots[slot].batch;
	if (!batch_is_terminal(b)) {
		g_mutex_unlock(&e->slot_lock);
		return log_error(TE_ERR_BUSY,
				 "te_batch_free: batch has %u of %u tasks not terminal "
				 "(wait or cancel first)",
				 atomic_load(&b->n_tasks) - atomic_load(&b->n_terminal),
				 atomic_load(&b->n_tasks));
	}
	e->slots[slot].batch = NULL;
	e->slots[slot].gen = e->slots[slot].gen == UINT32_MAX ? 1 : e->slots[slot].gen + 1;
	e->slots[slot].next_free = e->free_head;
	e->free_head = slot;
	g_mutex_unlock(&e->slot_lock);
	/*
	 * Terminal, and no plugin holds a slice: memory and segments are free to go
	 * now, even if a plugin thread is still returning from slice_done (it touches
	 * only counters). post() re-checks term after setting in_plugin, so no slice
	 * can reach a plugin after this scan saw none there.
	 */
	if (!batch_plugin_holds_slices(b))
		batch_release_tasks(b);
	batch_unref(b);
	return TE_OK;
}

void batch_cancel_all(struct engine *e)
{
	for (uint32_t i = 0; i < e->n_slots; i++) {
		struct batch *b;

		g_mutex_lock(&e->slot_lock);
		b = e->slots[i].batch;
		if (b)
			atomic_fetch_add(&b->refs, 1);
		g_mutex_unlock(&e->slot_lock);
		if (!b)
			continue;
		atomic_store(&b->canceled, 1);
		batch_abort_slices(b, TE_ERR_CANCELED, 0, false, NULL);
		batch_unref(b);
	}
}

enum te_status batch_submit_notify(struct engine *e, te_batch_id id, const struct te_request *reqs,
				   size_t n, const void *msg, size_t len)
{
	g_autofree char *addr = NULL;
	te_segment_id seg = TE_SEGMENT_LOCAL;
	struct batch *b;
	enum te_status st;

	if (len > TE_NOTIFY_MAX || (len && !msg) || (n && !reqs))
		return log_error(TE_ERR_INVALID_ARG,
				 "te_batch_submit_notify: message of %zu bytes (max %u) or NULL "
				 "argument",
				 len, TE_NOTIFY_MAX);
	for (size_t i = 0; i < n; i++) {
		if (i == 0)
			seg = reqs[i].segment;
		if (reqs[i].segment != seg || seg == TE_SEGMENT_LOCAL)
			return log_error(TE_ERR_INVALID_ARG,
					 "te_batch_submit_notify: request %zu: all requests must "
					 "target one remote segment",
					 i);
	}
	if (n == 0)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_submit_notify: no requests");
	g_rw_lock_reader_lock(&e->seg_lock);
	{
		struct segment *s = segment_get_locked(e, seg);

		if (s && s->view->desc->rpc && *s->view->desc->rpc)
			addr = g_strdup(s->view->desc->rpc);
	}
	g_rw_lock_reader_unlock(&e->seg_lock);
	if (!addr)
		return log_error(TE_ERR_UNKNOWN_SEGMENT,
				 "te_batch_submit_notify: segment %u is not open or has no "
				 "control-plane address",
				 seg);
	st = engine_batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (b->notify_msg) {
		batch_unref(b);
		return log_error(TE_ERR_EXISTS, "te_batch_submit_notify: batch already has a "
						"notify");
	}
	b->notify_msg = g_bytes_new(msg, len);
	b->notify_addr = g_steal_pointer(&addr);
	st = batch_submit(e, id, reqs, n);
	if (st == TE_ERR_BATCH_FULL || st == TE_ERR_CANCELED) {
		/* Nothing was appended: disarm so a later call may try again. */
		g_bytes_unref(b->notify_msg);
		b->notify_msg = NULL;
		batch_unref(b);
		return st;
	}
	/* Armed after the tasks exist, so a completion in between cannot fire early. */
	atomic_store_explicit(&b->notify_state, 1, memory_order_release);
	batch_maybe_notify(b);
	batch_unref(b);
	return st;
}
