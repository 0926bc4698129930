/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_priv.h: objects and internal interfaces shared by the rdma plugin's source files. */
#ifndef TE_PLUGINS_RDMA_PRIV_H
#define TE_PLUGINS_RDMA_PRIV_H

/*
 * Shape of the plugin (README.md has the wire formats and the user-visible semantics).
 *
 * Devices (rdma.c). init opens the devices named by the `devices` option, or every device
 * with an active port. Per device: a PD, one CQ shared by all its QPs (with a completion
 * channel in AUTO mode), the GID chosen for RoCE and a snapshot of its GID table. Device d
 * is index d in slice->device, excluded_devices and the published blob.
 *
 * Memory (rdma.c). reg_mem registers a region on every device; a region larger than a
 * device's max MR size is registered as overlapping chunks (chunk c covers
 * [c * step, c * step + chunk_len) with chunk_len - step >= the largest slice), so every
 * slice lies inside one chunk on both sides. The key blob carries every device's rkeys
 * and the devices the region prefers (topology: YAML, else the NUMA node of the buffer).
 * GPU memory is registered through a dmabuf its owner exports (host->mem_dmabuf,
 * ibv_reg_dmabuf_mr with iova = the device pointer), so the data path treats it like host
 * memory: the NIC reaches it by lkey/rkey and the CPU never touches it (no inline sends, no
 * copies). Without a dmabuf reg_mem answers TE_ERR_UNSUPPORTED and the core stages the region.
 *
 * Peers and QPs (rdma_conn.c). A peer has a path per (local device, remote device) with
 * qp_per_peer RC QPs. load_peer connects one path per local device (rail pairing) through
 * host->peer_handshake; the peer plugin's handshake op creates the passive QPs and answers
 * with their numbers, GID and MTU. Other paths, and QPs that went to error, are connected
 * on demand by the control thread, never from submit.
 *
 * Data path (rdma_io.c). submit picks a path per slice (striping over the region's
 * preferred devices), reserves a send slot on a QP and a CQ credit (both atomic counters:
 * when none is free the rest is back-pressure) and fills the slot's work request. Each QP's
 * share of the call becomes one chain of signaled RDMA READ/WRITE work requests; in AUTO
 * mode the poller rings the doorbell (one ibv_post_send per chain of up to post_batch) and
 * reaps completions, like perftest's single loop; in MANUAL mode (or doorbell: submitter)
 * the submitting thread posts and progress() reaps. Completions come back in order per QP;
 * a slot's wr_id is its address. The poller busy-polls while completions keep coming, naps
 * (growing to poll_nap_us) while work is in flight but quiet, and sleeps on the completion
 * channel when nothing is in flight.
 *
 * Failures. The first error completion moves the QP to ERROR: it takes no more work, its
 * remaining (flushed) work requests fail with a retryable status, and once it has drained
 * the control thread destroys it; the next demand creates a fresh one with a new handshake.
 * Statuses map to te statuses with ibv_wc_status_str() in the detail. Retryable local
 * errors let the core exclude the device; remote ones make retry_prepare pick another
 * remote device. Async events mark devices down or up. cancel of a posted slice moves its QP
 * to ERROR the same way (rdma_io_cancel): the slice is reported from its flush completion,
 * so no packet of it leaves after the core learns that it ended.
 *
 * Threads and locks. submit/cancel/retry_prepare run on any thread (THREAD_MULTI). A QP's
 * lock covers its ring head and ibv_post_send; its tail belongs to whoever holds the
 * device's poll lock. ri->lock covers the peer list, the passive QP table and the job list.
 * host->slice_done is never called with a plugin lock held.
 *
 * Three threads: the poller (AUTO only) posts and reaps; the control thread runs the
 * handshakes of on-demand connections, destroys drained QPs and sends close messages; the
 * event thread only reads and acknowledges async events. ibv_destroy_qp waits until every
 * async event of the QP is acknowledged, so the event thread never destroys anything and no
 * thread destroys a QP while holding a lock the event thread takes.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <te/te_plugin.h>
#include <te/te_plugin_util.h>

#include "rdma_verbs.h"

/* The project version, passed by the build (plugins/meson.build); 0.0.0 outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define RDMA_NAME "rdma"

/* --- limits ------------------------------------------------------------------------------ */

#define RDMA_MAX_DEVS 32u /* devices per instance (and in a peer's blob) */
_Static_assert(RDMA_MAX_DEVS <= TE_PLUGIN_MAX_DEVICES, "the core's device limit");
#define RDMA_MAX_PORT 32u
#define RDMA_MAX_GIDS 128u /* GID table entries kept per device */
#define RDMA_MAX_QP_PER_PEER 16u
#define RDMA_MAX_QP_DEPTH 8192u
#define RDMA_MAX_PASSIVE 4096u /* QPs created for peers' handshakes */
#define RDMA_MAX_SLICE (64ull << 20)
#define RDMA_DEF_SLICE (64ull << 10)
#define RDMA_MAX_TOPO 32u
#define RDMA_DETAIL 200u    /* longest detail text built by the plugin */
#define RDMA_BLOB_MAX 4096u /* DESCRIPTOR_MAX_BLOB of the core */
#define RDMA_NAME_LEN 32u   /* device name bytes on the wire */

/* --- wire: published blob, key blob, handshake (little-endian; README.md) ----------------- */

#define RDMA_BLOB_MAGIC 0x31424452u /* "RDB1" */
#define RDMA_BLOB_HDR 16u
#define RDMA_BLOB_DEV 64u
#define RDMA_KEY_MAGIC 0x314b4452u /* "RDK1" */
#define RDMA_KEY_HDR 56u
#define RDMA_HS_MAGIC 0x31484452u /* "RDH1": request */
#define RDMA_HR_MAGIC 0x31524452u /* "RDR1": reply */
#define RDMA_HS_HDR 32u
#define RDMA_HS_ENTRY 40u
#define RDMA_HR_HDR 16u
#define RDMA_HR_ENTRY 32u
#define RDMA_HS_CONNECT 1u
#define RDMA_HS_CLOSE 2u
#define RDMA_WIRE_VERSION 1u
#define RDMA_HS_MAX_ENTRIES 1024u

/* Values of the blob's per-device gid type byte. */
enum rdma_gid_kind {
	RDMA_GID_IB = 0,
	RDMA_GID_ROCE_V1 = 1,
	RDMA_GID_ROCE_V2 = 2,
};

/* --- objects ------------------------------------------------------------------------------ */

struct rdma_inst;

/* One GID table entry of a device's port. */
struct rdma_gid {
	union ibv_gid gid;
	uint32_t index;
	uint32_t type; /* enum ibv_gid_type */
};

struct rdma_dev {
	struct rdma_inst *ri;
	uint32_t index;
	char name[64];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *chan; /* AUTO only */
	struct ibv_cq *cq;
	uint32_t cqe;
	uint8_t port;
	uint8_t link_layer; /* IBV_LINK_LAYER_* */
	bool gid_fixed;	    /* gid_index came from the options */
	int32_t numa;
	char pci[32];
	uint64_t speed_mbps;
	uint64_t max_mr_size;
	uint32_t max_qp_wr;
	uint32_t max_rd_atom;	   /* as responder */
	uint32_t max_init_rd_atom; /* as initiator */
	uint32_t max_msg;

	/* Port state, GID choice and table: refreshed by the control thread on port events. */
	pthread_mutex_t gid_lock;
	uint16_t lid;
	enum ibv_mtu active_mtu;
	struct rdma_gid gid;   /* the default choice (published) */
	struct rdma_gid *gids; /* usable entries of the port */
	uint32_t n_gids;

	atomic_bool up;	   /* port active and device not fatal */
	atomic_bool fatal; /* IBV_EVENT_DEVICE_FATAL seen */
	atomic_int cq_credits;

	pthread_mutex_t post_lock;	     /* QPs with work for the poller to post */
	_Atomic(struct rdma_qp *) post_head; /* written under post_lock, peeked without */
	pthread_mutex_t poll_lock;	     /* one reaper per CQ at a time */
	uint32_t unacked_events;	     /* under poll_lock (AUTO: the poller) */
};

/* One send slot of a QP: the work request lives here, wr_id is the slot's address. */
struct rdma_slot {
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	struct rdma_qp *qp;
	struct te_plugin_slice *slice;
};

enum rdma_qp_state {
	RDMA_QP_IDLE = 0,   /* no verbs QP; the next demand connects one */
	RDMA_QP_CONNECTING, /* the control thread is creating and handshaking it */
	RDMA_QP_READY,
	RDMA_QP_ERROR, /* took an error: no new work; destroyed once drained */
};

struct rdma_path;

struct rdma_qp {
	struct rdma_path *path;
	uint32_t qidx;
	atomic_int state; /* enum rdma_qp_state */
	struct ibv_qp *qp;
	uint32_t qpn, rqpn;
	uint32_t depth;
	atomic_int credits; /* free slots: depth - reserved - posted and not reaped */
	pthread_mutex_t lock;
	uint64_t head; /* under lock */
	uint64_t tail; /* under the device's poll lock */
	struct rdma_slot *slots;
	uint32_t generation; /* connections made so far (for logs) */
	/* Filled, not yet posted: slots [pend_base, pend_base + pend_n) (doorbell: poller). */
	uint64_t pend_base;	 /* under lock */
	uint32_t pend_n;	 /* under lock */
	atomic_bool post_queued; /* on its device's post list */
	struct rdma_qp *post_next;
	/* Why the current connection broke, for flush details: the first error completion
	 * (written by the reaper that moved the QP to ERROR), or an async event (err_event). */
	char err[RDMA_DETAIL];
	atomic_int err_event; /* enum ibv_event_type + 1; RDMA_ERR_CANCELED; 0: none */
};

/* err_event of a QP that cancel moved to the error state (rdma_io_cancel). */
#define RDMA_ERR_CANCELED (-1)

/* Local device l towards the peer's device r. */
struct rdma_path {
	struct rdma_peer *peer;
	uint32_t l, r;
	atomic_uint rr;
	atomic_bool queued; /* on ri->path_jobs */
	atomic_bool want;   /* a submit needs more QPs connected */
	struct rdma_path *job_next;
	/* Result of the last failed connect (status 0: none), for slices with nowhere to go. */
	pthread_mutex_t fail_lock;
	atomic_bool failed; /* fail_status is set */
	int32_t fail_status;
	uint64_t fail_ns;
	char fail_detail[RDMA_DETAIL];
	enum ibv_mtu mtu;
	struct rdma_qp qps[];
};

/* A device of a peer, from its published blob. */
struct rdma_rdev {
	char name[RDMA_NAME_LEN + 1];
	union ibv_gid gid;
	uint16_t lid;
	uint8_t port;
	uint8_t link_layer;
	uint8_t mtu;
	uint8_t gid_kind;
	uint8_t up; /* its port was active when the blob was published */
};

struct rdma_peer {
	struct rdma_inst *ri;
	char *name;
	uint64_t nonce;	  /* the peer instance's */
	uint32_t conn_id; /* ours: keys the passive QPs the peer made for this object */
	uint32_t n_rdev;
	struct rdma_rdev rdev[RDMA_MAX_DEVS];
	struct rdma_path **paths; /* [l * n_rdev + r] */
	atomic_int refs;	  /* the core's, plus one per queued job */
	atomic_bool closing;
	struct te_plugin_naming_peer np; /* under ri->naming */
	struct rdma_peer *prev, *next;
};

/* Registered local memory. */
struct rdma_mem {
	uint64_t addr, length;
	uint32_t access; /* TE_PLUGIN_ACCESS_* */
	uint64_t step, chunk_len;
	uint32_t n_chunks;
	uint32_t n_pref;
	uint8_t pref[RDMA_MAX_DEVS]; /* preferred devices, in striping order */
	uint64_t pref_mask;
	uint64_t valid_mask; /* devices the region is registered on */
	atomic_uint rr;
	struct ibv_mr **mrs; /* [d * n_chunks + c]; NULL on a fatal device */
	uint32_t *lkeys;
	struct rdma_mem *prev, *next;
};

/* A peer's region, from its key blob. */
struct rdma_rkey {
	uint64_t addr, length;
	uint32_t access;
	uint64_t step, chunk_len;
	uint32_t n_chunks;
	uint32_t n_rdev;
	uint32_t n_pref;
	uint8_t pref[RDMA_MAX_DEVS];
	uint64_t valid_mask; /* the peer's devices that hold keys for the region */
	/*
	 * When (host now_ns) the peer refused one of these keys for a request inside the
	 * region, as checked at submit; 0: never. The registration is gone there (unregistered,
	 * or registered again under new keys): for key_refused_hold_ms, requests under it fail
	 * at submit, and its flushed requests are not retried, instead of putting QP after QP
	 * in error and flushing the other requests on them. A fresh descriptor brings a fresh
	 * key object.
	 */
	_Atomic uint64_t refused_ns;
	struct rdma_rkey *prev, *next;
	uint32_t keys[]; /* [r * n_chunks + c] */
};

/* Failure classes remembered per slice between attempts. */
enum rdma_fail_class {
	RDMA_FAIL_NONE = 0,
	RDMA_FAIL_LOCAL,  /* the local device: the core excludes it */
	RDMA_FAIL_REMOTE, /* the remote device: retry_prepare avoids it */
	RDMA_FAIL_FLUSH,  /* flushed by an error of its QP: any path will do */
};

/* Per-slice state in slice->priv (no allocation per slice). */
struct rdma_spriv {
	uint64_t tag;		      /* ri->tag ^ slice address: initialised by this instance */
	struct te_plugin_slice *next; /* bucket chain in submit, then the deferred list */
	struct rdma_qp *qp;	      /* chosen in submit */
	uint64_t rexcl;		      /* remote devices that failed for this slice */
	uint32_t attempt;	      /* slice->attempt this state belongs to */
	uint32_t lkey, rkey;
	_Atomic(struct rdma_slot *) slot; /* posted in this slot (cancel), NULL otherwise */
	uint8_t l, r;			  /* devices of the last attempt */
	uint8_t chosen;			  /* retry_prepare chose l */
	uint8_t fail_class;		  /* enum rdma_fail_class of the last attempt */
	int32_t status;			  /* deferred failure */
	char detail[RDMA_DETAIL - 56];
};
_Static_assert(sizeof(struct rdma_spriv) <= TE_PLUGIN_SLICE_PRIV_MAX, "slice_priv_size limit");

/* A QP created by the handshake op for a peer's initiator QP. */
struct rdma_passive {
	char *from;	  /* peer segment name */
	uint64_t nonce;	  /* peer instance */
	uint32_t conn_id; /* peer's peer object */
	uint8_t l, r, qidx;
	struct ibv_qp *qp;
};

/* A close message to send (unload_peer): the peer may destroy our passive QPs. */
struct rdma_bye {
	char *to;
	uint64_t to_nonce;
	uint32_t conn_id;
	uint64_t due_ns; /* sent from then on, unless the instance is stopping by then */
	struct rdma_bye *next;
};

/* Topology entry: buffers at this location prefer these devices. */
struct rdma_topo {
	uint32_t mem_type; /* TE_PLUGIN_MEM_* */
	int32_t dev;	   /* location number; -1: any */
	uint64_t mask;
	uint32_t n;
	uint8_t devs[RDMA_MAX_DEVS];
};

/* Option gpu_direct: how GPU memory (cuda, hip) is registered with the NICs. */
enum rdma_gpu_direct {
	RDMA_GPU_AUTO = 0, /* through a dmabuf where its owner exports one; else the core stages */
	RDMA_GPU_DMABUF,   /* through a dmabuf, or the registration fails */
	RDMA_GPU_PEERMEM,  /* ibv_reg_mr of the device pointer (the vendor's peer-memory module) */
	RDMA_GPU_OFF,	   /* never: the core stages GPU memory on this side */
};

enum rdma_fault {
	RDMA_FAULT_NONE = 0,
	RDMA_FAULT_RKEY, /* the n-th work request carries a wrong rkey */
	RDMA_FAULT_OOB,	 /* the n-th work request targets the bytes past its remote chunk */
};

struct rdma_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	const struct rdma_verbs *v;

	/* options */
	uint32_t qp_per_peer;
	uint32_t qp_depth;
	uint32_t post_batch; /* work requests per ibv_post_send */
	bool poller_posts;   /* doorbell: poller (AUTO): the poller thread posts */
	uint32_t cq_depth;
	uint64_t slice_size;
	uint64_t max_mr_opt;
	bool manual;
	enum rdma_gpu_direct gpu_direct;
	uint32_t gpu_types; /* GPU kinds (TE_PLUGIN_MEM_*) reg_mem takes: caps.mem_types */
	uint8_t ib_timeout, retry_cnt, rnr_retry, sl, traffic_class;
	enum ibv_mtu mtu_cap;
	uint32_t handshake_timeout_ms;
	uint32_t reconnect_backoff_ms;
	uint64_t key_refused_hold_ns; /* option key_refused_hold_ms */
	uint64_t spin_ns;	      /* poll_spin_us */
	uint64_t nap_ns;	      /* poll_nap_us */
	struct rdma_topo topo[RDMA_MAX_TOPO];
	uint32_t n_topo;
	enum rdma_fault fault;
	uint64_t fault_nth;
	atomic_uint_fast64_t wr_count; /* only counted when a fault is armed */

	uint64_t nonce;
	uint64_t tag;
	uint64_t max_mr;  /* largest MR: min over devices and the option */
	uint64_t overlap; /* chunk overlap: the largest slice */
	uint32_t n_devs;
	struct rdma_dev devs[RDMA_MAX_DEVS];

	pthread_mutex_t lock;
	struct rdma_peer *peers;
	struct rdma_peer *zombies; /* unloaded with work requests still in flight (shutdown) */
	uint32_t next_conn_id;
	struct rdma_passive *passive;
	uint32_t n_passive, cap_passive;
	struct rdma_path *path_jobs; /* paths the control thread must look at */
	struct rdma_bye *byes;
	/* The control thread names a peer (mark_failed) only before its unload_peer returns. */
	struct te_plugin_naming naming;
	/* Passive QPs an async event broke (event thread -> control thread). */
	pthread_mutex_t broken_lock;
	struct {
		struct ibv_qp *qp;
		uint32_t qpn;
	} broken[64];
	uint32_t n_broken;
	struct rdma_mem *mems;
	struct rdma_rkey *rkeys;

	pthread_mutex_t defer_lock;
	struct te_plugin_slice *defer_head, *defer_tail;
	atomic_uint n_defer;

	atomic_llong inflight;	   /* posted work requests not reaped */
	atomic_bool poller_asleep; /* the poller waits in poll(): kick it */
	atomic_bool stopping;	   /* poller and control thread */
	atomic_bool ev_stopping;   /* event thread: stops after every QP is destroyed */
	int poll_kick_fd, conn_kick_fd, ev_kick_fd;
	pthread_t poller, conn, events;
	bool poller_started, conn_started, events_started;
};

/* --- helpers shared by the source files ----------------------------------------------------- */

#define rdma_log(ri, level, ...) (ri)->host->log((ri)->ctx, (level), __VA_ARGS__)

static inline struct rdma_spriv *rdma_priv(const struct te_plugin_slice *s)
{
	return (struct rdma_spriv *)s->priv;
}

/* @why without its "rdma: " prefix (the host prefixes log lines and errors with the name). */
static inline const char *rdma_unprefixed(const char *why)
{
	return strncmp(why, RDMA_NAME ": ", sizeof(RDMA_NAME ": ") - 1)
		       ? why
		       : why + sizeof(RDMA_NAME ": ") - 1;
}

static inline uint64_t rdma_dev_bit(uint32_t d)
{
	return 1ull << d;
}


/* "fe80::1" / "::ffff:127.0.0.1" text of a GID. */
void rdma_gid_text(const union ibv_gid *gid, char *buf, size_t len);
/* Bytes of an MTU enum value (256..4096; 0 for anything else). */
uint32_t rdma_mtu_bytes(enum ibv_mtu mtu);
void rdma_kick(int fd);
/* Say why the current op fails (host->set_error, quoted to the user) and log it at info. */
void rdma_set_error(struct rdma_inst *ri, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);

/* rdma.c: device state */
/* The GID of device @d to use towards a peer GID @peer (NULL: the default); locked inside. */
void rdma_dev_pick_gid(struct rdma_dev *d, const union ibv_gid *peer, struct rdma_gid *out);
void rdma_dev_snapshot(struct rdma_dev *d, uint16_t *lid_out, enum ibv_mtu *mtu_out);

/* rdma_conn.c */
enum te_status rdma_conn_load_peer(struct rdma_inst *ri, const char *name, const void *blob,
				   size_t len, struct rdma_peer **peer_out);
void rdma_conn_unload_peer(struct rdma_inst *ri, struct rdma_peer *peer);
enum te_status rdma_conn_handshake(struct rdma_inst *ri, const char *peer_name, const void *req,
				   size_t req_len, void *resp, size_t cap, size_t *resp_len_out);
/* Ask the control thread to look at @path (drained QPs in error, wanted connections). */
void rdma_conn_queue_path(struct rdma_inst *ri, struct rdma_path *path);
void *rdma_conn_thread(void *arg);
/* A passive QP broke (event thread): the control thread drops it. */
void rdma_conn_passive_broken(struct rdma_inst *ri, struct ibv_qp *qp);
/* fini: flush and destroy what is left. Single-threaded. */
void rdma_conn_destroy_all(struct rdma_inst *ri);
void rdma_peer_unref(struct rdma_peer *peer);

/* rdma_io.c */
enum te_status rdma_io_submit(struct rdma_inst *ri, struct te_plugin_slice **slices, uint32_t n,
			      uint32_t *accepted_out);
uint32_t rdma_io_progress(struct rdma_inst *ri, uint32_t budget);
enum te_status rdma_io_cancel(struct rdma_inst *ri, struct te_plugin_slice *s);
enum te_status rdma_io_retry_prepare(struct rdma_inst *ri, struct te_plugin_slice *s);
void *rdma_io_poller(void *arg);
/* Post what submitters queued for the poller (doorbell: poller); returns requests posted. */
uint32_t rdma_io_post_queued(struct rdma_inst *ri);
/* te status and failure class of a work completion status (also used by the tests' table). */
enum te_status rdma_io_wc_status(enum ibv_wc_status st, enum rdma_fail_class *class_out);
/* fini: report every slice still held as canceled; waits for flushes at most @wait_ns. */
void rdma_io_drain(struct rdma_inst *ri, uint64_t wait_ns);
void rdma_io_defer_fail(struct rdma_inst *ri, struct te_plugin_slice *s, enum te_status st,
			const char *detail);

#endif /* TE_PLUGINS_RDMA_PRIV_H */
