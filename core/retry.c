/* SPDX-License-Identifier: Apache-2.0 */
/* retry.c: the core's retry policy: backoff, the retry queue, quarantine, fallback, deadlines. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/batch.h"
#include "core/engine.h"
#include "core/mem.h"
#include "core/retry.h"
#include "core/segment.h"
#include "core/stage.h"
#include "core/transport.h"
#include "core/wake.h"


void retry_queue(struct engine *e, struct slice *s)
{
	struct slice **pp;

	g_mutex_lock(&e->work_lock);
	for (pp = &e->retry_head; *pp && (*pp)->retry_at_ns <= s->retry_at_ns; pp = &(*pp)->next)
		;
	s->next = *pp;
	*pp = s;
	atomic_store(&e->retry_pending, true);
	g_cond_signal(&e->work_cond);
	g_mutex_unlock(&e->work_lock);
}

bool retry_due_locked(struct engine *e, uint64_t now)
{
	return e->retry_head && e->retry_head->retry_at_ns <= now;
}

void retry_drop_all(struct engine *e)
{
	/* Retries never to be run: release their batch references. */
	while (e->retry_head) {
		struct slice *s = e->retry_head;

		e->retry_head = s->next;
		batch_release_slice(s);
	}
	atomic_store(&e->retry_pending, false);
}

void retry_note_deadline(struct engine *e, uint64_t deadline_ns)
{
	atomic_min_u64(&e->next_deadline_ns, deadline_ns);
}

uint64_t retry_next_deadline(struct engine *e)
{
	return atomic_load(&e->next_deadline_ns);
}

/* Retries whose time has come, unlinked: the caller resubmits them outside the lock. */
struct slice *retry_take_due(struct engine *e, uint64_t now, uint64_t *next_out)
{
	struct slice *due = NULL, **tail = &due;

	/* Racy peek (only the worker pops; a miss is caught on the next round). */
	if (!atomic_load_explicit(&e->retry_pending, memory_order_acquire)) {
		*next_out = UINT64_MAX;
		return NULL;
	}
	g_mutex_lock(&e->work_lock);
	while (e->retry_head && e->retry_head->retry_at_ns <= now) {
		struct slice *s = e->retry_head;

		e->retry_head = s->next;
		s->next = NULL;
		*tail = s;
		tail = &s->next;
	}
	*next_out = e->retry_head ? e->retry_head->retry_at_ns : UINT64_MAX;
	atomic_store(&e->retry_pending, e->retry_head != NULL);
	g_mutex_unlock(&e->work_lock);
	return due;
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
		s->ps.priv = to->caps.slice_priv_size ? (char *)s + sizeof(*s) : NULL;
		batch_slice_clear_priv(s, to->caps.slice_priv_size);
		s->ps.attempt++;
		atomic_fetch_add_explicit(&t->retries, 1, memory_order_relaxed);
		/* Reported transport: the one that carries the task now. */
		t->tp = to;
		s->retry_at_ns = now;
		retry_queue(e, s);
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

bool retry_plan(struct engine *e, struct slice *s, enum te_status status, const char *detail)
{
	struct te_plugin_slice *ps = &s->ps;
	struct transport *tp = s->tp;
	struct task *t = s->task;
	struct batch *b = t->batch;
	uint64_t now = engine_now_ns();
	uint64_t backoff_us = e->cfg->retry_backoff_us;

	/* Exhausted resources (or a transport's own reset) say nothing about the path. */
	if (status != TE_ERR_AGAIN)
		device_failed(e, tp, ps->device, status, detail);
	for (uint32_t i = 0; i < ps->attempt && backoff_us < e->cfg->retry_backoff_max_us; i++)
		backoff_us *= 2;
	backoff_us = MIN(backoff_us, e->cfg->retry_backoff_max_us);
	if (!atomic_load_explicit(&s->term, memory_order_acquire) &&
	    !atomic_load_explicit(&b->canceled, memory_order_acquire) &&
	    ps->attempt < e->cfg->retries && now + backoff_us * 1000 < ps->deadline_ns) {
		ps->attempt++;
		/* priv keeps what the plugin wrote: it may remember why the attempt failed. */
		atomic_fetch_add_explicit(&t->retries, 1, memory_order_relaxed);
		if (tp->n_devices > 1 && ps->device < 64 &&
		    !(tp->caps.flags & TE_PLUGIN_CAP_FIXED_DEVICES)) {
			uint64_t all =
				tp->n_devices >= 64 ? UINT64_MAX : (1ull << tp->n_devices) - 1;

			ps->excluded_devices |= 1ull << ps->device;
			if ((ps->excluded_devices & all) == all)
				ps->excluded_devices = 0; /* every path failed once */
		}
		s->retry_at_ns = now + backoff_us * 1000;
		ENGINE_LOG(e, TE_LOG_DEBUG, "%s: retry %u of slice at 0x%" PRIx64 ": %s",
			   tp->plugin->name, ps->attempt, ps->remote,
			   detail ? detail : te_status_str(status));
		retry_queue(e, s); /* keeps the slice's batch reference */
		return true;
	}
	return false;
}

bool retry_fallback(struct engine *e, struct slice *s, enum te_status status, const char *detail)
{
	return status_path_dead(status) && slice_fallback(e, s, status, detail, engine_now_ns());
}

/*
 * Give up on every live slice of @b with @status (only those past their deadline when
 * @only_expired). A slice no plugin holds ends now. One a plugin holds is canceled there and
 * ends when the plugin hands it back (slice_done), so that a task is never reported
 * while its bytes may still move (a WRITE reported TIMEOUT or CANCELED never lands later);
 * a plugin that has not let go cancel_grace_ms after max(cancel, deadline) is reported
 * anyway, and the slice's memory stays pinned until the plugin lets go.
 */
static void abort_slices(struct batch *b, enum te_status status, uint64_t now, bool only_expired,
			 uint64_t *next_deadline_out)
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
	for (struct slice_chunk *c = atomic_load(&b->chunks); c; c = c->next) {
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
	for (struct slice_chunk *c = atomic_load(&b->chunks); c; c = c->next) {
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
			/* seq_cst: pairs with post() and slice_done (in_plugin first). */
			if (!atomic_load(&s->in_plugin)) {
				slice_fail(s, abort, why);
				continue;
			}
			if (atomic_compare_exchange_strong(&s->cancel_sent, &unsent, 1)) {
				struct transport *tp = s->tp;

				/* The plugin may have just finished it: cancel tolerates that. */
				(void)transport_cancel(tp, &s->ps);
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

enum te_status retry_cancel(struct engine *e, te_batch_id id)
{
	struct batch *b;
	enum te_status st;

	st = batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	atomic_store(&b->canceled, 1);
	abort_slices(b, TE_ERR_CANCELED, 0, false, NULL);
	batch_unref(b);
	return TE_OK;
}

void retry_cancel_all(struct engine *e)
{
	uint32_t n;
	struct batch **list = batch_list_live(e, true, &n);

	for (uint32_t i = 0; i < n; i++) {
		atomic_store(&list[i]->canceled, 1);
		abort_slices(list[i], TE_ERR_CANCELED, 0, false, NULL);
		batch_unref(list[i]);
	}
	g_free(list);
}

unsigned retry_check_deadlines(struct engine *e, uint64_t now)
{
	struct batch **list;
	uint32_t n = 0;
	unsigned expired = 0;

	if (atomic_load_explicit(&e->next_deadline_ns, memory_order_acquire) > now)
		return 0;
	atomic_store(&e->next_deadline_ns, UINT64_MAX);
	list = batch_list_live(e, false, &n);
	for (uint32_t i = 0; i < n; i++) {
		struct batch *b = list[i];
		uint64_t next = UINT64_MAX;

		if (atomic_load(&b->min_deadline_ns) <= now) {
			abort_slices(b, TE_ERR_TIMEOUT, now, true, &next);
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
