/* SPDX-License-Identifier: Apache-2.0 */
/* batch.h: batches, tasks and slices, and the slice completion path. */
#ifndef TE_CORE_BATCH_H
#define TE_CORE_BATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

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
	_Atomic uint32_t n_tasks;
	_Atomic uint32_t n_terminal;
	_Atomic uint32_t n_completed, n_failed, n_timeout, n_canceled;
	_Atomic uint64_t min_deadline_ns;
	_Atomic uint32_t canceled;
	_Atomic uint32_t tasks_released; /* regions/segments/views let go (once) */
	/* 1 for the user handle + 1 per slice not yet released + temporary users. */
	_Atomic int64_t refs;
	struct slice_chunk *chunks;
	/* Notify armed by te_batch_submit_notify: 0 none, 1 armed, 2 fired or dropped. */
	_Atomic uint32_t notify_state;
	GBytes *notify_msg;
	char *notify_addr;
	GMutex wait_lock;
	GCond wait_cond;
	_Atomic int32_t waiters;
};

/* Public-API implementations (engine.c validates the engine pointer). */
enum te_status batch_new(struct engine *e, uint32_t capacity, te_batch_id *id_out);
enum te_status batch_submit(struct engine *e, te_batch_id id, const struct te_request *reqs,
			    size_t n);
enum te_status batch_task_status(struct engine *e, te_batch_id id, uint32_t task,
				 struct te_task_info *info_out);
enum te_status batch_status(struct engine *e, te_batch_id id, struct te_batch_info *info_out);
enum te_status batch_wait(struct engine *e, te_batch_id id, int64_t timeout_ns);
enum te_status batch_cancel(struct engine *e, te_batch_id id);
enum te_status batch_free(struct engine *e, te_batch_id id);
enum te_status batch_submit_notify(struct engine *e, te_batch_id id, const struct te_request *reqs,
				   size_t n, const void *msg, size_t len);

/* Host service: a plugin finished one slice attempt. */
void batch_slice_done(struct transport *tp, struct te_plugin_slice *ps, enum te_status status,
		      uint64_t bytes, const char *detail);

/* Worker duties. */
unsigned batch_check_deadlines(struct engine *e, uint64_t now_ns);
void batch_submit_slices(struct engine *e, struct transport *tp, struct slice **slices, uint32_t n);
void batch_release_slice(struct slice *s);

/* Worker/waiter: resubmit what back-pressure left behind; returns slices consumed. */
unsigned batch_drain_backlog(struct engine *e, struct transport *tp);

/* Worker: the retry of @s is due. */
void batch_retry_slice(struct engine *e, struct slice *s);

/* Batches kept for reuse per engine, and the largest task array kept. */
#define BATCH_CACHE_SIZE 64
#define BATCH_CACHE_MAX_CAP 4096

/* Free a batch from the engine's cache (teardown). */
void batch_free_cached(struct batch *b);

/* Drop a batch reference (frees on the last one). */
void batch_unref(struct batch *b);

/* Cancel and release every batch still alive (engine teardown). */
void batch_cancel_all(struct engine *e);

#endif /* TE_CORE_BATCH_H */
