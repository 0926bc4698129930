/* SPDX-License-Identifier: Apache-2.0 */
/* efa.h: objects and internal interfaces shared by the efa plugin's source files. */
#ifndef TE_PLUGINS_EFA_H
#define TE_PLUGINS_EFA_H

/*
 * Shape of the plugin (README.md has the options, blob formats and semantics). efa.c holds the
 * ops table, options, init/fini, caps, devices, memory and remote keys; efa_nic.c the NICs,
 * address vectors and peers; efa_io.c the data path, completions, cancel and progress.
 *
 * NICs. init asks libfabric for FI_EP_RDM endpoints with FI_RMA of one provider and opens,
 * per domain (NIC), a fabric, a domain, a CQ, an AV and one RDM endpoint. The endpoint
 * addresses (fi_getname) and the provider name form the published blob.
 *
 * Memory. reg_mem registers a region once per NIC with fi_mr_regattr, honouring the mr_mode
 * the provider returned: LOCAL (descriptors passed with every op), VIRT_ADDR (remote
 * addresses are virtual addresses, otherwise offsets from the region start), PROV_KEY (keys
 * read back, otherwise requested from a per-domain counter so they are unique per domain) and
 * ENDPOINT (bound to the endpoint and enabled). The key blob carries the per-NIC keys, the
 * region and whether the target addresses by offset.
 * GPU memory: init asks for FI_HMEM first (when the engine has memory kinds) and keeps that
 * provider only if a GPU interface of it works (efa_hmem_probe); then GPU regions are
 * registered with iface FI_HMEM_CUDA / FI_HMEM_ROCR and moved by the provider. Otherwise the
 * plugin takes host memory only: the core stages GPU memory on the local side, and peers get
 * no efa key for GPU regions (one-sided RMA cannot stage at the target).
 *
 * Peers. load_peer inserts every NIC address of the peer into every local AV (shared between
 * peer handles through a refcounted cache) and sends a small warm-up message per NIC pair so
 * that connection set-up (rxm) or the handshake (efa) happens at segment open, not on the first
 * transfer. Every endpoint keeps a few receives posted for those messages.
 *
 * Data path. submit picks a NIC per slice (round-robin over the NICs near the local buffer,
 * avoiding excluded devices), claims a slot of that NIC's in-flight window (a bitmap: the
 * window bound and the table fini walks), and posts one fi_read or fi_writemsg straight from
 * the calling thread, with slice->priv as the operation context: no allocation. A full
 * window or -FI_EAGAIN ends the accepted prefix (core back-pressure).
 *
 * Locking. Every libfabric call on a NIC runs under that NIC's mutex (FI_THREAD_DOMAIN): a
 * sleeping lock where providers' own locks spin, which matters when a post itself copies
 * (shm's CMA). Progress threads only trylock it: a NIC busy posting is left to the kick the
 * submit sends afterwards.
 *
 * Progress. Every instance runs progress threads that poll the CQs on both the active and the
 * passive side (libfabric providers move data only while someone polls). Between bursts a
 * thread sleeps on the CQ wait fd when the provider has one (after fi_trywait), otherwise for
 * poll_us; submit kicks a sleeping thread through an eventfd. Completions and CQ errors
 * (fi_cq_readerr, with fi_cq_strerror text in the detail) become host->slice_done calls.
 * With progress 'caller' (the default on providers over IP) the plugin is hybrid-progress to
 * the core (TE_PLUGIN_CAP_HYBRID_PROGRESS): the thread waiting in te_batch_wait polls the CQs
 * in efa_progress, so a completion reaches its batch with no hand-off between threads, and
 * the progress threads stay away: parked while that thread drives us (efa_drive) and
 * operations are in flight (efa_prog_park), woken when it stops with some still in flight;
 * they complete everything when nobody waits, and serve the passive side, where the core has
 * nothing in flight and never calls progress.
 *
 * Lifetimes. A slice holds its local region (mem->inflight: dereg_mem answers TE_ERR_BUSY
 * meanwhile) and its peer handle (refcount) until its completion. fini closes the endpoints,
 * which ends every operation, and reports what is left as canceled. host->slice_done is never
 * called with a plugin lock held.
 *
 * Cancel. The core reports a canceled or timed-out slice only once the plugin hands it back, so
 * that a WRITE never lands after its task ended. fi_cancel takes back receives only, never a
 * posted RMA operation; cancel marks the slice and wakes the progress thread, which fences it
 * (efa_nic_fence): over connections (tcp;ofi_rxm, net, efa) it removes the address the slice
 * was posted to from the NIC's AV and inserts it again, which (with FI_AV_REMOVE_CLEANUP, set
 * at init) closes that connection and returns every operation queued on it as canceled; on
 * shm a posted operation already ran inside the post call (CMA), or waits for a peer whose
 * process is gone, which the plugin tells by the peer's pidfd. With libfabric's tcp provider
 * before 1.18 a connection is closed only when no READ response can be half received on it
 * (read_close_unsafe): until then posts to it hold back and its READs complete. Over TCP the
 * slices that failed on a closed connection are reported once the peer has closed its end
 * too (orphan_wait), so that nothing of them lands after their task ended. README.md says
 * what may still land and when.
 */

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <te/te_plugin.h>
#include <te/te_plugin_util.h>

/* The project version, passed by the build (plugins/meson.build); 0.0.0 outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define EFA_NAME "efa"

/* --- limits and formats ------------------------------------------------------------- */

#define EFA_MAX_NICS TE_PLUGIN_MAX_DEVICES /* te's device limit (excluded_devices: a 64-bit mask) */
#define EFA_MAX_ADDR 256u		   /* longest endpoint address accepted from a peer */
#define EFA_MAX_PROV 63u
#define EFA_MAX_WINDOW 16384u
#define EFA_MAX_THREADS 64u
#define EFA_MAX_SLICE (1ull << 30)
#define EFA_DEF_SLICE (4ull << 20) /* few, large messages; transfer.slice_size overrides */
#define EFA_RX_BUFS 16u		   /* receives posted per endpoint for warm-up messages */
#define EFA_MSG_LEN 64u		   /* bytes of one such receive buffer */
#define EFA_HELLO_LEN 8u
#define EFA_HELLO_PAIRS 64u /* NIC pairs warmed per peer; beyond, only i -> i % n */
#define EFA_CQ_BATCH 32u
#define EFA_POLL_BUDGET 256u	  /* completions per CQ per loop before other CQs get a turn */
#define EFA_POST_RUN 64		  /* posts per NIC lock hold in one submit */
#define EFA_POST_HOLD_NS 10000ull /* ... and no new post after holding it this long */
#define EFA_TICK_NS (100ull * 1000 * 1000)  /* sleep bound with nothing in flight */
#define EFA_SAFETY_NS (10ull * 1000 * 1000) /* sleep bound with operations in flight */
#define EFA_CALLER_NS (1000ull * 1000)	    /* progress 'caller': the thread stays away this long */
#define EFA_FENCE_PEERS 16u		    /* connections one fence round closes (or watches) */
#define EFA_DETAIL 256u
#define EFA_PRIV_DETAIL 120u
#define EFA_FINI_READ_NS (200ull * 1000 * 1000)	 /* fini waits this long for a READ response */
#define EFA_RNIC_NONE UINT32_MAX		 /* spriv.rnic: not posted (yet) */
#define EFA_ORPHAN_MAX_NS (500ull * 1000 * 1000) /* longest wait for a closed connection's peer */

#define EFA_BLOB_MAGIC 0x31424645u /* "EFB1": published endpoints */
#define EFA_BLOB_HDR 8u
#define EFA_BLOB_MAX 4096u	  /* the descriptor's bound on a transport blob */
#define EFA_KEY_MAGIC 0x314b4645u /* "EFK1": region key */
#define EFA_KEY_HDR 40u
#define EFA_KEY_OFFSET (1u << 0)	      /* key flag: the target addresses by offset */
#define EFA_HELLO_MAGIC 0x4f4c4c4548414645ull /* "EFAHELLO" */

#define EFA_ACCESS_ALL (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)
#define EFA_MIN(a, b) ((a) < (b) ? (a) : (b))

/* --- objects ------------------------------------------------------------------------ */

enum efa_op_kind {
	EFA_OP_SLICE = 1,
	EFA_OP_RECV = 2,
	EFA_OP_HELLO = 3,
};

/* What every libfabric operation context points at; ctx first (FI_CONTEXT/FI_CONTEXT2). */
struct efa_op {
	struct fi_context2 ctx;
	uint32_t kind; /* enum efa_op_kind */
};

struct efa_nic;
struct efa_peer;
struct efa_mem;

/* Per-slice plugin state, in slice->priv. */
struct efa_spriv {
	struct efa_op op;
	struct te_plugin_slice *slice;
	struct efa_nic *nic;
	struct efa_mem *mem;
	struct efa_peer *peer;
	struct te_plugin_slice *next; /* deferred-failure list */
	uint32_t slot;
	/*
	 * Under the NIC lock: the remote NIC the slice was posted to (its connection: the AV
	 * entry peer->entries[nic * n_rnics + rnic]), EFA_RNIC_NONE until posted; and its place
	 * in the order of that entry's posts (efa_av_entry.posts).
	 */
	uint32_t rnic;
	uint32_t seq;
	atomic_uint canceled; /* enum efa_cancel_state */
	int32_t status;	      /* deferred failure */
	char detail[EFA_PRIV_DETAIL];
};
_Static_assert(sizeof(struct efa_spriv) <= TE_PLUGIN_SLICE_PRIV_MAX, "slice_priv_size limit");

/* Where cancel of a slice stands. */
enum efa_cancel_state {
	EFA_CANCEL_NONE = 0,
	EFA_CANCEL_ASKED = 1,  /* the core canceled it: efa_nic_fence has yet to act */
	EFA_CANCEL_FENCED = 2, /* its connection was closed: its outcome is on its way */
};

struct efa_rxbuf {
	struct efa_op op;
	uint8_t *buf; /* EFA_MSG_LEN bytes inside nic->msg */
};

/*
 * One AV entry shared by every peer handle that names the same address on one NIC: over
 * connections, one connection. fi_addr, posts and draining are under the NIC lock (draining is
 * also peeked without it); refs under ei->lock.
 */
struct efa_av_entry {
	fi_addr_t fi_addr;
	uint32_t posts; /* operations posted to it so far (wraps): their order on the connection */
	/* a fence waits for READ responses to close the connection: new posts hold back */
	atomic_bool draining;
	/*
	 * When a fence closed the connection, while the peer may still take in what it carried
	 * (ei->orphan_wait; 0: no wait): the slices that failed on it are held (nic->held).
	 */
	_Atomic uint64_t closed_ns;
	uint32_t refs;
	size_t len;
	uint8_t addr[EFA_MAX_ADDR];
};

struct efa_prog;

struct efa_nic {
	struct efa_inst *ei;
	uint32_t index;
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid *cq_fid; /* for fi_trywait */
	int wait_fd;	    /* CQ wait fd, -1 without one */
	uint64_t mr_mode;
	bool closed; /* fini closed the endpoint: the provider's error text is gone with it */
	/*
	 * Every libfabric call on this NIC's objects (FI_THREAD_DOMAIN): a sleeping lock, where
	 * the providers' own locks spin (shm holds its endpoint lock for a whole CMA copy).
	 */
	pthread_mutex_t lock;
	atomic_uint_fast64_t next_key;

	char name[64];
	char pci[32];
	int32_t numa;
	uint64_t speed_mbps;
	uint8_t addr[EFA_MAX_ADDR];
	size_t addrlen;

	/* In-flight window: bit set = slot used; slots[i] the slice in slot i. */
	uint32_t window;
	uint32_t n_words;
	_Atomic uint64_t *bits;
	struct te_plugin_slice *_Atomic *slots;
	atomic_uint hint;
	atomic_uint inflight;
	atomic_uint lost;      /* completions without context (provider bug) */
	atomic_uint fence_req; /* cancels since efa_nic_fence last looked (0: nothing to do) */
	/* shm: a canceled slice waits on a live peer; efa_nic_fence looks again from then on */
	atomic_uint_fast64_t fence_again_ns;
	atomic_uint reaping; /* CQ entries read under the lock, not yet given to efa_complete */

	struct efa_prog *prog;

	/* Warm-up messages: receives and the one (constant) message sent. */
	uint8_t *msg;
	struct fid_mr *msg_mr;
	void *msg_desc;
	struct efa_rxbuf rx[EFA_RX_BUFS];

	/* AV cache, under ei->lock. */
	struct efa_av_entry **av_entries;
	uint32_t n_av, cap_av;
	/* The entries with draining or closed_ns set, under the lock (efa_nic_fence clears them). */
	struct efa_av_entry *drain[EFA_FENCE_PEERS];
	uint32_t n_drain;
	/*
	 * Slices that failed on a connection a fence closed, reported once its peer closed its
	 * end (efa_release_held): under ei->defer_lock, linked by spriv.next; n_held peeked.
	 */
	struct te_plugin_slice *held;
	atomic_uint n_held;
	/*
	 * fini left the endpoint open (efa_quiesce): closing it would have met a READ response
	 * half received. Its AV, CQ, domain and buffers stay too: nothing polls them again.
	 */
	bool ep_kept;
};

struct efa_prog {
	struct efa_inst *ei;
	uint32_t index;
	pthread_t thread;
	bool started;
	int kick_fd;
	atomic_int sleeping;
	/* progress 'caller': asleep while the core polls our operations; woken when done */
	atomic_int parked;
	struct efa_nic **nics;
	uint32_t n_nics;
	bool all_fd; /* every CQ of this thread has a wait fd */
	struct pollfd *pfds;
};

struct efa_mem {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	atomic_uint inflight;
	atomic_uint rr;
	uint64_t nic_mask; /* NICs near the region (published in the key) */
	uint32_t n_pref;
	uint8_t pref[EFA_MAX_NICS];
	struct efa_mem *prev, *next;
	struct fid_mr **mr;
	void **desc;
	uint64_t *key;
};

struct efa_hello {
	struct efa_op op;
	struct efa_peer *peer;
	uint32_t nic;
	uint32_t rnic;
};

/* One local NIC towards one peer. */
struct efa_path {
	atomic_uint inflight;
	/* relaxed: when posts started answering -FI_EAGAIN with nothing in flight (0: none) */
	atomic_uint_fast64_t eagain_since;
};

struct efa_peer {
	struct efa_inst *ei;
	char *name;
	uint32_t n_rnics;
	struct efa_path *paths; /* per local NIC */
	atomic_uint refs;	/* the loaded handle, in-flight slices and warm-up messages */
	struct efa_peer *prev, *next;
	/*
	 * [local nic * n_rnics + remote nic]; an entry's fi_addr changes when a fence re-inserts
	 * it, so posts read it there, under the NIC lock.
	 */
	struct efa_av_entry **entries;
	int pid;   /* shm: the peer's process (from its endpoint name), 0 when unknown */
	int pidfd; /* shm: pidfd_open(pid), readable once it exited; -1 without one */
	uint32_t n_hello;
	struct efa_hello *hello;
};

struct efa_rkey {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	bool offset; /* the target addresses by offset from addr */
	uint32_t n_keys;
	uint32_t n_pref;
	uint8_t pref[EFA_MAX_NICS];
	struct efa_rkey *prev, *next;
	uint64_t keys[];
};

enum efa_progress_mode {
	EFA_PROGRESS_ADAPTIVE,
	EFA_PROGRESS_BUSY,
	EFA_PROGRESS_CALLER,
};

struct efa_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;

	/* options */
	char provider[EFA_MAX_PROV + 1];
	char node[INET6_ADDRSTRLEN + 1]; /* "" : the provider chooses */
	char *devices;			 /* comma-separated domain names, or NULL: all */
	uint32_t window_opt;		 /* 0: the provider's tx queue size */
	uint64_t slice_size;
	enum efa_progress_mode progress;
	uint64_t spin_ns;
	uint64_t poll_ns;
	uint32_t n_threads_opt;
	uint64_t write_flags; /* FI_DELIVERY_COMPLETE or 0 */
	bool warmup;
	uint64_t connect_timeout_ms;

	char prov_name[EFA_MAX_PROV + 1]; /* what fi_getinfo reported */
	bool shm;			  /* prov_name is shm: no connection to close */
	/*
	 * libfabric's tcp provider before 1.18 completes a READ twice when the connection that
	 * receives its response closes halfway through it: the second completion has no
	 * context, and rxm dereferences it (SIGSEGV in fi_av_remove or fi_close). Then a
	 * connection is closed only where no READ response can be half received (efa_io.c).
	 */
	bool read_close_unsafe;
	/*
	 * Over TCP (tcp, net), a closed connection's bytes already in the sockets still reach the
	 * peer: the slices that failed on it are reported once the peer has closed its end too
	 * (efa_tcp_orphan), so that none of their bytes lands after their task ended.
	 */
	bool orphan_wait;
	/*
	 * rxm: fi_av_remove closes the address's connection even when rxm holds it closed and idle
	 * (its connect was rejected: the peer still had the old one), and crashes on it; an
	 * operation first makes rxm connect again (efa_av_remove_locked).
	 */
	bool rxm;
	/* GPU kinds the provider moves itself (FI_HMEM with a usable CUDA/ROCr interface) */
	uint32_t gpu_types;
	bool same_host;
	uint64_t max_msg;
	uint32_t api_version;

	struct efa_nic *nics;
	uint32_t n_nics;
	struct efa_prog *progs;
	uint32_t n_progs;

	pthread_mutex_t lock; /* lists below and the AV caches */
	struct efa_mem *mems;
	struct efa_peer *peers;
	struct efa_rkey *rkeys;

	pthread_mutex_t defer_lock;
	struct te_plugin_slice *defer_head, *defer_tail; /* under defer_lock */
	atomic_uint n_defer;				 /* peeked without the lock */

	atomic_bool stopping;
	/* progress 'caller': when the core last called efa_progress or efa_wait (efa_now_ns) */
	_Atomic uint64_t caller_ns;
	/* progress 'caller': an application thread in te_batch_wait polls us (efa_drive) */
	atomic_uint driven;
	bool all_fd; /* every NIC's CQ has a wait fd (efa_wait can sleep) */
};

/* --- small helpers ------------------------------------------------------------------ */

#define efa_log(ei, level, ...) (ei)->host->log((ei)->ctx, (level), __VA_ARGS__)

static inline struct efa_inst *efa_inst_of(struct te_plugin_inst *inst)
{
	return (struct efa_inst *)inst;
}

static inline struct efa_spriv *efa_priv(const struct te_plugin_slice *s)
{
	return (struct efa_spriv *)s->priv;
}

/* Say why an op is failing; the core quotes it to the user. Logged at debug as well. */
void efa_error(struct efa_inst *ei, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);

static inline uint64_t efa_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void efa_nic_lock(struct efa_nic *nic)
{
	pthread_mutex_lock(&nic->lock);
}

static inline void efa_nic_unlock(struct efa_nic *nic)
{
	pthread_mutex_unlock(&nic->lock);
}

/* --- NICs, address vectors and peers (efa_nic.c) -------------------------------------- */

enum te_status efa_nics_open(struct efa_inst *ei);
enum te_status efa_blob(struct efa_inst *ei, uint8_t *blob, size_t *len_out);
int efa_nic_reg(struct efa_nic *nic, void *addr, size_t len, uint64_t access, uint32_t mem_type,
		int32_t dev, struct fid_mr **mr_out, void **desc_out, uint64_t *key_out);
void efa_rx_post(struct efa_nic *nic, struct efa_rxbuf *rx);
/*
 * fi_av_remove of @e from @nic's AV, whose lock the caller holds. rxm (1.17) closes the
 * address's connection there even when it holds it closed and idle (after the peer rejected
 * a connect because it still had the old connection), and crashes on it: an operation to the
 * address first (a warm-up message, fi_inject) makes rxm connect again. 0, or a negative
 * libfabric error (then the address stays in the AV).
 */
int efa_av_remove_locked(struct efa_nic *nic, struct efa_av_entry *e);
/*
 * Whether a TCP socket of this host to @e's address (an IP endpoint name) has its end closed
 * and waits for the peer to close its own (FIN_WAIT1/2, by sock_diag): the peer may still
 * read what it carried. 1, 0, or -1 when that cannot be told.
 */
int efa_tcp_orphan(const struct efa_av_entry *e);
void efa_peer_free_locked(struct efa_inst *ei, struct efa_peer *peer);
enum te_status efa_load_peer(struct te_plugin_inst *inst, const char *peer_name, const void *blob,
			     size_t len, struct te_plugin_peer **peer_out);
void efa_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle);

static inline void efa_peer_unref(struct efa_inst *ei, struct efa_peer *peer)
{
	if (atomic_fetch_sub_explicit(&peer->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_mutex_lock(&ei->lock);
	efa_peer_free_locked(ei, peer);
	pthread_mutex_unlock(&ei->lock);
}

/*
 * Whether @peer's process has exited (shm, its pidfd readable). Its memory can no longer
 * change, and a post to it may never return: a process killed while it held its shm region's
 * lock leaves it held, and every later post to it spins in the provider.
 */
static inline bool efa_peer_dead(const struct efa_peer *peer)
{
	struct pollfd pfd = { .fd = peer->pidfd, .events = POLLIN };

	return peer->pidfd >= 0 && poll(&pfd, 1, 0) > 0;
}

/* --- data path and progress (efa_io.c) ------------------------------------------------ */

void efa_prog_wake(struct efa_prog *p);
void efa_prog_kick(struct efa_prog *p);
enum te_status efa_progs_start(struct efa_inst *ei);
uint32_t efa_quiesce(struct efa_inst *ei);
enum te_status efa_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices, uint32_t n,
			  uint32_t *accepted_out);
enum te_status efa_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s);
enum te_status efa_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s);
uint32_t efa_progress(struct te_plugin_inst *inst, uint32_t budget);
enum te_status efa_wait(struct te_plugin_inst *inst, uint64_t timeout_ns);
void efa_drive(struct te_plugin_inst *inst, uint32_t driving);

#endif /* TE_PLUGINS_EFA_H */
