/* SPDX-License-Identifier: Apache-2.0 */
/* transport.h: one initialised plugin instance inside an engine, and the host services. */
#ifndef TE_CORE_TRANSPORT_H
#define TE_CORE_TRANSPORT_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <glib.h>

#include "core/config.h"
#include "core/plugin.h"

#define TRANSPORT_MAX_DEVICES TE_PLUGIN_MAX_DEVICES
#define TRANSPORT_MAX_PRIV TE_PLUGIN_SLICE_PRIV_MAX

struct engine;
struct slice;

struct transport {
	struct engine *engine; /* NULL when probed by tools */
	struct plugin *plugin;
	const struct config_transport *cfg; /* NULL: no options */
	unsigned index;			    /* position in the engine's priority list */
	struct te_plugin_inst *inst;
	struct te_plugin_caps caps;
	struct te_plugin_device devices[TRANSPORT_MAX_DEVICES];
	uint32_t n_devices;
	/* "<device> (staged)": what a task moved through host bounce buffers reports. */
	char staged_names[TRANSPORT_MAX_DEVICES][96];
	/* Published transport blob (descriptor "transports" section). */
	GMutex blob_lock;
	GBytes *blob;
	/* SERIALIZED plugins: every data-path call under this lock. */
	bool serialized;
	GMutex call_lock;
	/* Quarantine: absolute now_ns until which device d is paused (0: usable). */
	_Atomic uint64_t dev_paused_until[TRANSPORT_MAX_DEVICES];
	_Atomic uint32_t dev_failures[TRANSPORT_MAX_DEVICES];
	_Atomic uint64_t any_paused_until; /* max of dev_paused_until (fast path) */
	/* Slices refused by back-pressure, resubmitted by the engine worker. */
	GMutex backlog_lock;
	struct slice *backlog_head;
	struct slice *backlog_tail;
	_Atomic uint32_t backlog_len;
	/*
	 * Back-pressure backoff (core/slice.c): after a submit that accepted nothing, the
	 * backlog is not offered again before stall_until_ns (engine_now_ns) unless a slice
	 * of this transport completes first (slice_done clears it; 0: not stalled).
	 * stall_step_ns: the last wait, 100 us doubling to 1 ms; 0 once submit accepts again.
	 * Written only while stalled: the per-slice paths only read stall_until_ns.
	 */
	_Atomic uint64_t stall_until_ns;
	_Atomic uint64_t stall_step_ns;
	/* Set before fini: the core makes no further calls into the plugin. */
	_Atomic bool stopped;
	/* Last error/warning line the plugin logged (quoted in init failures). */
	char last_log[256];
	/* Slices handed to the plugin and not yet returned (when polled, below). */
	_Atomic int64_t in_flight;
	/*
	 * te_batch_wait polls it (progress, wait): MANUAL, or hybrid (AUTO with
	 * TE_PLUGIN_CAP_HYBRID_PROGRESS and MULTI: the core's workers never poll it).
	 * Both count in_flight. Set by transport_start.
	 */
	bool polled;
	bool hybrid;
	bool per_thread; /* hybrid with TE_PLUGIN_CAP_HYBRID_PER_THREAD: waiters poll at once */
	/* Bounce buffers for local memory it cannot reach itself (core/stage.c), made lazily. */
	GMutex stage_lock;
	struct stage_pool *stage;
};

/*
 * transport_start - init the plugin with its YAML options, query caps and devices.
 * @engine may be NULL (te-info probing): logs then go to stderr. @host: the services
 * table the plugin gets (core/host.h), with the transport as its ctx.
 * On failure *err_out (g_free) names the plugin file and the reason.
 */
enum te_status transport_start(struct engine *engine, struct plugin *plugin,
			       const struct te_plugin_host *host,
			       const struct config_transport *cfg, unsigned index,
			       struct transport **transport_out, char **err_out);

/* fini the plugin instance and free; NULL is a no-op. */
void transport_stop(struct transport *t);

/* fini the plugin instance (its peers, keys, registrations and slices); no call after. */
void transport_fini(struct transport *t);

/* Free a transport whose plugin instance was already fini'd. */
void transport_free(struct transport *t);

/* Copy of the published blob (or NULL); caller g_bytes_unref. */
GBytes *transport_blob(struct transport *t);

/* Quarantine device @dev until @until_ns (UINT64_MAX: until an UP event). */
void transport_pause_device(struct transport *tp, uint32_t dev, uint64_t until_ns);

/*
 * Plugin ops. This module is the only caller of a plugin's ops: each wrapper clears the
 * thread's op error (what the plugin says through host->set_error, read back with
 * transport_error) and, for a SERIALIZED plugin, holds call_lock across the data-path ops
 * named in transport.c. submit and progress run per slice: static inline below.
 */
static inline void transport_lock(struct transport *tp)
{
	if (tp->serialized)
		g_mutex_lock(&tp->call_lock);
}

static inline void transport_unlock(struct transport *tp)
{
	if (tp->serialized)
		g_mutex_unlock(&tp->call_lock);
}

void transport_clear_error(void);

TE_NODISCARD static inline enum te_status transport_submit(struct transport *tp,
							   struct te_plugin_slice **ps, uint32_t n,
							   uint32_t *accepted_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.submit(tp->inst, ps, n, accepted_out);
	transport_unlock(tp);
	return st;
}

static inline uint32_t transport_progress(struct transport *tp, uint32_t budget)
{
	uint32_t n;

	transport_lock(tp);
	n = tp->plugin->ops.progress(tp->inst, budget);
	transport_unlock(tp);
	return n;
}

/* Data path (serialized). */
enum te_status transport_cancel(struct transport *tp, struct te_plugin_slice *ps);
TE_NODISCARD enum te_status transport_retry_prepare(struct transport *tp,
						    struct te_plugin_slice *ps);
/* Block in the plugin up to @timeout_ns; never for a serialized one (TE_ERR_UNSUPPORTED). */
enum te_status transport_wait(struct transport *tp, uint64_t timeout_ns);
/* Hybrid progress: a waiting thread starts (1) or stops (0) polling @tp (op drive, if any). */
void transport_drive(struct transport *tp, uint32_t driving);
TE_NODISCARD enum te_status transport_handshake(struct transport *tp, const char *peer_name,
						const void *req, size_t len, void *resp, size_t cap,
						size_t *resp_len_out);
/* Peers and keys (serialized). */
TE_NODISCARD enum te_status transport_load_peer(struct transport *tp,
						const struct te_plugin_peer_info *info,
						const void *blob, size_t len,
						struct te_plugin_peer **peer_out);
void transport_unload_peer(struct transport *tp, struct te_plugin_peer *peer);
TE_NODISCARD enum te_status transport_unpack_remote_key(struct transport *tp,
							struct te_plugin_peer *peer,
							const void *blob, size_t len, uint64_t addr,
							uint64_t length,
							struct te_plugin_rkey **rkey_out);
void transport_release_remote_key(struct transport *tp, struct te_plugin_rkey *rkey);
/* Registrations (serialized). */
TE_NODISCARD enum te_status transport_reg_mem(struct transport *tp, void *addr, uint64_t length,
					      uint32_t mem_type, int32_t dev, uint32_t access,
					      struct te_plugin_mem **mem_out);
enum te_status transport_dereg_mem(struct transport *tp, struct te_plugin_mem *mem);
TE_NODISCARD enum te_status transport_pack_key(struct transport *tp, struct te_plugin_mem *mem,
					       void *buf, size_t cap, size_t *len_out);
/*
 * Memory-kind owner ops (never serialized: a plugin's reg_mem may ask the owner of a kind,
 * itself included, through the host table while the call lock is held).
 */
TE_NODISCARD enum te_status transport_mem_query(struct transport *tp, const void *addr,
						uint64_t len, uint32_t *mem_type_out,
						int32_t *dev_out);
TE_NODISCARD enum te_status transport_mem_copy(struct transport *tp, void *dst, const void *src,
					       uint64_t len, uint32_t mem_type, int32_t dev,
					       enum te_plugin_copy_dir dir);
TE_NODISCARD enum te_status transport_mem_dmabuf(struct transport *tp, const void *addr,
						 uint64_t len, int *fd_out, uint64_t *offset_out);
TE_NODISCARD enum te_status transport_mem_alloc(struct transport *tp, uint32_t mem_type,
						int32_t dev, uint64_t length, void **ptr_out);
enum te_status transport_mem_free(struct transport *tp, void *ptr);

/* Per-thread "why the last op failed" that plugins give through host->set_error. */
const char *transport_error(struct transport *tp);
/* What the last plugin op on this thread said with set_error ("" if nothing). */
const char *transport_op_error(void);

/* Devices to avoid for a new attempt: quarantined ones, unless that is all of them. */
uint64_t transport_paused_devices(struct transport *tp, uint64_t now);

/* host->set_error: what the current op says went wrong (read with transport_error). */
void transport_set_error_v(const char *fmt, va_list ap) G_GNUC_PRINTF(1, 0);

#endif /* TE_CORE_TRANSPORT_H */
