/* SPDX-License-Identifier: Apache-2.0 */
/* te.h: the public API of the te transfer engine. */
#ifndef TE_H
#define TE_H

#include <stddef.h>
#include <stdint.h>

#include <te/te_status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_VERSION_MAJOR 0
#define TE_VERSION_MINOR 1

/*
 * te_version - the version of the libte in use, "MAJOR.MINOR.PATCH" (the project version it
 * was built from), for logs and for checking it against the TE_VERSION_MAJOR/MINOR of the
 * header an application was built with. A constant string; any thread.
 */
TE_API const char *te_version(void);

/* Longest detail text kept for a failure, including the NUL. */
#define TE_DETAIL_MAX 256

/* One engine per process (more are allowed, e.g. in tests). Opaque. */
struct te_engine;

/* Batch handle: slot index and generation; a stale or forged value is rejected. */
typedef uint64_t te_batch_id;

/* Segment id: 0 is the local segment; remote segments get ids from te_segment_open. */
typedef uint32_t te_segment_id;

#define TE_SEGMENT_LOCAL ((te_segment_id)0)

enum te_log_level {
	TE_LOG_ERROR = 0,
	TE_LOG_WARN = 1,
	TE_LOG_INFO = 2,
	TE_LOG_DEBUG = 3,
	TE_LOG_TRACE = 4,
};

/*
 * Log sink. Called from any engine thread, possibly concurrently; @msg is one line
 * without a trailing newline and is only valid during the call. It should return soon
 * and must not call te_* functions of the engine: some lines are logged while the
 * engine or one of its transports holds a lock.
 */
typedef void (*te_log_fn)(void *user, enum te_log_level level, const char *msg);

/* Options for te_engine_new. Zero-initialise, set size = sizeof(struct te_engine_opts). */
struct te_engine_opts {
	uint32_t size;
	/*
	 * Configuration: a YAML file path, or YAML text (config_yaml with
	 * config_yaml_len bytes, named config_name in error messages). When both are
	 * NULL the file named by $TE_CONFIG is used, else the embedded default
	 * (p2p metadata, tcp on loopback).
	 */
	const char *config_path;
	const char *config_yaml;
	size_t config_yaml_len;
	const char *config_name;
	/* Log sink and threshold. NULL: warnings and errors go to stderr. */
	te_log_fn log_fn;
	void *log_user;
	/* Messages above this level are dropped; negative: use the config's log.level. */
	int log_level;
};

/*
 * te_last_error - detail text of the most recent failing te_* call on this thread
 * ("" if none): what failed, where and why. Valid until the next te_* call on this
 * thread. Thread-safe (thread-local).
 */
TE_API const char *te_last_error(void);

/*
 * te_engine_new - create an engine: parse and validate the configuration, load and
 * initialise the transports, start the workers. On failure *engine_out is untouched
 * and te_last_error() says why (config errors carry file:line:column).
 * Statuses: TE_ERR_INVALID_ARG, TE_ERR_CONFIG, TE_ERR_PLUGIN_*, TE_ERR_ABI_MISMATCH,
 * TE_ERR_NOMEM, TE_ERR_SYSTEM. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_engine_new(const struct te_engine_opts *opts,
						 struct te_engine **engine_out);

/* Convenience wrappers: configuration from a file, or from a YAML string. */
TE_API TE_NODISCARD enum te_status te_engine_new_from_file(const char *path,
							   struct te_engine **engine_out);
TE_API TE_NODISCARD enum te_status te_engine_new_from_string(const char *yaml, size_t len,
							     struct te_engine **engine_out);

/*
 * te_engine_free - cancel what is in flight, stop workers, unload transports and
 * release everything. NULL is a no-op. Must not race with other calls on @engine.
 */
TE_API void te_engine_free(struct te_engine *engine);

/* Name of the local segment (engine.name, default host:port). Thread-safe. */
TE_API const char *te_engine_name(const struct te_engine *engine);

/* Change the log threshold at run time. Thread-safe. */
TE_API void te_engine_set_log_level(struct te_engine *engine, enum te_log_level level);

/*
 * te_engine_stats - what the transports count, as one JSON object keyed by transport name
 * (NUL-terminated; caller frees with te_free). Each value is the object the transport's
 * plugin reports (its keys are documented with the plugin; tcp: per peer, the lanes
 * configured and used, slices and bytes per lane, reconnects); transports that report
 * nothing are left out, so "{}" is a valid answer. Counters are cumulative since engine
 * start. Statuses: TE_ERR_INVALID_ARG (NULL engine or json_out), TE_ERR_PLUGIN_INVALID (a
 * plugin reported something that is not a JSON object; the detail names it), TE_ERR_NOMEM.
 * Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_engine_stats(struct te_engine *engine, char **json_out);

/* --- memory ------------------------------------------------------------------ */

/* Access flags for te_mem_register. */
#define TE_MEM_LOCAL 0u		      /* only usable as the local side */
#define TE_MEM_REMOTE_READ (1u << 0)  /* peers may READ from it */
#define TE_MEM_REMOTE_WRITE (1u << 1) /* peers may WRITE into it */
#define TE_MEM_REMOTE (TE_MEM_REMOTE_READ | TE_MEM_REMOTE_WRITE)

/*
 * te_mem_register - register [addr, addr+length) with every installed transport.
 * @location: "cpu", "cpu:<numa>", "cuda:<dev>", "hip:<dev>", "cxl:<dev>" or "*"
 * (detect); NULL means "*". Transports that do not support the memory type are
 * skipped; if none supports it: TE_ERR_MEMORY_TYPE.
 * Statuses: TE_ERR_INVALID_ARG (NULL addr, zero length, bad location or flags),
 * TE_ERR_OVERFLOW, TE_ERR_ADDRESS_OVERLAPPED, transport errors.
 * Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_register(struct te_engine *engine, void *addr,
						   size_t length, const char *location,
						   uint32_t access);

/*
 * te_mem_unregister - undo te_mem_register for the region starting at @addr.
 * Statuses: TE_ERR_NOT_REGISTERED, TE_ERR_BUSY (a live batch still refers to it).
 * Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_unregister(struct te_engine *engine, void *addr);

/*
 * te_mem_alloc - @length bytes at @location, not registered: "cpu" or "cpu:N" (page-aligned host
 * memory), or a kind a loaded transport hands out: one it owns ("cuda:0", "hip:1": the nvlink
 * and hip plugins) or one it allocates from its own memory ("cxl:0": a range of the cxl
 * window, from the range its alloc_offset/alloc_size options name). The first transport in
 * priority order that offers the kind allocates (for cpu, the core when none does). Free it
 * with te_mem_free; what is left is released with the engine. Statuses: TE_ERR_INVALID_ARG,
 * TE_ERR_MEMORY_TYPE (no transport allocates the kind), TE_ERR_NOMEM, the transport's error;
 * te_last_error() names the location, the transport and its reason. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_alloc(struct te_engine *engine, const char *location,
						size_t length, void **ptr_out);

/*
 * te_mem_alloc_registered - te_mem_alloc, then te_mem_register of the whole allocation with
 * @location and @access (TE_MEM_*), in one step: memory a transport needs of its own kind
 * (cxl window memory) is ready for peers at once. On failure nothing stays allocated.
 * te_mem_free unregisters it first. Statuses: those of te_mem_alloc and te_mem_register.
 * Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_alloc_registered(struct te_engine *engine,
							   const char *location, size_t length,
							   uint32_t access, void **ptr_out);

/*
 * te_mem_free - free what te_mem_alloc or te_mem_alloc_registered returned; NULL is a no-op.
 * Memory te_mem_alloc_registered registered is unregistered first. Statuses: TE_ERR_NOT_FOUND
 * (not from te_mem_alloc*, or already freed), TE_ERR_BUSY (a live batch still uses it, or the
 * application still has a region inside it registered: te_mem_unregister it first; nothing
 * is freed), the transport's error. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_free(struct te_engine *engine, void *ptr);

/*
 * te_mem_copy - copy @length bytes from @src to @dst, each host memory or memory of a kind a
 * loaded transport owns (it is asked who owns each address); synchronous. Both ranges must
 * be valid memory of this process. Statuses: TE_ERR_INVALID_ARG, TE_ERR_OUT_OF_RANGE (a
 * range runs past its device allocation), the owner's error. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_mem_copy(struct te_engine *engine, void *dst, const void *src,
					       size_t length);

/* --- segments ---------------------------------------------------------------- */

/*
 * te_segment_open - open the remote segment @name through the metadata backend
 * and prepare every common transport. Opening the same name again returns the
 * same id (reference counted). Statuses: TE_ERR_UNKNOWN_SEGMENT (no such name),
 * TE_ERR_METADATA_*, TE_ERR_NO_TRANSPORT, TE_ERR_PEER_UNREACHABLE. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_segment_open(struct te_engine *engine, const char *name,
						   te_segment_id *id_out);

/*
 * te_segment_close - drop one reference; the last one unloads the peer.
 * Statuses: TE_ERR_UNKNOWN_SEGMENT, TE_ERR_BUSY (live batches use it),
 * TE_ERR_INVALID_ARG (id 0). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_segment_close(struct te_engine *engine, te_segment_id id);

/*
 * te_segment_export - the local segment descriptor as JSON (NUL-terminated,
 * caller frees with te_free; *len_out, when not NULL, is its length without the
 * NUL). Used for out-of-band metadata exchange. Statuses: TE_ERR_INVALID_ARG
 * (NULL engine or json_out), TE_ERR_NOMEM (encoding failed). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_segment_export(struct te_engine *engine, char **json_out,
						     size_t *len_out);

/*
 * te_segment_import - open a remote segment from a descriptor obtained out of band
 * (te_segment_export on the peer). Importing a newer generation of an already
 * open name replaces it. Statuses as te_segment_open plus TE_ERR_METADATA_MALFORMED.
 * Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_segment_import(struct te_engine *engine, const char *json,
						     size_t len, te_segment_id *id_out);

/* One registered buffer of a segment, as its descriptor publishes it. */
struct te_buffer_info {
	uint64_t addr; /* peer virtual address, for every transport (cxl included) */
	uint64_t length;
	uint32_t access; /* TE_MEM_REMOTE_* */
	char location[32];
};

/*
 * te_segment_buffers - the remote-accessible buffers of segment @id (0: local),
 * sorted by address, as its current descriptor lists them. Writes up to @max
 * entries (@buffers may be NULL when @max is 0); *n_out is the total count (may be
 * larger than @max). Statuses: TE_ERR_INVALID_ARG (NULL engine or n_out),
 * TE_ERR_UNKNOWN_SEGMENT (@id is not open). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_segment_buffers(struct te_engine *engine, te_segment_id id,
						      struct te_buffer_info *buffers, size_t max,
						      size_t *n_out);

/*
 * te_peer_probe - ask the engine serving segment @name whether it is alive,
 * waiting at most @timeout_ms. TE_OK: alive; TE_ERR_PEER_UNREACHABLE (detail says
 * why) or TE_ERR_TIMEOUT otherwise. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_peer_probe(struct te_engine *engine, const char *name,
						 uint32_t timeout_ms);

/* Free memory returned by te_* functions. NULL is a no-op. */
TE_API void te_free(void *ptr);

/* --- batches ----------------------------------------------------------------- */

enum te_opcode {
	TE_OP_READ = 0,	 /* remote -> local */
	TE_OP_WRITE = 1, /* local -> remote */
};

/* One transfer request; becomes one task of a batch. */
struct te_request {
	enum te_opcode opcode;
	te_segment_id segment;
	void *local;	 /* inside a registered local region */
	uint64_t remote; /* peer virtual address (cxl: the plugin maps it into the window) */
	uint64_t length;
};

enum te_state {
	TE_STATE_WAITING = 0,	/* accepted, no slice handed to a transport yet */
	TE_STATE_PENDING = 1,	/* at least one slice in flight */
	TE_STATE_COMPLETED = 2, /* every byte moved */
	TE_STATE_FAILED = 3,	/* a slice failed for good */
	TE_STATE_TIMEOUT = 4,	/* a slice passed its deadline */
	TE_STATE_CANCELED = 5,	/* canceled by te_batch_cancel */
	TE_STATE_INVALID = 6,	/* rejected at submit */
};

/* Name of a state ("COMPLETED", ...); never NULL. Thread-safe. */
TE_API const char *te_state_str(enum te_state state);

/* True for COMPLETED, FAILED, TIMEOUT, CANCELED and INVALID. */
static inline int te_state_is_terminal(enum te_state s)
{
	return s >= TE_STATE_COMPLETED;
}

/* What te_task_status reports. */
struct te_task_info {
	enum te_state state;
	enum te_status status;	    /* TE_OK, or why it failed */
	uint64_t bytes;		    /* bytes moved so far */
	uint64_t length;	    /* bytes requested */
	uint32_t slices;	    /* slices the task was split into */
	uint32_t retries;	    /* slice attempts beyond the first */
	const char *transport;	    /* chosen transport ("" if none); engine lifetime */
	const char *device;	    /* device of the last slice posted ("" if unknown) */
	char detail[TE_DETAIL_MAX]; /* why it failed ("" if it did not) */
};

/* What te_batch_status reports. */
struct te_batch_info {
	enum te_state state; /* aggregate: any FAILED/INVALID -> FAILED, all COMPLETED ->
				COMPLETED, else TIMEOUT, CANCELED; PENDING/WAITING while
				any task is not terminal */
	uint32_t tasks;
	uint32_t completed;
	uint32_t failed; /* FAILED + INVALID */
	uint32_t timed_out;
	uint32_t canceled;
	uint64_t bytes;
};

/*
 * te_batch_new - allocate a batch able to hold @capacity requests in total.
 * Statuses: TE_ERR_INVALID_ARG (zero), TE_ERR_TOO_LARGE (over transfer.max_batch),
 * TE_ERR_BUSY (all batch slots in use). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_batch_new(struct te_engine *engine, uint32_t capacity,
						te_batch_id *batch_out);

/*
 * te_batch_submit - append @n requests as tasks (indices continue from earlier
 * submits on this batch) and start them. Requests are validated first: a rejected
 * request becomes an INVALID task with status and detail, the others proceed, and
 * the return value is the first rejection's status (te_last_error names the
 * request index). A remote range outside the buffers the segment's descriptor lists makes
 * the call fetch the descriptor again once and validate anew (a buffer the peer registered
 * after the segment was opened is reachable at once), unless a fetch found that descriptor
 * unchanged less than 100 ms before: then it is refused at once. If the batch cannot hold all @n,
 * nothing is appended and TE_ERR_BATCH_FULL is returned. Serialize per batch; different batches may be
 * submitted from different threads.
 */
TE_API TE_NODISCARD enum te_status te_batch_submit(struct te_engine *engine, te_batch_id batch,
						   const struct te_request *requests, size_t n);

/* Longest notify message. */
#define TE_NOTIFY_MAX 4096

/*
 * te_batch_submit_notify - like te_batch_submit, and once every task of the batch
 * is COMPLETED, deliver @msg (@len <= TE_NOTIFY_MAX bytes) to the engine serving
 * the requests' segment (all requests must target one remote segment). The
 * message is sent exactly once, and never if any task fails, times out or is
 * canceled; te_engine_free sends what is still queued (waiting at most 2 s). One notify per batch. Statuses: those of te_batch_submit, and
 * TE_ERR_INVALID_ARG (no requests, a message over TE_NOTIFY_MAX, requests to
 * several segments or to segment 0), TE_ERR_UNKNOWN_SEGMENT (the segment is not
 * open or has no control-plane address), TE_ERR_EXISTS (the batch already has a
 * notify). Serialize per batch.
 */
TE_API TE_NODISCARD enum te_status te_batch_submit_notify(struct te_engine *engine,
							  te_batch_id batch,
							  const struct te_request *requests,
							  size_t n, const void *msg, size_t len);

/* A notify message received by this engine. */
struct te_notify {
	char sender[256]; /* segment name of the sender */
	size_t len;
	uint8_t msg[TE_NOTIFY_MAX];
};

/*
 * te_notify_recv - take up to @max received messages, oldest first; *n_out = how
 * many were written (0 if none). Never blocks. Statuses: TE_ERR_INVALID_ARG (NULL
 * engine or n_out, or NULL msgs with @max > 0). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_notify_recv(struct te_engine *engine, struct te_notify *msgs,
						  size_t max, size_t *n_out);

/*
 * te_task_status - state of task @task (0-based). Statuses: TE_ERR_INVALID_HANDLE,
 * TE_ERR_INVALID_ARG (index beyond the submitted tasks). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_task_status(struct te_engine *engine, te_batch_id batch,
						  uint32_t task, struct te_task_info *info_out);

/*
 * te_batch_status - aggregate state of a batch (counts of tasks per state, bytes
 * moved). Statuses: TE_ERR_INVALID_ARG (NULL engine or info_out),
 * TE_ERR_INVALID_HANDLE (freed, stale or forged batch). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_batch_status(struct te_engine *engine, te_batch_id batch,
						   struct te_batch_info *info_out);

/*
 * te_batch_wait - block until every task is terminal or @timeout_ns passed
 * (negative: no limit; 0: check once). The calling thread drives the progress of
 * manual-progress transports while it waits (busy while completions keep coming,
 * sleeping on the transport's queues when they pause), so a waiting application
 * thread is what moves their bytes; one waiting thread drives at a time, the others
 * sleep until their batch ends. Returns TE_OK when all tasks COMPLETED, the first
 * failed task's status when the batch is terminal with failures, TE_INPROGRESS if
 * the timeout expired first, TE_ERR_INVALID_HANDLE for a freed, stale or forged
 * batch, TE_ERR_INVALID_ARG for a NULL engine. Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_batch_wait(struct te_engine *engine, te_batch_id batch,
						 int64_t timeout_ns);

/*
 * te_batch_cancel - best effort: slices not yet finished are canceled; the batch
 * always becomes terminal (completed slices stay completed; a slice a transport
 * cannot stop ends with its real outcome). Statuses: TE_ERR_INVALID_HANDLE (freed,
 * stale or forged batch), TE_ERR_INVALID_ARG (NULL engine). Thread-safe.
 */
TE_API TE_NODISCARD enum te_status te_batch_cancel(struct te_engine *engine, te_batch_id batch);

/*
 * te_batch_free - release a terminal batch; its handle becomes invalid.
 * Statuses: TE_ERR_BUSY (not terminal), TE_ERR_INVALID_HANDLE. Serialize per batch.
 */
TE_API TE_NODISCARD enum te_status te_batch_free(struct te_engine *engine, te_batch_id batch);

#ifdef __cplusplus
}
#endif

#endif /* TE_H */
