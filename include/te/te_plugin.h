/* SPDX-License-Identifier: Apache-2.0 */
/* te_plugin.h: the transport plugin ABI; the only header a plugin includes. */
#ifndef TE_PLUGIN_H
#define TE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include <te/te_status.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * ABI rules
 * - A plugin exports exactly one symbol, TE_PLUGIN_ENTRY (te_plugin_entry_v1 for
 *   major 1), returning a pointer to a static descriptor and doing nothing else.
 * - Every struct starts with uint32_t size and only grows at its end. Members
 *   added after 1.0 are marked "since ABI 1.N"; read them only when size covers
 *   them (TE_PLUGIN_HAS). A plugin declaring minor N runs only on cores of minor >= N, so
 *   the structs the core hands it (host, caps, device, slice) have every member of minor N:
 *   it needs TE_PLUGIN_HAS only for members newer than the minor it declares.
 * - The core accepts a plugin when its major equals the core's and its minor is
 *   not newer. Ops are copied into a core-owned table whose missing entries
 *   answer TE_ERR_UNSUPPORTED; a missing required op rejects the plugin.
 * - Plugins never link libte: everything they need from the core comes through
 *   struct te_plugin_host.
 *
 * Calls (what every op may rely on)
 * - The core never calls an op with a NULL @inst: it passes what init wrote into *inst_out,
 *   from init's return until fini, and never after fini. Plugins need not check it.
 * - Handles (mem, peer, rkey) are ones this instance returned and the core has not released
 *   yet; a slice passed to cancel or retry_prepare is one this instance accepted.
 * - Threads. init, query_caps and query_devices run once, in that order, on the thread
 *   starting the engine, before any other op; fini runs once, last, on the thread freeing
 *   the engine (or starting it, when start fails), with no other op running.
 *   Every other op comes from application threads (te_mem_register, te_segment_open,
 *   requests, te_batch_wait, te_batch_cancel) and the core's workers, control-plane and
 *   metadata-watch threads. A TE_PLUGIN_THREAD_SERIALIZED plugin gets them one at a time
 *   (the core holds a lock per instance around each): submit, progress, cancel,
 *   retry_prepare, handshake, reg_mem, dereg_mem, pack_key, load_peer(_ex), unload_peer,
 *   unpack_remote_key, release_remote_key; wait is never called for it (see wait); the
 *   memory-kind ops (mem_*) are not serialized (another plugin's reg_mem may reach them
 *   through the host table) and must be thread-safe. A TE_PLUGIN_THREAD_MULTI plugin gets
 *   any op from any thread at once.
 */
#define TE_PLUGIN_ABI_MAJOR 1
#define TE_PLUGIN_ABI_MINOR 2 /* 1.1: ops.wait; 1.2: data-connection auth, memory kinds */

#define TE_PLUGIN_STR2(x) #x
#define TE_PLUGIN_STR(x) TE_PLUGIN_STR2(x)
#define TE_PLUGIN_CAT2(a, b) a##b
#define TE_PLUGIN_CAT(a, b) TE_PLUGIN_CAT2(a, b)
#define TE_PLUGIN_ENTRY TE_PLUGIN_CAT(te_plugin_entry_v, TE_PLUGIN_ABI_MAJOR)
#define TE_PLUGIN_ENTRY_NAME "te_plugin_entry_v" TE_PLUGIN_STR(TE_PLUGIN_ABI_MAJOR)

/* True when the struct at @ptr (of @type, with its size field) contains member @m. */
#define TE_PLUGIN_HAS(ptr, type, m) ((ptr)->size >= offsetof(type, m) + sizeof(((type *)0)->m))

#if defined(__GNUC__)
#define TE_PLUGIN_EXPORT __attribute__((visibility("default")))
#define TE_PLUGIN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TE_PLUGIN_EXPORT
#define TE_PLUGIN_PRINTF(a, b)
#endif

/* Opaque handles. The plugin defines its own instance, mem, peer and rkey types. */
struct te_plugin_host_ctx; /* core-side context of one plugin instance */
struct te_plugin_inst;
struct te_plugin_mem;
struct te_plugin_peer;
struct te_plugin_rkey;

enum te_plugin_log_level {
	TE_PLUGIN_LOG_ERROR = 0,
	TE_PLUGIN_LOG_WARN = 1,
	TE_PLUGIN_LOG_INFO = 2,
	TE_PLUGIN_LOG_DEBUG = 3,
	TE_PLUGIN_LOG_TRACE = 4,
};

enum te_plugin_opcode {
	TE_PLUGIN_OP_READ = 0,	/* remote -> local */
	TE_PLUGIN_OP_WRITE = 1, /* local -> remote */
};

/* Memory types (caps.mem_types bit mask). */
#define TE_PLUGIN_MEM_CPU (1u << 0)
#define TE_PLUGIN_MEM_CUDA (1u << 1)
#define TE_PLUGIN_MEM_HIP (1u << 2)
#define TE_PLUGIN_MEM_CXL (1u << 3)

/* Operations (caps.ops bit mask). */
#define TE_PLUGIN_CAN_READ (1u << 0)
#define TE_PLUGIN_CAN_WRITE (1u << 1)

/* Memory access granted to peers (reg_mem). */
#define TE_PLUGIN_ACCESS_REMOTE_READ (1u << 0)
#define TE_PLUGIN_ACCESS_REMOTE_WRITE (1u << 1)

enum te_plugin_progress {
	TE_PLUGIN_PROGRESS_AUTO = 0,   /* the plugin completes slices from its own threads */
	TE_PLUGIN_PROGRESS_MANUAL = 1, /* the core drives progress() while slices are in flight */
};

enum te_plugin_thread_level {
	TE_PLUGIN_THREAD_SERIALIZED = 0, /* the core serializes every data-path call */
	TE_PLUGIN_THREAD_MULTI = 1,	 /* any op may be called from any thread at once */
};

/*
 * Limits of the core (since ABI 1.0; they only grow): caps.slice_priv_size is at most
 * TE_PLUGIN_SLICE_PRIV_MAX bytes, and a plugin reports at most TE_PLUGIN_MAX_DEVICES devices
 * (slice->excluded_devices and slice->device index them in a 64-bit mask).
 */
#define TE_PLUGIN_SLICE_PRIV_MAX 256u
#define TE_PLUGIN_MAX_DEVICES 64u

/* caps.flags */
#define TE_PLUGIN_CAP_SAME_HOST_ONLY (1u << 0)	  /* peers must share this host */
#define TE_PLUGIN_CAP_SAME_PROCESS_ONLY (1u << 1) /* peers must share this process */
/*
 * Since ABI 1.2: the memory decides the device (a GPU copies its own memory): devices are not
 * interchangeable paths, so the core never puts a device in slice->excluded_devices for this
 * plugin (a retry takes the same device; the plugin refuses work for a device it knows
 * failed). Without it, devices are rails: a failed or quarantined one is avoided.
 */
#define TE_PLUGIN_CAP_FIXED_DEVICES (1u << 2)
/*
 * Since ABI 1.2: hybrid progress, for a TE_PLUGIN_PROGRESS_AUTO, TE_PLUGIN_THREAD_MULTI plugin
 * with the op progress (and optionally wait and drive). Its own threads complete slices as any
 * AUTO plugin's do, and besides, an application thread waiting in te_batch_wait polls it
 * through progress() while it has slices in flight, as the core does for MANUAL plugins (and
 * sleeps in wait() between empty polls, under wait's rules), so that a completion reaches its
 * batch on the waiting thread with no hand-off between threads (the way UCX and NIXL
 * application threads progress their worker). drive() brackets those polls, so that the
 * plugin's threads can keep away from the queues meanwhile and take over at once after.
 * The core's worker threads never call progress() for such a plugin: when nobody waits, its
 * threads do the work. Ignored for MANUAL and SERIALIZED plugins; a plugin without the op
 * progress is refused.
 */
#define TE_PLUGIN_CAP_HYBRID_PROGRESS (1u << 3)
/*
 * Since ABI 1.2, with TE_PLUGIN_CAP_HYBRID_PROGRESS: progress(), wait() and drive() serve the
 * calling thread's own work (e.g. the connection its submits use), so several threads waiting
 * in te_batch_wait poll at once (up to transfer.max_pollers, by default half the CPUs' worth;
 * the others wait for the plugin's threads, as for an AUTO plugin), each bracketing its polls
 * with drive(1) and drive(0).
 * Concurrent callers, and drive() calls of several threads interleaved (each thread's own
 * alternate 1, 0), must be fine. The core uses it only while every hybrid transport of the
 * engine has the flag and none is MANUAL; otherwise one waiter polls at a time, the others
 * standing by, as for any hybrid plugin.
 */
#define TE_PLUGIN_CAP_HYBRID_PER_THREAD (1u << 4)

/* Capabilities; filled by query_caps after the core zeroes it and sets size. */
struct te_plugin_caps {
	uint32_t size;
	uint32_t mem_types;	     /* TE_PLUGIN_MEM_* */
	uint32_t ops;		     /* TE_PLUGIN_CAN_* */
	uint32_t progress;	     /* enum te_plugin_progress */
	uint32_t thread_level;	     /* enum te_plugin_thread_level */
	uint32_t flags;		     /* TE_PLUGIN_CAP_* */
	uint64_t max_slice_size;     /* 0: unlimited */
	uint64_t default_slice_size; /* 0: let the core choose */
	uint32_t slice_priv_size;    /* bytes of per-slice scratch (<= TE_PLUGIN_SLICE_PRIV_MAX) */
	uint32_t max_devices;	     /* devices it may report (<= TE_PLUGIN_MAX_DEVICES) */
	/*
	 * Since ABI 1.2: memory kinds this plugin owns (TE_PLUGIN_MEM_CUDA, _HIP): it answers
	 * the ops mem_query, mem_copy, mem_alloc, mem_free (and mem_dmabuf when it can) for
	 * them, which the core offers every other plugin and the application. At most one
	 * loaded plugin owns a kind (the first in priority order).
	 */
	uint32_t owned_mem_types;
	/*
	 * Since ABI 1.2: memory kinds this plugin serves to peers by staging (it copies between
	 * the region and host buffers through host->mem_copy): the core registers regions of
	 * these kinds with it, and as the local side of a request it hands the plugin host
	 * memory (the core stages). Kinds in mem_types are moved directly instead.
	 */
	uint32_t staged_mem_types;
	/*
	 * Since ABI 1.2: memory kinds this plugin hands out through mem_alloc/mem_free without
	 * owning them (cxl: TE_PLUGIN_MEM_CXL, ranges of its window; a shared-memory or hugepage
	 * transport: TE_PLUGIN_MEM_CPU). te_mem_alloc of such a kind asks the first loaded plugin
	 * in priority order whose owned_mem_types or alloc_mem_types has it (for cpu, the core
	 * allocates itself when none has it). Each kind must be in mem_types (the memory must
	 * register with this plugin), and the plugin needs the ops mem_alloc and mem_free; the
	 * core refuses the plugin otherwise.
	 */
	uint32_t alloc_mem_types;
};

/* One device (NIC, GPU link, window); filled by query_devices. */
struct te_plugin_device {
	uint32_t size;
	char name[64];
	int32_t numa_node;	  /* -1 unknown */
	char pci[32];		  /* "0000:3b:00.0" or "" */
	uint64_t link_speed_mbps; /* 0 unknown */
	uint32_t mem_types;	  /* TE_PLUGIN_MEM_* reachable through it */
};

/*
 * The unit of transfer. Owned by the core; the plugin owns it from an accepted
 * submit until it calls host->slice_done exactly once for that attempt.
 * Fields are read-only for the plugin except device, and priv bytes.
 */
struct te_plugin_slice {
	uint32_t size;
	uint32_t opcode;		 /* enum te_plugin_opcode */
	void *local;			 /* local address */
	uint64_t remote;		 /* peer address (or window offset) */
	uint64_t length;		 /* bytes, > 0 and <= max_slice_size */
	struct te_plugin_mem *local_mem; /* reg_mem handle of the local region */
	struct te_plugin_peer *peer;	 /* load_peer handle */
	struct te_plugin_rkey *rkey;	 /* unpack_remote_key handle of the remote region */
	uint64_t remote_base;		 /* start of the remote region that rkey describes */
	uint64_t deadline_ns;		 /* absolute, host->now_ns() clock */
	uint64_t excluded_devices;	 /* bit d set: do not use device d for this attempt */
	uint32_t attempt;		 /* 0 for the first attempt */
	uint32_t device;		 /* set by the plugin: device index used (for retries) */
	void *priv;			 /* caps.slice_priv_size bytes for the plugin, or NULL */
};

enum te_plugin_fail_scope {
	TE_PLUGIN_FAIL_DEVICE = 0, /* a local device (index) */
	TE_PLUGIN_FAIL_PEER = 1,   /* a peer handle */
	TE_PLUGIN_FAIL_PATH = 2,   /* one local device towards one peer */
};

enum te_plugin_event {
	TE_PLUGIN_EVENT_DOWN = 0,
	TE_PLUGIN_EVENT_UP = 1,
};

/* te_plugin_peer_info.flags (since ABI 1.2). */
#define TE_PLUGIN_PEER_SAME_HOST (1u << 0)    /* the peer runs on this host (same boot id) */
#define TE_PLUGIN_PEER_SAME_PID_NS (1u << 1)  /* ...and in this pid namespace: pid is usable */
#define TE_PLUGIN_PEER_SAME_PROCESS (1u << 2) /* ...and is this very process */

/*
 * What the core knows of a peer, for load_peer_ex (since ABI 1.2). "Same host" is decided by
 * the core alone: the peers' kernel boot ids (/proc/sys/kernel/random/boot_id, the host name
 * where it is missing) are equal. Containers on one host share the boot id but not always a
 * pid namespace, so the pid is meaningful only with TE_PLUGIN_PEER_SAME_PID_NS (e.g. for
 * process_vm_readv or pidfd_open). Valid during the call; copy what you keep.
 */
struct te_plugin_peer_info {
	uint32_t size;
	uint32_t flags;	     /* TE_PLUGIN_PEER_* */
	const char *name;    /* the peer's segment name, as load_peer gets it */
	const char *host_id; /* the peer's host identity (its boot id), never NULL */
	uint32_t pid;	     /* the peer engine's process id in its own pid namespace */
};

/* Bytes of a host->auth_mac MAC (HMAC-SHA256). Since ABI 1.2. */
#define TE_PLUGIN_MAC_SIZE 32u

/* Direction of a copy between memory of an owned kind and host memory (since ABI 1.2). */
enum te_plugin_copy_dir {
	TE_PLUGIN_COPY_TO_HOST = 0,   /* src: memory of the kind; dst: host memory */
	TE_PLUGIN_COPY_FROM_HOST = 1, /* src: host memory; dst: memory of the kind */
};

/* Callback for host->config_foreach. */
typedef void (*te_plugin_option_fn)(void *user, const char *key, const char *value);

/*
 * Services the core offers a plugin. Every function is thread-safe and takes the
 * ctx passed to init. Valid from init until fini returns.
 */
struct te_plugin_host {
	uint32_t size;
	uint32_t abi_major;
	uint32_t abi_minor;
	/* Log one line (no newline needed). @fmt is a printf format. */
	void (*log)(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level, const char *fmt,
		    ...) TE_PLUGIN_PRINTF(3, 4);
	/*
	 * Report the end of one attempt of @slice: TE_OK with @bytes == slice length,
	 * or an error with a human-readable @detail (may be NULL; copied during the
	 * call). Exactly once per accepted slice attempt, from any thread, also after
	 * cancel (TE_ERR_CANCELED). The slice must not be touched after this call (the
	 * core may retry it, i.e. hand it back to submit, or free it). Lines passed to
	 * log get the plugin name prefixed by the host.
	 */
	void (*slice_done)(struct te_plugin_host_ctx *ctx, struct te_plugin_slice *slice,
			   enum te_status status, uint64_t bytes, const char *detail);
	/* Quarantine a device, peer or path for the configured pause. */
	void (*mark_failed)(struct te_plugin_host_ctx *ctx, enum te_plugin_fail_scope scope,
			    uint32_t device, struct te_plugin_peer *peer, const char *why);
	/* A device went down or came back (async events). */
	void (*device_event)(struct te_plugin_host_ctx *ctx, uint32_t device,
			     enum te_plugin_event event, const char *why);
	/* A peer went away or came back. */
	void (*peer_event)(struct te_plugin_host_ctx *ctx, struct te_plugin_peer *peer,
			   enum te_plugin_event event, const char *why);
	/* The plugin's YAML options: value of @key or NULL; all of them in order. */
	const char *(*config_get)(struct te_plugin_host_ctx *ctx, const char *key);
	void (*config_foreach)(struct te_plugin_host_ctx *ctx, te_plugin_option_fn fn, void *user);
	/*
	 * Publish this instance's transport blob (addresses, window id, ...): it goes
	 * into the segment descriptor and reaches peers' load_peer. Copied. Usually
	 * called in init; a later call replaces it for descriptors built afterwards.
	 */
	enum te_status (*publish)(struct te_plugin_host_ctx *ctx, const void *blob, size_t len);
	/*
	 * Monotonic clock in nanoseconds, the clock of slice->deadline_ns. Takes no ctx (the
	 * clock is the process's); thread-safe, never fails.
	 */
	uint64_t (*now_ns)(void);
	/* Name of the local segment (for logs and handshakes). */
	const char *(*local_name)(struct te_plugin_host_ctx *ctx);
	/*
	 * Send @req to this plugin's handshake op on the engine serving segment
	 * @peer_name (the name load_peer received) through the control plane and wait
	 * at most @timeout_ms for its reply (<= @cap bytes into @resp). Blocking: call
	 * it from load_peer or a plugin thread, never from submit or progress.
	 * Statuses: the peer's handshake status, TE_ERR_PEER_UNREACHABLE, TE_ERR_TIMEOUT,
	 * TE_ERR_TOO_LARGE (reply over @cap), TE_ERR_UNKNOWN_SEGMENT.
	 */
	enum te_status (*peer_handshake)(struct te_plugin_host_ctx *ctx, const char *peer_name,
					 const void *req, size_t len, void *resp, size_t cap,
					 size_t *resp_len_out, uint32_t timeout_ms);
	/*
	 * Say why the op running on this thread is about to fail (init, reg_mem,
	 * load_peer, unpack_remote_key, submit, ...). The core quotes it in the error
	 * the user sees, so expected failures need not be logged as warnings. Only the
	 * last call before the op returns counts; text is copied. @fmt is a printf format.
	 */
	void (*set_error)(struct te_plugin_host_ctx *ctx, const char *fmt, ...)
		TE_PLUGIN_PRINTF(2, 3);

	/* --- since ABI 1.2 --- */
	/*
	 * Authentication of data connections with the engine's shared secret (auth.secret or
	 * auth.secret_file), which plugins never see. When this returns TE_OK, a plugin that
	 * accepts data connections must serve no request on one before its client proved the
	 * secret, and a client must refuse a server that does not prove it.
	 *
	 * auth_mac: *mac_out = HMAC-SHA256(secret, "te-plugin-auth-v1" NUL <plugin name> NUL
	 * @msg[0..@len)), so MACs of different plugins never collide. @msg is the plugin's
	 * transcript: a direction label, fresh nonces of both sides and whatever binds the
	 * proof to this instance and connection. TE_OK; TE_ERR_UNSUPPORTED when the engine
	 * has no secret (authentication is off; @mac_out untouched); TE_ERR_INVALID_ARG.
	 * auth_check: the same MAC compared with @mac in constant time: TE_OK, TE_ERR_AUTH
	 * when they differ, TE_ERR_UNSUPPORTED without a secret.
	 * Thread-safe, non-blocking; callable from any op and any plugin thread.
	 */
	enum te_status (*auth_mac)(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				   uint8_t mac_out[TE_PLUGIN_MAC_SIZE]);
	enum te_status (*auth_check)(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				     const uint8_t mac[TE_PLUGIN_MAC_SIZE]);

	/*
	 * Memory kinds (since ABI 1.2): memory this plugin cannot reach itself (a GPU's) is
	 * reached through the plugin that owns its kind (caps.owned_mem_types), which the core
	 * finds by kind. Thread-safe; mem_copy blocks until the bytes are in place, so call it
	 * from submit, progress or a plugin thread, never with a lock a completion needs.
	 *
	 * mem_query: who owns [@addr, +@len): TE_OK with its kind and device (TE_PLUGIN_MEM_CPU
	 * and -1 when no owner claims it); TE_ERR_OUT_OF_RANGE when an owner's allocation holds
	 * @addr but not the whole range.
	 * mem_copy: copy @len bytes between memory of kind @mem_type on device @dev and host
	 * memory (any host memory; pinned is faster): @dir says which of @dst and @src is which.
	 * TE_ERR_MEMORY_TYPE when no loaded plugin owns the kind; the owner's error otherwise.
	 * mem_dmabuf: a dmabuf file descriptor covering [@addr, +@len) of kind @mem_type, for
	 * registering device memory with a NIC (GPUDirect): *fd_out (the caller closes it) and
	 * *offset_out (of @addr in it). TE_ERR_UNSUPPORTED when the owner's driver offers none.
	 */
	enum te_status (*mem_query)(struct te_plugin_host_ctx *ctx, const void *addr, uint64_t len,
				    uint32_t *mem_type_out, int32_t *dev_out);
	enum te_status (*mem_copy)(struct te_plugin_host_ctx *ctx, void *dst, const void *src,
				   uint64_t len, uint32_t mem_type, int32_t dev,
				   enum te_plugin_copy_dir dir);
	enum te_status (*mem_dmabuf)(struct te_plugin_host_ctx *ctx, const void *addr, uint64_t len,
				     uint32_t mem_type, int32_t dev, int *fd_out,
				     uint64_t *offset_out);

	/*
	 * Since ABI 1.2: the engine's control-plane address, "host:port" (IPv6 hosts in
	 * brackets): TE_PLUGIN_ADDR_BOUND is what its listener bound (a wildcard host when
	 * engine.listen is one), TE_PLUGIN_ADDR_ADVERTISED what peers are told to dial (never a
	 * wildcard). A data listener that follows them reaches the same peers as the control
	 * plane. "" when the engine has no control plane. Valid until fini; any thread.
	 */
	const char *(*control_address)(struct te_plugin_host_ctx *ctx, uint32_t which);
};

/* host->control_address @which (since ABI 1.2). */
#define TE_PLUGIN_ADDR_BOUND 0u
#define TE_PLUGIN_ADDR_ADVERTISED 1u

/*
 * Operations. Required: init, fini, query_caps, reg_mem, dereg_mem, pack_key,
 * load_peer (or load_peer_ex), unload_peer, unpack_remote_key, submit; progress is required for
 * MANUAL plugins. Statuses are enum te_status; outputs are written only on TE_OK.
 * Which thread calls each op: "Calls" at the top of this file.
 */
struct te_plugin_ops {
	uint32_t size;

	/* --- install --- */
	/*
	 * Create an instance: read options (host->config_get), open devices, publish the
	 * transport blob (host->publish). TE_OK with a non-NULL *inst_out; any error fails a
	 * required plugin's engine start and skips an optional one (say why with
	 * host->set_error). TE_OK with *inst_out NULL is a plugin bug: the core refuses the
	 * plugin (TE_ERR_PLUGIN_INVALID, "init returned TE_OK but no instance") and calls
	 * no op, fini included.
	 * @host and @ctx stay valid until fini returns. Engine start thread.
	 */
	enum te_status (*init)(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out);
	/*
	 * Release everything the instance still holds: complete every slice it owns
	 * with TE_ERR_CANCELED (slice_done may be called during fini), and free the
	 * peers, remote keys and registrations the core did not release. After fini the
	 * core makes no further call into the instance. Returns nothing; engine free thread.
	 */
	void (*fini)(struct te_plugin_inst *inst);
	/*
	 * Fill @caps (zeroed by the core, size set). TE_OK; an error fails the plugin's init
	 * like init's. Once, right after init.
	 */
	enum te_status (*query_caps)(struct te_plugin_inst *inst, struct te_plugin_caps *caps);
	/*
	 * Fill up to @max devices (each with size set by the core, @max <=
	 * TE_PLUGIN_MAX_DEVICES); *n_out = count. TE_OK; an error fails the plugin's init.
	 * Optional (absent: no device; TE_ERR_UNSUPPORTED says the same). Once, after query_caps.
	 */
	enum te_status (*query_devices)(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out);

	/* --- memory and peers --- */
	/*
	 * @mem_type: one TE_PLUGIN_MEM_* bit; @dev: device number of the location.
	 * TE_ERR_UNSUPPORTED for a device kind in caps.mem_types: not this region directly
	 * (e.g. the owner offers no dmabuf for it). The core then holds no handle of this
	 * transport for it: it stages the region through host memory when it is the local
	 * side, and peers get no key for it. Any other error fails the registration.
	 * TE_OK with *mem_out. Any thread (see "Calls").
	 */
	enum te_status (*reg_mem)(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out);
	/*
	 * The core calls it only when no batch refers to the region any more (it keeps
	 * its own reference counts); serving-side transfers of peers that are still
	 * copying must be waited for or fenced by the plugin before it returns.
	 * TE_OK; an error (TE_ERR_INVALID_HANDLE) is logged by the core, which forgets the
	 * handle anyway. Any thread.
	 */
	enum te_status (*dereg_mem)(struct te_plugin_inst *inst, struct te_plugin_mem *mem);
	/*
	 * Key blob for the descriptor: writes <= @cap bytes; TE_ERR_TOO_LARGE if short.
	 * *len_out = 0: this transport publishes no key for the region (e.g. memory
	 * outside a shared window): it can be a local source or destination here, and
	 * peers never reach it through this transport. Any thread.
	 */
	enum te_status (*pack_key)(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out);
	/*
	 * Prepare to reach @peer_name whose published blob is @blob (maybe connect, maybe
	 * host->peer_handshake). TE_OK with *peer_out; an error leaves this transport out of
	 * the view of that peer (the core quotes set_error's text when no transport is left).
	 * Any thread (see "Calls").
	 */
	enum te_status (*load_peer)(struct te_plugin_inst *inst, const char *peer_name,
				    const void *blob, size_t len, struct te_plugin_peer **peer_out);
	/*
	 * Forget @peer: the core released its remote keys first and has no slice of it in
	 * flight. Returns nothing. Any thread (whichever drops the last view of the peer),
	 * also inside slice_done. Once it returns, the plugin names @peer to the host no more
	 * (mark_failed, peer_event); the core calls it holding none of its locks, so it may
	 * wait for such a host call of its own already under way (never for slices or I/O).
	 */
	void (*unload_peer)(struct te_plugin_inst *inst, struct te_plugin_peer *peer);
	/*
	 * Decode the key blob of the peer's region [addr, addr+length) (the blob came
	 * from the peer's pack_key of exactly that region; reject one that disagrees).
	 * TE_OK with *rkey_out; TE_ERR_METADATA_MALFORMED (or another error) leaves that
	 * region unreachable through this transport. Any thread.
	 */
	enum te_status (*unpack_remote_key)(struct te_plugin_inst *inst,
					    struct te_plugin_peer *peer, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out);
	/* Free @rkey (no slice using it is in flight). Optional; returns nothing. Any thread. */
	void (*release_remote_key)(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey);

	/* --- submit --- */
	/*
	 * Take up to @n slices; *accepted_out = how many (a prefix of @slices). Fewer
	 * than @n is back-pressure: the core retries the rest after progress. After a call
	 * that accepts none (TE_OK, *accepted_out 0), the core calls submit again only once
	 * one of this instance's slices completes (slice_done) or after a wait of 100 us,
	 * doubling up to 1 ms while refusals go on. A status other than TE_OK fails the
	 * slices not accepted with that status.
	 */
	enum te_status (*submit)(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				 uint32_t n, uint32_t *accepted_out);
	/*
	 * MANUAL plugins: make progress, at most @budget completions; returns how many.
	 * Must not block. Called while the plugin has slices in flight, from a thread
	 * waiting in te_batch_wait or from the core's workers. A MULTI plugin may also
	 * complete slices from a thread of its own (slice_done is thread-safe).
	 * TE_PLUGIN_CAP_HYBRID_PROGRESS plugins (since ABI 1.2): the same, but only from the
	 * application thread polling in te_batch_wait (see drive), concurrently with the
	 * plugin's own threads.
	 */
	uint32_t (*progress)(struct te_plugin_inst *inst, uint32_t budget);
	/*
	 * Best effort: finish @slice soon with TE_ERR_CANCELED (or its real outcome).
	 * The core calls it when it gives up on a slice it handed you (its deadline
	 * passed, or te_batch_cancel) and reports the task only once you hand the slice
	 * back with slice_done, so: hand it back promptly (well within a second after its
	 * deadline), and only once a WRITE of it can no longer modify the target (abort
	 * or fence what carries it; transports that cannot must document what may still
	 * land and when). A slice not handed back cancel_grace_ms after max(the cancel,
	 * its deadline) is reported anyway, with a warning naming the plugin.
	 * May race with the slice's own completion: when the plugin no longer owns
	 * the slice (already reported, or never accepted), return TE_ERR_NOT_FOUND and
	 * do nothing. The slice memory stays valid during the call. Must not block.
	 * TE_OK: the slice will come back (soon); the core ignores other statuses. From the
	 * thread of te_batch_cancel, or a core worker at the deadline.
	 */
	enum te_status (*cancel)(struct te_plugin_inst *inst, struct te_plugin_slice *slice);

	/* --- retry and failure marking --- */
	/*
	 * Before a retry of @slice: choose another path avoiding slice->excluded_devices
	 * (the core never excludes every device: with one device the mask is empty).
	 * TE_ERR_NO_DEVICE when no path is left; TE_ERR_UNSUPPORTED (op absent) means
	 * "retry as is". TE_OK: the core submits the slice again (from a core worker).
	 */
	enum te_status (*retry_prepare)(struct te_plugin_inst *inst, struct te_plugin_slice *slice);

	/* --- control plane --- */
	/*
	 * A peer's handshake message for this plugin arrived (e.g. QP exchange); write
	 * the reply into @resp (<= @cap bytes). Optional. TE_OK with *resp_len_out; another
	 * status goes back to the peer's host->peer_handshake. From the core's control-plane
	 * thread: must not wait for this engine's own requests.
	 */
	enum te_status (*handshake)(struct te_plugin_inst *inst, const char *peer_name,
				    const void *req, size_t req_len, void *resp, size_t cap,
				    size_t *resp_len_out);

	/* --- since ABI 1.1 --- */
	/*
	 * MANUAL plugins, optional: block until progress() may find something to do (an
	 * event on the plugin's queues: a CQ wait fd, a completion channel) or @timeout_ns
	 * passed, instead of the caller spinning. TE_OK: woken or timed out.
	 * TE_ERR_UNSUPPORTED: cannot block now (the caller yields the CPU); any other status
	 * is ignored. The caller polls again whatever the outcome. Never block longer than
	 * @timeout_ns. A TE_PLUGIN_CAP_HYBRID_PER_THREAD plugin may return TE_ERR_NOT_FOUND:
	 * nothing in flight is this thread's to poll (its own threads do that work); the caller
	 * then stops polling for this wait and sleeps until its batch ends.
	 * When it is called, exactly:
	 * - never for a TE_PLUGIN_THREAD_SERIALIZED plugin (its call lock would be held while
	 *   blocking, stalling every submitter), nor for a TE_PLUGIN_PROGRESS_AUTO one without
	 *   TE_PLUGIN_CAP_HYBRID_PROGRESS (a hybrid one is treated as MANUAL below);
	 * - only from an application thread inside te_batch_wait, the engine's one polling
	 *   waiter: never from the core's worker threads, and never by two threads at once
	 *   for one instance (except TE_PLUGIN_CAP_HYBRID_PER_THREAD plugins: every waiter);
	 * - only while this plugin is the engine's only manual-progress transport with slices
	 *   in flight, after several empty progress() polls and 20 us or more since the last
	 *   completion;
	 * - with 0 < @timeout_ns <= 500 us, and never past the te_batch_wait caller's deadline;
	 * - concurrently with any other op except init, query_caps, query_devices and fini:
	 *   submit (application threads and the workers' backlog), progress (the workers),
	 *   cancel, and the rest. A submit arriving meanwhile need not end the wait: it lasts
	 *   at most @timeout_ns.
	 */
	enum te_status (*wait)(struct te_plugin_inst *inst, uint64_t timeout_ns);
	/*
	 * Since ABI 1.2, TE_PLUGIN_CAP_HYBRID_PROGRESS plugins, optional: an application thread
	 * in te_batch_wait starts (@driving 1) or stops (@driving 0) polling this instance
	 * through progress() and wait(). Between the two, progress() comes back to back (or
	 * after wait()) until the waited batch ends; the plugin's own threads may keep away from
	 * the queues progress() polls (two pollers of one queue only take turns on its lock and
	 * on the CPUs). After 0 they must take over whatever is still in flight without delay:
	 * nobody may poll again soon. Calls alternate 1, 0, 1, 0 (one polling thread per engine
	 * at a time; with TE_PLUGIN_CAP_HYBRID_PER_THREAD, per calling thread, several threads'
	 * calls interleaved), each 1 made while the plugin has slices in flight; every 1 gets its
	 * 0, at the latest before fini. Must not block; returns nothing. Concurrently with any op but
	 * init, query_caps, query_devices and fini.
	 */
	void (*drive)(struct te_plugin_inst *inst, uint32_t driving);

	/* --- since ABI 1.2: memory kinds (caps.owned_mem_types; mem_alloc/mem_free also for
	 * caps.alloc_mem_types) --- */
	/*
	 * mem_query: whether [@addr, +@len) is memory of a kind this plugin owns: TE_OK with
	 * *mem_type_out (one TE_PLUGIN_MEM_* bit) and *dev_out; TE_ERR_NOT_FOUND when it is not
	 * (host memory, or another kind's); TE_ERR_OUT_OF_RANGE when one allocation of ours holds
	 * @addr but the range runs past its end (say which through set_error). Must not block.
	 * Thread-safe, like every mem_* op.
	 */
	enum te_status (*mem_query)(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				    uint32_t *mem_type_out, int32_t *dev_out);
	/*
	 * mem_copy: copy @len bytes between memory of owned kind @mem_type on device @dev and
	 * host memory, in direction @dir; returns once the bytes are in place. Any thread.
	 */
	enum te_status (*mem_copy)(struct te_plugin_inst *inst, void *dst, const void *src,
				   uint64_t len, uint32_t mem_type, int32_t dev,
				   enum te_plugin_copy_dir dir);
	/*
	 * mem_dmabuf: a dmabuf fd for [@addr, +@len) of an owned kind (the caller closes it)
	 * and the offset of @addr in it. Optional: TE_ERR_UNSUPPORTED without driver support.
	 */
	enum te_status (*mem_dmabuf)(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				     int *fd_out, uint64_t *offset_out);
	/*
	 * mem_alloc / mem_free: @len bytes of kind @mem_type (one bit of caps.owned_mem_types or
	 * caps.alloc_mem_types) on device @dev: TE_OK with *ptr_out; TE_ERR_NOMEM (nothing left:
	 * say how much is in use through set_error), TE_ERR_NO_DEVICE, TE_ERR_MEMORY_TYPE, or
	 * the runtime's failure, with set_error's reason (e.g. options the allocation needs).
	 * Owned kinds: device memory of the kind, as the runtime allocates it. Kinds of
	 * alloc_mem_types: memory this plugin's own reg_mem accepts as that kind at location
	 * "<kind>:@dev" and reaches peers through (cxl: a range of its window, registered with
	 * its window key), page-aligned, mapped in this process, contents unspecified. Memory
	 * handed out must not be handed out again, by this instance or by any other process or
	 * host this plugin shares the memory with, until mem_free.
	 * mem_free: TE_OK; TE_ERR_NOT_FOUND for a pointer mem_alloc did not return (or already
	 * freed). The core never frees memory still registered: te_mem_free unregisters what
	 * te_mem_alloc_registered registered and refuses (TE_ERR_BUSY) while a batch or a
	 * registration of the application still covers it, so a plugin that still finds one of
	 * its reg_mem handles inside the allocation may refuse with TE_ERR_BUSY and keep it.
	 * What is not freed by fini's time is the plugin's to release in fini. Thread-safe.
	 */
	enum te_status (*mem_alloc)(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
				    uint64_t len, void **ptr_out);
	enum te_status (*mem_free)(struct te_plugin_inst *inst, void *ptr);

	/* --- since ABI 1.2: peers --- */
	/*
	 * load_peer with what the core knows of the peer (@info: name, host identity, pid), so a
	 * TE_PLUGIN_CAP_SAME_HOST_ONLY plugin need not publish them itself. Optional: when set,
	 * the core calls it instead of load_peer (which may then be NULL); same contract and
	 * threads as load_peer.
	 */
	enum te_status (*load_peer_ex)(struct te_plugin_inst *inst,
				       const struct te_plugin_peer_info *info, const void *blob,
				       size_t len, struct te_plugin_peer **peer_out);

	/* --- since ABI 1.2: statistics --- */
	/*
	 * stats: what the instance counts (e.g. per peer: lanes configured and used, slices and
	 * bytes per lane, reconnects), as one JSON object, UTF-8 and NUL-terminated, written to
	 * @buf (@len bytes; @buf may be NULL when @len is 0). *needed_out is always set to the
	 * object's size including its NUL. TE_OK when it fit; TE_ERR_TOO_LARGE when it did not
	 * (nothing usable in @buf: the core calls again with *needed_out bytes; the object may
	 * have grown meanwhile). The keys are the plugin's own and documented with it; counters
	 * are cumulative since init. Optional: the core calls it when set (te_engine_stats).
	 * Thread-safe, concurrently with every op but init and fini; it must not wait for the
	 * data path (read counters, not queues).
	 */
	enum te_status (*stats)(struct te_plugin_inst *inst, char *buf, size_t len,
				size_t *needed_out);
};

/*
 * Declared options (since ABI 1.2), the way libfabric's fi_param lists a provider's: the
 * descriptor may list the options of the plugin's YAML section (transports[i].options), each
 * with a type, a default, a range or choices and a line of help.
 *
 * - The core checks the YAML against them before init: an unknown option (with a "did you
 *   mean" when a declared name is close), a value of the wrong type, out of range or not
 *   among the choices, or a missing TE_PLUGIN_OPT_REQUIRED option fails engine start with
 *   TE_ERR_CONFIG and "<file>:<line>:<col>: transports[<i>].options.<key>: <reason>", also
 *   for a transport marked optional (optional only means the module may be absent from this
 *   host). `te-info PLUGIN` lists the declarations; `te-info --config FILE` checks them.
 * - From init on, host->config_get returns the effective value of each declared option in
 *   normal form, its default when the YAML leaves it out or sets it to null (NULL only for an
 *   option without a default that the YAML does not set), and config_foreach yields them in
 *   declaration order. Normal forms: BOOL "true" or "false" (the YAML may write true/false,
 *   yes/no, on/off in any case); INT decimal with '-' when negative; SIZE decimal bytes (the
 *   YAML may write 64K, 64KiB, 1M, 1G, 1T: powers of 1024); STRING as written (may be empty);
 *   CHOICE the declared choice (exact match). So a plugin only converts (strtoll, strtoull or
 *   te_plugin_opts.h's te_plugin_opt_*) and checks in init what the core cannot (relations
 *   between options, addresses, files) with one convention: set_error(ctx, "option '<key>':
 *   <why>") (a "<plugin>: " prefix allowed) and TE_ERR_CONFIG; the core then reports it as
 *   "<file>:<line>:<col>: transports[<i>].options.<key>: <why>" (any plugin, declared or not).
 * - The declarations are checked when the module loads: a NULL, empty, malformed
 *   ([a-z][a-z0-9_-]*, at most 63 bytes) or repeated name, an unknown type, min > max (or
 *   min < 0 for SIZE), a CHOICE without choices, a default that fails its own option's
 *   checks, REQUIRED with a default, or an element size other than desc->option_size
 *   rejects the plugin with TE_ERR_PLUGIN_INVALID naming the file and the option.
 * - A plugin that declares nothing (n_options 0, or a descriptor of minor < 2) gets its
 *   options unchecked, as the YAML wrote them (null as ""), as before: te_plugin_opts.h
 *   parses them.
 */
enum te_plugin_option_type {
	TE_PLUGIN_OPT_BOOL = 0,	  /* true or false */
	TE_PLUGIN_OPT_INT = 1,	  /* a signed 64-bit integer in [min, max] */
	TE_PLUGIN_OPT_SIZE = 2,	  /* a byte count in [min, max] (min >= 0), suffixes K/M/G/T */
	TE_PLUGIN_OPT_STRING = 3, /* any text */
	TE_PLUGIN_OPT_CHOICE = 4, /* one of choices */
};

/* te_plugin_option.flags */
#define TE_PLUGIN_OPT_REQUIRED (1u << 0) /* the YAML must set it (it has no default then) */

/* At most this many declarations per plugin (as many options as a YAML section may hold). */
#define TE_PLUGIN_MAX_OPTIONS 64u

/* One declared option (since ABI 1.2). Static storage, like the descriptor. */
struct te_plugin_option {
	uint32_t size;		    /* sizeof(struct te_plugin_option): equals desc->option_size */
	uint32_t type;		    /* enum te_plugin_option_type */
	const char *name;	    /* the YAML key */
	const char *default_value;  /* as YAML text ("4K", "auto"); NULL: none */
	int64_t min, max;	    /* INT, SIZE: the range; both 0: no limit (SIZE: >= 0) */
	const char *const *choices; /* CHOICE: NULL-terminated; otherwise NULL */
	const char *help;	    /* one line for te-info; may be NULL */
	uint32_t flags;		    /* TE_PLUGIN_OPT_* */
};

/*
 * Declaration helpers, usable in C and C++ (positional):
 *   static const char *const my_modes[] = { "auto", "poll", NULL };
 *   static const struct te_plugin_option my_options[] = {
 *           TE_PLUGIN_OPTION_INT("queue_depth", "128", 1, 4096, "work requests per queue"),
 *           TE_PLUGIN_OPTION_CHOICE("mode", "auto", my_modes, "how completions are found"),
 *   };
 *   static const struct te_plugin_desc my_desc = { ..., TE_PLUGIN_OPTIONS(my_options) };
 */
#define TE_PLUGIN_OPTION(type, name, def, min, max, choices, flags, help)                          \
	{                                                                                          \
		(uint32_t)sizeof(struct te_plugin_option), (type), (name), (def), (min), (max),    \
			(choices), (help), (flags)                                                 \
	}
#define TE_PLUGIN_OPTION_BOOL(name, def, help)                                                     \
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_BOOL, name, def, 0, 0, NULL, 0, help)
#define TE_PLUGIN_OPTION_INT(name, def, min, max, help)                                            \
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_INT, name, def, min, max, NULL, 0, help)
#define TE_PLUGIN_OPTION_SIZE(name, def, min, max, help)                                           \
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_SIZE, name, def, min, max, NULL, 0, help)
#define TE_PLUGIN_OPTION_STRING(name, def, help)                                                   \
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, name, def, 0, 0, NULL, 0, help)
#define TE_PLUGIN_OPTION_CHOICE(name, def, choices, help)                                          \
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_CHOICE, name, def, 0, 0, choices, 0, help)
/* The descriptor members for a static array of declarations (C designated initializers). */
#define TE_PLUGIN_OPTIONS(array)                                                                   \
	.options = (array), .n_options = (uint32_t)(sizeof(array) / sizeof((array)[0])),           \
	.option_size = (uint32_t)sizeof(struct te_plugin_option)

/* What the entry point returns. Static storage; never freed. */
struct te_plugin_desc {
	uint32_t size;
	uint32_t abi_major; /* TE_PLUGIN_ABI_MAJOR the plugin was built with */
	uint32_t abi_minor; /* TE_PLUGIN_ABI_MINOR the plugin was built with */
	const char *name;   /* equals the module file stem and the YAML name */
	const char *version;
	const char *description;
	const struct te_plugin_ops *ops;
	/* --- since ABI 1.2 --- */
	/*
	 * Declared options ("Declared options" above): @n_options elements of @option_size
	 * bytes each (the stride: the element type may grow), at most TE_PLUGIN_MAX_OPTIONS.
	 * NULL/0: none declared, options are free-form.
	 */
	const struct te_plugin_option *options;
	uint32_t n_options;
	uint32_t option_size;
};

/* Signature of the entry point. */
typedef const struct te_plugin_desc *(*te_plugin_entry_fn)(void);

/*
 * Declare a plugin's entry point:
 *   TE_PLUGIN_DEFINE(&my_desc)
 */
#ifdef __cplusplus
#define TE_PLUGIN_EXTERN_C extern "C"
#else
#define TE_PLUGIN_EXTERN_C
#endif
#define TE_PLUGIN_DEFINE(desc_ptr)                                                                 \
	TE_PLUGIN_EXTERN_C TE_PLUGIN_EXPORT const struct te_plugin_desc *TE_PLUGIN_ENTRY(void);    \
	TE_PLUGIN_EXTERN_C TE_PLUGIN_EXPORT const struct te_plugin_desc *TE_PLUGIN_ENTRY(void)     \
	{                                                                                          \
		return (desc_ptr);                                                                 \
	}

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_H */
