/* SPDX-License-Identifier: Apache-2.0 */
/* batch.c: batch handles (the slot table), batch lifetime and cache, task and slice outcomes. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/mem.h"
#include "core/segment.h"
#include "core/transport.h"


uint32_t batch_left(struct batch *b)
{
	/*
	 * The ended count first, then the task count: a task is counted (n_tasks) before it
	 * can end, so every task in this ended count is among these n. The other order let a
	 * thread that waits while another submits read an old n and the ends of newer tasks,
	 * and take a batch with tasks in flight for terminal.
	 */
	uint32_t ended = (uint32_t)BATCH_ENDED_N_TERMINAL(
		atomic_load_explicit(&b->n_ended, memory_order_acquire));
	uint32_t n = atomic_load_explicit(&b->n_tasks, memory_order_acquire);

	return n > ended ? n - ended : 0;
}

bool batch_is_terminal(struct batch *b)
{
	return batch_left(b) == 0;
}

static void batch_wake(struct batch *b)
{
	struct engine *e = b->engine;
	int32_t waiters = atomic_load(&b->waiters);

	if (waiters > 0) {
		/*
		 * Lock and unlock before signalling: a waiter is then either before its check
		 * of the terminal count (and sees it) or asleep on the condition. Signalling
		 * after the unlock spares the woken waiter a second sleep on the mutex the
		 * waker would still hold. One waiter (the usual case) needs no broadcast.
		 */
		g_mutex_lock(&b->wait_lock);
		g_mutex_unlock(&b->wait_lock);
		if (waiters == 1)
			g_cond_signal(&b->wait_cond);
		else
			g_cond_broadcast(&b->wait_cond);
	}
	/* Waiters standing by while another polls (te_batch_wait): few, woken together. */
	if (e)
		batch_wake_any(e);
}

void batch_wake_any(struct engine *e)
{
	if (atomic_load(&e->standby) > 0) {
		g_mutex_lock(&e->standby_lock);
		g_cond_broadcast(&e->standby_cond);
		g_mutex_unlock(&e->standby_lock);
	}
}

void batch_wait_terminal(struct batch *b, gint64 until_us)
{
	atomic_fetch_add(&b->waiters, 1);
	g_mutex_lock(&b->wait_lock);
	if (!batch_is_terminal(b))
		g_cond_wait_until(&b->wait_cond, &b->wait_lock, until_us);
	g_mutex_unlock(&b->wait_lock);
	atomic_fetch_sub(&b->waiters, 1);
}

void batch_wait_any(struct engine *e, struct batch *b, gint64 until_us)
{
	atomic_fetch_add(&e->standby, 1);
	g_mutex_lock(&e->standby_lock);
	if (!batch_is_terminal(b) && atomic_load(&e->polling))
		g_cond_wait_until(&e->standby_cond, &e->standby_lock, until_us);
	g_mutex_unlock(&e->standby_lock);
	atomic_fetch_sub(&e->standby, 1);
}

/* Fire an armed notify once the batch is terminal: sent only if all COMPLETED. */
void batch_maybe_notify(struct batch *b)
{
	uint32_t armed = 1;

	if (atomic_load_explicit(&b->notify_state, memory_order_acquire) != 1 ||
	    !batch_is_terminal(b))
		return;
	if (!atomic_compare_exchange_strong(&b->notify_state, &armed, 2))
		return;
	if (BATCH_ENDED_N_COMPLETED(atomic_load(&b->n_ended)) == atomic_load(&b->n_tasks))
		control_queue_notify(b->engine, b->notify_addr, b->notify_msg);
	else
		ENGINE_LOG(b->engine, TE_LOG_DEBUG, "notify to %s not sent: batch did not complete",
			   b->notify_addr);
}

void batch_ended(struct batch *b)
{
	batch_maybe_notify(b);
	batch_wake(b);
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

/* Finish @s with an error (if it is still live). */
void slice_fail(struct slice *s, enum te_status status, const char *detail)
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
void slice_abort_why(const struct slice *s, enum te_status status, char *buf, size_t len)
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

/* --- public operations ------------------------------------------------------ */

/* Drop what a run of @n tasks holds on @region, @seg and @view (each: NULL holds nothing). */
static void batch_release_run(struct mem_region *region, struct segment *seg, struct segview *view,
			      int32_t n)
{
	if (!n)
		return;
	if (region)
		atomic_fetch_sub_explicit(&region->refs, n, memory_order_release);
	if (seg)
		atomic_fetch_sub_explicit(&seg->busy, n, memory_order_release);
	if (view) {
		/* All but the last reference of the run: the view cannot end meanwhile. */
		if (n > 1)
			atomic_fetch_sub_explicit(&view->refs, n - 1, memory_order_release);
		segview_unref(view);
	}
}

/*
 * Release what the tasks pin (local regions, segments, views): once per batch,
 * either at te_batch_free when no plugin holds a slice any more, or at the last
 * reference otherwise (a transport still owns a timed-out slice).
 */
static void batch_release_tasks(struct batch *b)
{
	uint32_t n = atomic_load(&b->n_tasks);
	/*
	 * Runs of tasks on one region, segment and view: one atomic per run, not per task.
	 * NULL members (a rejected task, the local segment) hold nothing.
	 */
	struct mem_region *region = NULL;
	struct segment *seg = NULL;
	struct segview *view = NULL;
	int32_t run = 0;

	if (atomic_exchange(&b->tasks_released, 1))
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct task *t = &b->tasks[i];

		if (G_UNLIKELY(t->region != region || t->seg != seg || t->view != view)) {
			batch_release_run(region, seg, view, run);
			region = t->region;
			seg = t->seg;
			view = t->view;
			run = 0;
		}
		run++;
		t->view = NULL;
	}
	batch_release_run(region, seg, view, run);
}

static bool batch_plugin_holds_slices(struct batch *b)
{
	for (struct slice_chunk *c = b->chunks; c; c = c->next)
		for (uint32_t i = 0; i < c->n; i++)
			if (atomic_load(&SLICE_AT(c, i)->in_plugin))
				return true;
	return false;
}

/* Put @b (reset for reuse) into the engine's cache of batches; under cache_lock. */
static void batch_cache_put_locked(struct engine *e, struct batch *b)
{
	b->cache_next = e->cache;
	e->cache = b;
	e->n_cached++;
	e->cache_bytes += b->cache_bytes;
}

/*
 * Keep finished batches, their task arrays and largest slice chunk for reuse, up to
 * BATCH_CACHE_SIZE of them and BATCH_CACHE_MAX_BYTES together: te_batch_new + submit then
 * allocate nothing in a steady loop, whatever the batch size. Returns true when @b went to
 * the cache; else the caller frees what it holds.
 */
static bool batch_recycle(struct batch *b)
{
	struct engine *e = b->engine;
	struct slice_chunk *keep = NULL;
	bool kept;

	if (atomic_load(&e->stopping))
		return false;
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
	b->cache_bytes = (size_t)b->alloc_cap * sizeof(struct task) + (keep ? keep->cap : 0);
	if (b->notify_msg)
		g_bytes_unref(b->notify_msg);
	b->notify_msg = NULL;
	g_free(b->notify_addr);
	b->notify_addr = NULL;
	g_mutex_lock(&e->cache_lock);
	kept = e->n_cached < BATCH_CACHE_SIZE &&
	       e->cache_bytes + b->cache_bytes <= BATCH_CACHE_MAX_BYTES;
	if (kept) {
		atomic_fetch_sub(&e->live_batches, 1);
		batch_cache_put_locked(e, b);
	}
	g_mutex_unlock(&e->cache_lock);
	return kept;
}

/* Free a cached batch for good (engine teardown). */
static void batch_free_cached(struct batch *b)
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
	/* A COMPLETED task has no detail (one is set only with a failure or a rejection). */
	if (BATCH_ENDED_N_COMPLETED(atomic_load_explicit(&b->n_ended, memory_order_acquire)) != n)
		for (uint32_t i = 0; i < n; i++)
			g_free(b->tasks[i].detail);
	if (batch_recycle(b))
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
			e->cache_bytes -= b->cache_bytes;
			break;
		}
	}
	g_mutex_unlock(&e->cache_lock);
	if (!b)
		return NULL;
	/* Back to a new batch's state; te_batch_submit sets every field of a task it takes. */
	b->slot = 0;
	b->chunks = NULL;
	b->cache_next = NULL;
	atomic_store(&b->n_tasks, 0);
	atomic_store(&b->n_ended, 0);
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
	bool cached;

	if (!id_out)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_new: batch_out is NULL");
	if (capacity == 0)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_new: capacity is 0");
	if (capacity > e->cfg->max_batch_size)
		return log_error(TE_ERR_TOO_LARGE,
				 "te_batch_new: capacity %u exceeds transfer.max_batch_size %u",
				 capacity, e->cfg->max_batch_size);
	b = batch_from_cache(e, capacity);
	cached = b != NULL;
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
		/* One from the cache goes back there, its slice chunk with it (it leaked). */
		if (cached) {
			g_mutex_lock(&e->cache_lock);
			batch_cache_put_locked(e, b);
			g_mutex_unlock(&e->cache_lock);
		} else {
			batch_free_cached(b);
		}
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
	st = batch_get(e, id, &b);
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
	uint64_t ended;
	uint32_t n;

	if (!info_out)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_status: info_out is NULL");
	st = batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	memset(info_out, 0, sizeof(*info_out));
	/*
	 * One snapshot, while other threads may submit to the batch and end its tasks:
	 * - one read of the ended count for the state and the completed count (a task ending
	 *   between two reads made a COMPLETED batch with fewer tasks completed);
	 * - the failure counts after it: a task counts its failure before it ends (batch.h),
	 *   so those of a terminal batch are final;
	 * - the task count before and after both: a task is counted (n_tasks) before it can
	 *   end, so when no submit came in between, every task those counts hold is one of
	 *   these n. Reading the task count once, first, let a submit in between show more
	 *   tasks ended than the batch has, and a batch with tasks in flight as terminal.
	 * Each repeat follows a submit, and a batch takes at most `capacity` of them.
	 */
	do {
		n = atomic_load_explicit(&b->n_tasks, memory_order_acquire);
		ended = atomic_load_explicit(&b->n_ended, memory_order_acquire);
		info_out->completed = BATCH_ENDED_N_COMPLETED(ended);
		info_out->failed = atomic_load(&b->n_failed);
		info_out->timed_out = atomic_load(&b->n_timeout);
		info_out->canceled = atomic_load(&b->n_canceled);
		atomic_thread_fence(memory_order_acquire);
	} while (atomic_load_explicit(&b->n_tasks, memory_order_relaxed) != n);
	info_out->tasks = n;
	for (uint32_t i = 0; i < n; i++)
		info_out->bytes += atomic_load_explicit(&b->tasks[i].bytes, memory_order_relaxed);
	if (BATCH_ENDED_N_TERMINAL(ended) < n) {
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

enum te_status batch_result(struct batch *b)
{
	/* Completed count first, then the task count (batch_left: a submit may come in between). */
	uint32_t completed =
		BATCH_ENDED_N_COMPLETED(atomic_load_explicit(&b->n_ended, memory_order_acquire));
	uint32_t n = atomic_load_explicit(&b->n_tasks, memory_order_acquire);

	if (completed == n)
		return TE_OK;

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
				 atomic_load(&b->n_tasks) -
					 BATCH_ENDED_N_TERMINAL(atomic_load(&b->n_ended)),
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

enum te_status batch_get(struct engine *e, te_batch_id id, struct batch **batch_out)
{
	uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
	struct batch *b;

	g_mutex_lock(&e->slot_lock);
	if (slot >= e->n_slots || !e->slots[slot].batch || e->slots[slot].gen != gen) {
		g_mutex_unlock(&e->slot_lock);
		return log_error(TE_ERR_INVALID_HANDLE,
				 "batch handle 0x%016" PRIx64 " is not a live batch", id);
	}
	b = e->slots[slot].batch;
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	g_mutex_unlock(&e->slot_lock);
	*batch_out = b;
	return TE_OK;
}


void batch_table_init(struct engine *e)
{
	g_mutex_init(&e->slot_lock);
	g_mutex_init(&e->cache_lock);
	g_mutex_init(&e->standby_lock);
	g_cond_init(&e->standby_cond);
	e->n_slots = e->cfg->max_batches;
	e->slots = g_new0(struct batch_slot, e->n_slots);
	for (uint32_t i = 0; i < e->n_slots; i++) {
		e->slots[i].gen = 1;
		e->slots[i].next_free = i + 1 < e->n_slots ? i + 1 : UINT32_MAX;
	}
	e->free_head = e->n_slots ? 0 : UINT32_MAX;
}

void batch_table_fini(struct engine *e)
{
	for (uint32_t i = 0; e->slots && i < e->n_slots; i++) {
		/* Batches the user never freed: drop the handle reference. */
		struct batch *b = e->slots[i].batch;

		e->slots[i].batch = NULL;
		if (b)
			batch_unref(b);
	}
}

/* Free the cache and the table (after every batch is gone or abandoned). */
void batch_table_clear(struct engine *e)
{
	while (e->cache) {
		struct batch *b = e->cache;

		e->cache = b->cache_next;
		batch_free_cached(b);
	}
	g_free(e->slots);
	e->slots = NULL;
	g_mutex_clear(&e->cache_lock);
	g_mutex_clear(&e->slot_lock);
	g_mutex_clear(&e->standby_lock);
	g_cond_clear(&e->standby_cond);
}

struct batch **batch_list_live(struct engine *e, bool all, uint32_t *n_out)
{
	struct batch **list = g_new(struct batch *, e->n_slots + 1);
	uint32_t n = 0;

	g_mutex_lock(&e->slot_lock);
	for (uint32_t i = 0; i < e->n_slots; i++) {
		struct batch *b = e->slots[i].batch;

		if (!b || (!all && batch_is_terminal(b)))
			continue;
		atomic_fetch_add(&b->refs, 1);
		list[n++] = b;
	}
	g_mutex_unlock(&e->slot_lock);
	*n_out = n;
	return list;
}
