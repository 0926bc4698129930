/* SPDX-License-Identifier: Apache-2.0 */
/* batch.h: batches, tasks and slices: handles, lifetime and outcome accounting. */
#ifndef TE_CORE_BATCH_H
#define TE_CORE_BATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>
#include <te/te_plugin.h>

struct engine;
struct transport;
struct mem_region;
struct segview;
struct segment;
struct task;
struct batch;

/* Task "bad" bits, in precedence order for the derived state. */
#define TASK_BAD_FAILED (1u << 0)
#define TASK_BAD_TIMEOUT (1u << 1)
#define TASK_BAD_CANCELED (1u << 2)

struct slice {
	struct te_plugin_slice ps; /* what the plugin sees */
	struct task *task;
	struct transport *tp;
	struct slice *next; /* backlog / retry list link */
	uint64_t retry_at_ns;
	_Atomic uint32_t term;	    /* 0 live; 1 its terminal outcome is accounted */
	_Atomic uint32_t in_plugin; /* 1 while a plugin owns the current attempt */
	/*
	 * TE_ERR_TIMEOUT or TE_ERR_CANCELED once the core gave up on the slice while a plugin
	 * held it (0 before): the outcome it ends with when the plugin hands it back, or when
	 * cancel_grace_ms passes (abort_ns: when the core asked).
	 */
	_Atomic int32_t abort_status;
	_Atomic uint64_t abort_ns;
	_Atomic uint32_t cancel_sent; /* 1 once the plugin's cancel was called for the abort */
	uint32_t seg_tp;	      /* index of tp in the segview */
	/*
	 * Staged (core/stage.c): the transport gets a bounce buffer instead of this slice's
	 * local memory (stage_local, a GPU's). bounce: the buffer held from posting until the
	 * plugin hands the slice back (UINT32_MAX: none).
	 */
	bool staged;
	uint32_t bounce;
	void *stage_local;
};

/*
 * Zero the @size private bytes of @s (if any) before its first attempt on a transport (first
 * submit, fallback to another): a plugin starts from zeroes, and a retry on the same transport
 * finds what the plugin left there.
 */
static inline void batch_slice_clear_priv(struct slice *s, uint32_t size)
{
	char *p = s->ps.priv;
	uint32_t off = 0;

	/*
	 * Inlined in steps of 16 and 8 bytes (priv is small: a libc call costs more than the
	 * stores). The slice stride rounds sizeof(struct slice) + the largest priv size up to
	 * 64, a multiple of 8: @size rounded up to 8 still fits.
	 */
	if (!p)
		return;
	for (; off + 16 <= size; off += 16)
		memset(p + off, 0, 16);
	if (off < size)
		memset(p + off, 0, 8);
	if (off + 8 < size)
		memset(p + off + 8, 0, 8);
}

struct task {
	struct batch *batch;
	struct mem_region *region; /* local region (ref held until reclaim) */
	struct segview *view;	   /* remote view (ref held until reclaim) */
	struct segment *seg;	   /* for busy accounting */
	struct transport *tp;
	uint64_t length;
	uint32_t n_slices;
	uint32_t opcode;
	_Atomic uint32_t done;	 /* slices with a terminal outcome */
	_Atomic uint32_t bad;	 /* TASK_BAD_* */
	_Atomic uint32_t posted; /* 1 once a slice reached a plugin */
	_Atomic uint32_t retries;
	_Atomic uint32_t last_device;
	_Atomic uint64_t bytes;
	_Atomic int32_t status;	  /* first failure, published after detail */
	_Atomic uint32_t claimed; /* 1 once a failure owns status/detail */
	char *detail;		  /* written once by the claim winner */
	bool invalid;		  /* rejected at submit */
	bool staged;		  /* tp moves host bounce buffers for its local memory */
};

struct slice_chunk {
	struct slice_chunk *next;
	uint32_t n;
	size_t stride;
	size_t cap; /* bytes allocated, header included */
	char data[];
};

struct batch {
	struct engine *engine;
	uint32_t slot;
	uint32_t capacity;
	uint32_t alloc_cap; /* tasks allocated (>= capacity when recycled) */
	struct task *tasks;
	struct slice_chunk *spare; /* kept from a previous life for reuse */
	struct batch *cache_next;
	size_t cache_bytes; /* task array and spare chunk, while cached (engine->cache_bytes) */
	_Atomic uint32_t n_tasks;
	/*
	 * Tasks terminal (low 32 bits) and, among them, COMPLETED (high 32 bits): one atomic
	 * add per task that completes (BATCH_ENDED_*). n_tasks < 2^32, so the halves never carry.
	 */
	_Atomic uint64_t n_ended;
	_Atomic uint32_t n_failed, n_timeout, n_canceled;
	_Atomic uint64_t min_deadline_ns;
	_Atomic uint32_t canceled;
	_Atomic uint32_t tasks_released; /* regions/segments/views let go (once) */
	/* 1 for the user handle + 1 per slice not yet released + temporary users. */
	_Atomic int64_t refs;
	/*
	 * Slice chunks, newest first. A submit links its chunk only once its slices are built
	 * and its tasks counted (n_tasks): cancel and the deadline check walk the list from any
	 * thread (seq_cst, with b->canceled).
	 */
	struct slice_chunk *_Atomic chunks;
	/* Notify armed by te_batch_submit_notify: 0 none, 1 armed, 2 fired or dropped. */
	_Atomic uint32_t notify_state;
	GBytes *notify_msg;
	char *notify_addr;
	GMutex wait_lock;
	GCond wait_cond;
	_Atomic int32_t waiters;
};

#define BATCH_ENDED_TERMINAL 1ull
#define BATCH_ENDED_COMPLETED (1ull << 32)
#define BATCH_ENDED_N_TERMINAL(v) ((uint32_t)(v))
#define BATCH_ENDED_N_COMPLETED(v) ((uint32_t)((v) >> 32))

#define SLICE_AT(chunk, i) ((struct slice *)((chunk)->data + (size_t)(i) * (chunk)->stride))
#define SLICE_OF(ps) ((struct slice *)(void *)(ps)) /* ps is the first member */

/* The handle table (engine->slots, slot_lock, free_head) and the batch cache are this
 * module's: only batch.c reads or writes them. */
void batch_table_init(struct engine *e);
/* Drop the handle reference of every batch the user never freed. */
void batch_table_fini(struct engine *e);
/* Free the batch cache and the table itself (last). */
void batch_table_clear(struct engine *e);

/* Public-API implementations (engine.c validates the engine pointer). */
enum te_status batch_new(struct engine *e, uint32_t capacity, te_batch_id *id_out);
enum te_status batch_task_status(struct engine *e, te_batch_id id, uint32_t task,
				 struct te_task_info *info_out);
enum te_status batch_status(struct engine *e, te_batch_id id, struct te_batch_info *info_out);
enum te_status batch_free(struct engine *e, te_batch_id id);

/* Look up a live batch by handle, taking a reference (batch_unref). */
TE_NODISCARD enum te_status batch_get(struct engine *e, te_batch_id id, struct batch **batch_out);

/* Every live batch (terminal ones too when @all), each with a reference; g_free the array. */
struct batch **batch_list_live(struct engine *e, bool all, uint32_t *n_out);

/* Drop a batch reference (frees on the last one). */
void batch_unref(struct batch *b);

/* Whether every task submitted so far is terminal. */
bool batch_is_terminal(struct batch *b);
/* Tasks of @b not terminal yet. */
uint32_t batch_left(struct batch *b);

/* TE_OK if every task COMPLETED, else the first failure's status (its detail logged). */
enum te_status batch_result(struct batch *b);

/* Fire an armed notify once the batch is terminal (sent only if all COMPLETED). */
void batch_maybe_notify(struct batch *b);

/*
 * Waiting for batches to end: on @b (batch_wait_terminal) or, standing by while another
 * thread polls, on any batch (batch_wait_any); both until g_get_monotonic_time() @until_us.
 */
void batch_wait_terminal(struct batch *b, gint64 until_us);
void batch_wait_any(struct engine *e, struct batch *b, gint64 until_us);
/* Wake the threads in batch_wait_any. */
void batch_wake_any(struct engine *e);

/* The last task of @b ended: fire its notify, wake its waiters. */
void batch_ended(struct batch *b);

/* Outcomes: a task became terminal (account it in its batch). Inline: once per task. */
static inline void task_terminal(struct task *t)
{
	struct batch *b = t->batch;
	uint32_t bad = atomic_load_explicit(&t->bad, memory_order_acquire);
	uint64_t add = BATCH_ENDED_TERMINAL;
	uint32_t term;

	if (G_UNLIKELY(t->invalid || (bad & TASK_BAD_FAILED)))
		atomic_fetch_add_explicit(&b->n_failed, 1, memory_order_relaxed);
	else if (G_UNLIKELY(bad & TASK_BAD_TIMEOUT))
		atomic_fetch_add_explicit(&b->n_timeout, 1, memory_order_relaxed);
	else if (G_UNLIKELY(bad & TASK_BAD_CANCELED))
		atomic_fetch_add_explicit(&b->n_canceled, 1, memory_order_relaxed);
	else
		add |= BATCH_ENDED_COMPLETED; /* the common case: one atomic add per task */
	/* seq_cst pairs with the waiter's increment of b->waiters (no lost wake-up). */
	term = BATCH_ENDED_N_TERMINAL(atomic_fetch_add(&b->n_ended, add) + add);
	if (term >= atomic_load_explicit(&b->n_tasks, memory_order_acquire))
		batch_ended(b);
}

/* Claim the terminal outcome of @s; false if someone else already did. */
static inline bool slice_claim(struct slice *s)
{
	uint32_t expect = 0;

	return atomic_compare_exchange_strong_explicit(&s->term, &expect, 1, memory_order_acq_rel,
						       memory_order_acquire);
}

/* @s (claimed) ended: count it in its task. */
static inline void slice_count_done(struct slice *s)
{
	struct task *t = s->task;

	/* A task of one slice: the claim made this thread its only counter, no add needed. */
	if (t->n_slices == 1) {
		atomic_store_explicit(&t->done, 1, memory_order_release);
		task_terminal(t);
	} else if (atomic_fetch_add_explicit(&t->done, 1, memory_order_acq_rel) + 1 ==
		   t->n_slices) {
		task_terminal(t);
	}
}

/* Finish @s with an error (if it is still live). */
void slice_fail(struct slice *s, enum te_status status, const char *detail);
/* Why the core gave up on @s (deadline or te_batch_cancel), for its task's detail. */
void slice_abort_why(const struct slice *s, enum te_status status, char *buf, size_t len);
/* Drop the batch reference @s holds. */
void batch_release_slice(struct slice *s);

/*
 * Batches kept for reuse per engine, and the bytes they may hold together (task arrays and
 * slice chunks). A batch of 32768 4 KiB requests over tcp holds about 12 MiB: reused rather
 * than allocated and page-faulted again, READ 4K x32768 from 2 threads ran 1.04-1.09x
 * (bench/README.md, "Measured (issue 18), 2026-12-05 16:59-18:40").
 */
#define BATCH_CACHE_SIZE 64
#define BATCH_CACHE_MAX_BYTES ((size_t)64 << 20)

static inline void atomic_min_u64(_Atomic uint64_t *p, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);

	while (v < cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_acq_rel,
								 memory_order_relaxed))
		;
}

#endif /* TE_CORE_BATCH_H */
