/* SPDX-License-Identifier: Apache-2.0 */
/* engine.h: the engine object shared by the core modules. */
#ifndef TE_CORE_ENGINE_H
#define TE_CORE_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <glib.h>

#include <te/te.h>

#include "core/config.h"
#include "core/log.h"
#include "core/mem.h"

struct transport;
struct segment;
struct metadata;
struct rpc_server;
struct rpc_client;
struct batch;
struct slice;
struct segview;
struct descriptor;

struct batch_slot {
	struct batch *batch; /* NULL: free */
	uint32_t gen;	     /* bumped on every free; part of the handle */
	uint32_t next_free;
};

/*
 * The engine: what te_engine_new wires together. Each group of fields has one owner, the
 * module named beside it: only that module writes it (or takes its lock).
 */
struct engine {
	struct config *cfg;
	struct log_sink log;
	char *name;
	uint64_t generation;
	char *host_id;
	char *pid_ns; /* this process's pid namespace ("pid:[N]") or NULL when unknown */

	/* Transports in priority order (engine.c, at start). */
	struct transport **tps;
	unsigned n_tps;
	uint32_t slice_stride; /* sizeof(struct slice) + largest priv, aligned */

	struct mem_table mem;

	/* Segments: index == id; 0 unused (local) (segment.c). */
	GRWLock seg_lock;
	GPtrArray *segments;

	/* View of our own segment for requests to segment 0 (segment.c). */
	GMutex local_lock;
	struct segview *local_view;
	uint64_t local_view_version;

	/* Per transport: slice size after caps and YAML. */
	uint64_t *slice_size;

	/* Earliest slice deadline of any live batch (retry.c; the worker scans when passed). */
	_Atomic uint64_t next_deadline_ns;

	/*
	 * This engine's own descriptor, for the layers below segment.c that serve or publish
	 * it (control.c, metadata/); set by engine.c before control_start.
	 */
	struct descriptor *(*describe_local)(struct engine *e);

	/*
	 * Control plane, metadata and notifies (core/control.c; md is metadata.c's, opened and
	 * closed by engine.c around control_start/control_stop).
	 */
	/* auth shared secret: secret_len bytes (any byte, NUL included), or NULL: no auth */
	char *secret;
	size_t secret_len;
	struct rpc_server *rpc;
	char *advertise; /* "host:port" peers reach the listener at (control_address) */
	struct rpc_client *rpc_client;
	struct metadata *md;
	_Atomic uint32_t refresh_pending; /* segments flagged stale */
	_Atomic uint64_t refreshes;	  /* descriptors fetched for them (segment_refresh_stale) */
	GMutex notify_lock;
	GQueue *inbox;		/* struct inbox_msg * received (core/control.c) */
	GHashTable *inbox_seen; /* dedup keys "host/sender/gen/seq" */
	GQueue *inbox_seen_order;
	struct control_quota *inbox_quota; /* notifies held per source (core/control.c) */
	GQueue *outbox;			   /* notifies to send */
	_Atomic uint64_t notify_seq;

	/* te_mem_alloc's allocations: pointer -> kind (core/memkind.c). */
	GMutex alloc_lock;
	GHashTable *allocs;

	/* Finished batches kept for reuse (batch.c). */
	GMutex cache_lock;
	struct batch *cache;
	unsigned n_cached;
	size_t cache_bytes; /* their task arrays and slice chunks: BATCH_CACHE_MAX_BYTES */

	/* Batch handles (batch.c). */
	GMutex slot_lock;
	struct batch_slot *slots;
	uint32_t n_slots;
	uint32_t free_head; /* UINT32_MAX: none */
	_Atomic uint32_t live_batches;

	/* Workers (progress.c); the doorbell work_lock/work_cond/sleeping (wake.c). */
	GThread *worker;
	GThread **extra; /* transfer.worker_threads - 1 manual-progress helpers */
	unsigned n_extra;
	_Atomic bool stopping;
	GMutex work_lock;
	GCond work_cond;
	_Atomic uint32_t sleeping;  /* worker is (about to be) waiting on work_cond */
	struct slice *retry_head;   /* retry.c: under work_lock, sorted by retry_at_ns */
	_Atomic bool retry_pending; /* retry_head != NULL, readable without the lock */
	bool has_manual;
	/* Threads driving manual progress in te_batch_wait: the worker stays out (wake.c). */
	_Atomic uint32_t drivers;
	_Atomic uint64_t last_drive_ns;
	/* te_batch_wait: one waiter polls manual transports (progress.c), the others stand by
	 * (batch.c: batch_wait_any) */
	_Atomic bool polling;
	/*
	 * Hybrid transports that serve each waiter's own work (per_thread): waiters polling now,
	 * at most max_pollers (transfer.max_pollers; by default half the CPUs: the rest is for
	 * the plugins' threads and peers).
	 */
	_Atomic uint32_t pollers;
	uint32_t max_pollers;
	/*
	 * Threads in te_batch_wait on such an engine. More of them than max_pollers (crowded):
	 * none polls until crowded_until_ns, crowded_hold_ns after the last time that was
	 * seen; the plugins' threads serve them all (progress.c: progress_crowded).
	 */
	_Atomic uint32_t waiters;
	_Atomic uint64_t crowded_until_ns;
	uint64_t crowded_hold_ns; /* PROGRESS_CROWDED_HOLD_NS (tests may change it) */
	bool per_thread;
	_Atomic uint64_t manual_work_ns; /* when the poller last saw a completion */
	_Atomic uint32_t standby;
	GMutex standby_lock;
	GCond standby_cond;
};

/* Monotonic clock in ns. */
static inline uint64_t engine_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Public entry points: the engine from its public type, last error cleared. */
#define ENGINE_OR_FAIL(eng, fn)                                                                    \
	struct engine *e = (struct engine *)(eng);                                                 \
	log_clear_error();                                                                         \
	if (!e)                                                                                    \
	return log_error(TE_ERR_INVALID_ARG, fn ": engine is NULL")

#define ENGINE_LOG(e, lvl, ...) log_msg((e) ? &(e)->log : NULL, (lvl), __VA_ARGS__)

#endif /* TE_CORE_ENGINE_H */
