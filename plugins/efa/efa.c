/* SPDX-License-Identifier: Apache-2.0 */
/* efa.c: the efa transport: one-sided READ/WRITE over libfabric RDM endpoints (EFA and others). */

/*
 * Shape of the plugin (README.md has the options, blob formats and semantics):
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
 * With progress 'caller' (the default on providers over IP) the plugin is manual-progress
 * to the core: the thread waiting in te_batch_wait (else the core's worker) polls the CQs in
 * efa_progress, so a completion reaches its batch with no hand-off between threads, and the
 * progress threads stay away: parked while operations are in flight (the core polls them,
 * efa_prog_park), then for EFA_CALLER_NS after the core's last poll; they still serve the
 * passive side, where the core has nothing in flight and never calls progress.
 *
 * Lifetimes. A slice holds its local region (mem->inflight: dereg_mem answers TE_ERR_BUSY
 * meanwhile) and its peer handle (refcount) until its completion. fini closes the endpoints,
 * which ends every operation, and reports what is left as canceled. host->slice_done is never
 * called with a plugin lock held.
 *
 * Cancel. The core reports a canceled or timed-out slice only once the plugin hands it back, so
 * that a WRITE never lands after its task ended. fi_cancel takes back receives only, never a
 * posted RMA operation; cancel marks the slice and wakes the progress thread, which fences it
 * (efa_nic_fence): over connections (tcp;ofi_rxm, net, efa) it removes the peer's address from
 * the NIC's AV and inserts it again, which (with FI_AV_REMOVE_CLEANUP, set at init) closes the
 * connection and returns every operation queued on it as canceled; on shm a posted operation
 * already ran inside the post call (CMA), or waits for a peer whose process is gone, which the
 * plugin tells by the peer's pidfd. README.md says what may still land and when.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np, ppoll */
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>

#define EFA_NAME "efa"

/* --- limits and formats ------------------------------------------------------------- */

#define EFA_MAX_NICS 64u  /* te's device limit (excluded_devices is a 64-bit mask) */
#define EFA_MAX_ADDR 256u /* longest endpoint address accepted from a peer */
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
#define EFA_FENCE_PEERS 16u		    /* peers one fence round closes connections to */
#define EFA_DETAIL 256u
#define EFA_PRIV_DETAIL 128u

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
	atomic_uint canceled; /* enum efa_cancel_state */
	int32_t status;	      /* deferred failure */
	char detail[EFA_PRIV_DETAIL];
};
_Static_assert(sizeof(struct efa_spriv) <= 256, "slice_priv_size is at most 256 bytes");

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

/* One AV entry shared by every peer handle that names the same address on one NIC. */
struct efa_av_entry {
	fi_addr_t fi_addr;
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
static void efa_error(struct efa_inst *ei, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);
static void efa_error(struct efa_inst *ei, const char *fmt, ...)
{
	char buf[EFA_DETAIL];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (TE_PLUGIN_HAS(ei->host, struct te_plugin_host, set_error) && ei->host->set_error)
		ei->host->set_error(ei->ctx, "%s", buf);
	efa_log(ei, TE_PLUGIN_LOG_DEBUG, "%s", buf);
}

static uint64_t efa_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void efa_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void efa_put_u32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void efa_put_u64(uint8_t *p, uint64_t v)
{
	for (unsigned i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t efa_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t efa_get_u32(const uint8_t *p)
{
	uint32_t v = 0;

	for (unsigned i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t efa_get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* libfabric error values are positive in CQ entries, but some providers store -err. */
static int efa_errnum(int err)
{
	return err < 0 ? -err : err;
}

/* te status of a libfabric error (CQ entry or failed post), by what a retry can change. */
static enum te_status efa_status_of(int err)
{
	switch (efa_errnum(err)) {
	case FI_EAGAIN:
	case FI_ENOMEM:
	case FI_ENOSPC:
		return TE_ERR_AGAIN;
	case FI_ECONNRESET:
	case FI_ECONNABORTED:
	case FI_ENOTCONN:
	case FI_ESHUTDOWN:
	case FI_ECANCELED:
	case EPIPE:
		return TE_ERR_CONN_RESET;
	case FI_ECONNREFUSED:
	case FI_EHOSTUNREACH:
	case FI_ENETUNREACH:
	case FI_EADDRNOTAVAIL:
		return TE_ERR_PEER_UNREACHABLE;
	case FI_ENETDOWN:
		return TE_ERR_LINK_DOWN;
	case FI_ETIMEDOUT:
		return TE_ERR_PATH_TIMEOUT;
	case FI_EACCES:
	case FI_EPERM:
	case FI_EKEYREJECTED:
	case FI_EFAULT:
		return TE_ERR_REMOTE_ACCESS;
	default:
		return TE_ERR_TRANSIENT;
	}
}

static void efa_nic_lock(struct efa_nic *nic)
{
	pthread_mutex_lock(&nic->lock);
}

static void efa_nic_unlock(struct efa_nic *nic)
{
	pthread_mutex_unlock(&nic->lock);
}

/*
 * progress 'caller': whether the core drove efa_progress within EFA_CALLER_NS. Then it keeps
 * doing so while it has slices in flight (te_batch_wait, or its worker), and the progress
 * threads keep away from the CQs. Relaxed: a stale view costs one wake-up or one poll.
 */
static bool efa_caller_driving(struct efa_inst *ei, uint64_t now)
{
	return ei->progress == EFA_PROGRESS_CALLER &&
	       now - atomic_load_explicit(&ei->caller_ns, memory_order_relaxed) < EFA_CALLER_NS;
}

/* End @p's sleep, or its next one. Any thread. */
static void efa_prog_wake(struct efa_prog *p)
{
	uint64_t one = 1;

	if (write(p->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		efa_log(p->ei, TE_PLUGIN_LOG_ERROR, "progress thread %u: cannot wake: %s", p->index,
			strerror(errno));
}

/* Wake @p if it sleeps (or is about to) and the core does not poll for it. Any thread. */
static void efa_prog_kick(struct efa_prog *p)
{
	/* seq_cst: pairs with the thread's store of sleeping before its last CQ check. */
	if (!atomic_load(&p->sleeping))
		return;
	/* Parked: the core polls what was posted (progress 'caller'). */
	if (atomic_load_explicit(&p->parked, memory_order_relaxed) ||
	    efa_caller_driving(p->ei, efa_now_ns()))
		return;
	efa_prog_wake(p);
}

/* --- in-flight window ----------------------------------------------------------------- */

/* Claim a free slot of @nic's window; -1 when the window is full. */
static int64_t efa_slot_claim(struct efa_nic *nic)
{
	/* relaxed: a hint only; the CAS below orders the claim */
	uint32_t start = atomic_load_explicit(&nic->hint, memory_order_relaxed);

	for (uint32_t k = 0; k < nic->n_words; k++) {
		uint32_t w = (start + k) % nic->n_words;
		uint64_t v = atomic_load_explicit(&nic->bits[w], memory_order_relaxed);

		while (~v) {
			uint64_t bit = ~v & (v + 1); /* lowest zero bit */

			if (atomic_compare_exchange_weak_explicit(&nic->bits[w], &v, v | bit,
								  memory_order_acquire,
								  memory_order_relaxed)) {
				if (w != start)
					atomic_store_explicit(&nic->hint, w, memory_order_relaxed);
				return (int64_t)w * 64 + __builtin_ctzll(bit);
			}
		}
	}
	return -1;
}

static void efa_slot_release(struct efa_nic *nic, uint32_t slot)
{
	/* relaxed: only fini reads slots, after joining every thread */
	atomic_store_explicit(&nic->slots[slot], NULL, memory_order_relaxed);
	atomic_fetch_and_explicit(&nic->bits[slot / 64], ~(1ull << (slot % 64)),
				  memory_order_release);
}

/* --- AV cache and peers --------------------------------------------------------------- */

/* fi_addr of @addr on @nic, inserting it on first use. Under ei->lock. */
static enum te_status efa_av_get_locked(struct efa_nic *nic, const uint8_t *addr, size_t len,
					struct efa_av_entry **entry_out)
{
	struct efa_av_entry *e;
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int ret;

	for (uint32_t i = 0; i < nic->n_av; i++) {
		e = nic->av_entries[i];
		if (e->len == len && memcmp(e->addr, addr, len) == 0) {
			e->refs++;
			*entry_out = e;
			return TE_OK;
		}
	}
	if (nic->n_av == nic->cap_av) {
		uint32_t ncap = nic->cap_av ? nic->cap_av * 2 : 16;
		struct efa_av_entry **na = realloc(nic->av_entries, ncap * sizeof(*na));

		if (!na)
			return TE_ERR_NOMEM;
		nic->av_entries = na;
		nic->cap_av = ncap;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return TE_ERR_NOMEM;
	efa_nic_lock(nic);
	ret = fi_av_insert(nic->av, addr, 1, &fa, 0, NULL);
	efa_nic_unlock(nic);
	if (ret != 1 || fa == FI_ADDR_NOTAVAIL) {
		free(e);
		efa_error(nic->ei, EFA_NAME ": fi_av_insert on %s: %s", nic->name,
			  ret < 0 ? fi_strerror(-ret) : "address not inserted");
		return TE_ERR_PEER_UNREACHABLE;
	}
	e->fi_addr = fa;
	e->refs = 1;
	e->len = len;
	memcpy(e->addr, addr, len);
	nic->av_entries[nic->n_av++] = e;
	*entry_out = e;
	return TE_OK;
}

/* Drop one reference; the last one removes the address from the AV. Under ei->lock. */
static void efa_av_put_locked(struct efa_nic *nic, struct efa_av_entry *e)
{
	if (--e->refs)
		return;
	for (uint32_t i = 0; i < nic->n_av; i++) {
		if (nic->av_entries[i] == e) {
			nic->av_entries[i] = nic->av_entries[--nic->n_av];
			break;
		}
	}
	efa_nic_lock(nic);
	(void)fi_av_remove(nic->av, &e->fi_addr, 1, 0);
	efa_nic_unlock(nic);
	free(e);
}

/* Free @peer's AV references and memory. Under ei->lock. */
static void efa_peer_free_locked(struct efa_inst *ei, struct efa_peer *peer)
{
	for (uint32_t i = 0; peer->entries && i < ei->n_nics; i++)
		for (uint32_t j = 0; j < peer->n_rnics; j++)
			if (peer->entries[i * peer->n_rnics + j])
				efa_av_put_locked(&ei->nics[i],
						  peer->entries[i * peer->n_rnics + j]);
	if (peer->prev)
		peer->prev->next = peer->next;
	else if (ei->peers == peer)
		ei->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	if (peer->pidfd >= 0)
		close(peer->pidfd);
	free(peer->entries);
	free(peer->hello);
	free(peer->paths);
	free(peer->name);
	free(peer);
}

static void efa_peer_unref(struct efa_inst *ei, struct efa_peer *peer)
{
	if (atomic_fetch_sub_explicit(&peer->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_mutex_lock(&ei->lock);
	efa_peer_free_locked(ei, peer);
	pthread_mutex_unlock(&ei->lock);
}

/*
 * shm: watch the peer's process through a pidfd. Its endpoint name, chosen by its efa_nic_open,
 * says which process it is (te-efa-<pid>-...). A peer named otherwise is not watched.
 */
static void efa_peer_watch(struct efa_inst *ei, struct efa_peer *peer, const uint8_t *addr,
			   size_t len)
{
	char name[EFA_MAX_ADDR + 1];
	const char *n = name;
	int pid = 0;

	memcpy(name, addr, len);
	name[len] = '\0';
	if (strncmp(n, "fi_shm://", 9) == 0)
		n += 9;
	if (sscanf(n, "te-efa-%d-", &pid) != 1 || pid <= 0)
		return;
	peer->pid = pid;
#ifdef SYS_pidfd_open
	peer->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#endif
	if (peer->pidfd < 0)
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"peer %s (process %d): no pidfd (%s): a post to it after it died may spin "
			"in the provider",
			peer->name, pid, strerror(errno));
}

/*
 * Whether @peer's process has exited (shm, its pidfd readable). Its memory can no longer
 * change, and a post to it may never return: a process killed while it held its shm region's
 * lock leaves it held, and every later post to it spins in the provider.
 */
static bool efa_peer_dead(const struct efa_peer *peer)
{
	struct pollfd pfd = { .fd = peer->pidfd, .events = POLLIN };

	return peer->pidfd >= 0 && poll(&pfd, 1, 0) > 0;
}

/* --- completion ------------------------------------------------------------------------ */

/*
 * End one slice attempt: give back its slot and references, then report. @err is 0 or a
 * libfabric error; @prov is the provider's text for it (may be NULL).
 */
static void efa_slice_finish(struct efa_inst *ei, struct efa_spriv *p, int err, int prov_errno,
			     const char *prov)
{
	struct te_plugin_slice *s = p->slice;
	struct efa_nic *nic = p->nic;
	struct efa_peer *peer = p->peer;
	enum te_status st = TE_OK;
	char detail[EFA_DETAIL];
	uint64_t len = s->length;

	if (err) {
		bool canceled = atomic_load_explicit(&p->canceled, memory_order_relaxed);

		st = efa_status_of(err);
		if (canceled && (st == TE_ERR_CONN_RESET || efa_errnum(err) == FI_ECANCELED))
			st = TE_ERR_CANCELED;
		snprintf(detail, sizeof(detail),
			 EFA_NAME "[%s] %s: %s of %" PRIu64 " bytes %s %s at 0x%" PRIx64
				  " failed: %s (%d)%s%s%s",
			 ei->prov_name, nic->name,
			 s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE", len,
			 s->opcode == TE_PLUGIN_OP_READ ? "from" : "to", peer->name, s->remote,
			 fi_strerror(efa_errnum(err)), efa_errnum(err), prov ? "; provider: " : "",
			 prov ? prov : "", canceled ? " (canceled)" : "");
		if (prov_errno && strlen(detail) + 24 < sizeof(detail))
			snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
				 " [provider errno %d]", prov_errno);
	}
	efa_slot_release(nic, p->slot);
	atomic_fetch_sub_explicit(&nic->inflight, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&peer->paths[nic->index].inflight, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&p->mem->inflight, 1, memory_order_release);
	ei->host->slice_done(ei->ctx, s, st, st == TE_OK ? len : 0, st == TE_OK ? NULL : detail);
	efa_peer_unref(ei, peer);
}

static void efa_rx_post(struct efa_nic *nic, struct efa_rxbuf *rx)
{
	ssize_t ret;

	efa_nic_lock(nic);
	ret = fi_recv(nic->ep, rx->buf, EFA_MSG_LEN, nic->msg_desc, FI_ADDR_UNSPEC, &rx->op.ctx);
	efa_nic_unlock(nic);
	/* A receive not reposted only means fewer buffers for warm-up messages. */
	if (ret)
		efa_log(nic->ei, TE_PLUGIN_LOG_DEBUG, "%s: fi_recv: %s", nic->name,
			fi_strerror((int)-ret));
}

/* One CQ entry (or error entry) of @nic. */
static void efa_complete(struct efa_nic *nic, void *context, int err, int prov_errno,
			 const char *prov)
{
	struct efa_inst *ei = nic->ei;
	struct efa_op *op = context;

	if (!op) {
		/*
		 * An operation's outcome is lost: shm (1.17) reports failed CMA copies without
		 * their context. That slice stays with the plugin until fini; the core ends its
		 * task at the deadline. Said once per NIC, then at debug level.
		 */
		uint32_t lost = atomic_fetch_add_explicit(&nic->lost, 1, memory_order_relaxed);

		efa_log(ei, lost ? TE_PLUGIN_LOG_DEBUG : TE_PLUGIN_LOG_WARN,
			"%s: %s completion without context (%u so far): %s%s%s; its slice "
			"ends when the core gives up on it and its peer's process is gone",
			nic->name, err ? "error" : "a", lost + 1,
			err ? fi_strerror(efa_errnum(err)) : "", prov ? "; provider: " : "",
			prov ? prov : "");
		return;
	}
	switch (op->kind) {
	case EFA_OP_SLICE:
		efa_slice_finish(ei, (struct efa_spriv *)(void *)op, err, prov_errno, prov);
		break;
	case EFA_OP_RECV:
		/* Content does not matter: the message only warmed the path. */
		if (!atomic_load_explicit(&ei->stopping, memory_order_relaxed))
			efa_rx_post(nic, (struct efa_rxbuf *)(void *)op);
		break;
	case EFA_OP_HELLO: {
		struct efa_hello *h = (struct efa_hello *)(void *)op;

		if (err)
			efa_log(ei, TE_PLUGIN_LOG_INFO,
				"%s: warm-up message to %s (remote NIC %u) failed: %s%s%s",
				nic->name, h->peer->name, h->rnic, fi_strerror(efa_errnum(err)),
				prov ? "; provider: " : "", prov ? prov : "");
		efa_peer_unref(ei, h->peer);
		break;
	}
	default:
		efa_log(ei, TE_PLUGIN_LOG_ERROR, "%s: completion of unknown kind %u", nic->name,
			op->kind);
		break;
	}
}

/*
 * One read of up to @max entries of @nic's CQ, whose lock the caller holds, handed to
 * efa_complete. Returns how many. The lock is released, except when the CQ was empty
 * (*empty_out): the caller then still holds it. *more_out: the CQ may hold more. Entries read
 * and not yet delivered count in nic->reaping, so that a fence under the lock knows when no
 * outcome is on its way.
 */
static uint32_t efa_nic_reap_locked(struct efa_nic *nic, uint32_t max, bool *empty_out,
				    bool *more_out)
{
	struct fi_cq_entry ent[EFA_CQ_BATCH];
	struct fi_cq_err_entry e;
	const char *prov = NULL;
	char text[128];
	ssize_t n;

	*empty_out = *more_out = false;
	n = fi_cq_read(nic->cq, ent, EFA_MIN(EFA_CQ_BATCH, max));
	if (n > 0) {
		/* relaxed: the NIC lock orders it before the fence's read */
		atomic_fetch_add_explicit(&nic->reaping, 1, memory_order_relaxed);
		efa_nic_unlock(nic);
		for (ssize_t i = 0; i < n; i++)
			efa_complete(nic, ent[i].op_context, 0, 0, NULL);
		atomic_fetch_sub_explicit(&nic->reaping, 1, memory_order_release);
		*more_out = (size_t)n == EFA_CQ_BATCH;
		return (uint32_t)n;
	}
	if (n != -FI_EAVAIL) {
		if (n == -FI_EAGAIN) {
			*empty_out = true;
			return 0;
		}
		efa_nic_unlock(nic);
		efa_log(nic->ei, TE_PLUGIN_LOG_ERROR, "%s: fi_cq_read: %s", nic->name,
			fi_strerror((int)-n));
		return 0;
	}
	memset(&e, 0, sizeof(e));
	n = fi_cq_readerr(nic->cq, &e, 0);
	if (n != 1) {
		efa_nic_unlock(nic);
		return 0;
	}
	/* Without a provider errno its text says "Success": nothing to add. */
	if (!nic->closed && e.prov_errno)
		prov = fi_cq_strerror(nic->cq, e.prov_errno, e.err_data, text, sizeof(text));
	atomic_fetch_add_explicit(&nic->reaping, 1, memory_order_relaxed);
	efa_nic_unlock(nic);
	if (prov && !*prov)
		prov = NULL;
	efa_complete(nic, e.op_context, e.err ? e.err : FI_EOTHER, e.prov_errno, prov);
	atomic_fetch_sub_explicit(&nic->reaping, 1, memory_order_release);
	*more_out = true;
	return 1;
}

/*
 * Read @nic's CQ: up to @budget completions; returns how many were handled. With @busy_out
 * the CQ is only read if the NIC's lock is free (*busy_out says it was not): a submit posting
 * there kicks the progress thread afterwards.
 */
static uint32_t efa_nic_poll(struct efa_nic *nic, uint32_t budget, bool *busy_out)
{
	uint32_t done = 0;

	while (done < budget) {
		bool empty, more;

		if (busy_out) {
			if (pthread_mutex_trylock(&nic->lock) != 0) {
				*busy_out = true;
				break;
			}
		} else {
			efa_nic_lock(nic);
		}
		done += efa_nic_reap_locked(nic, budget - done, &empty, &more);
		if (empty)
			efa_nic_unlock(nic);
		if (!more)
			break;
	}
	return done;
}

/* Report the slices submit could not post (never from inside submit). */
static uint32_t efa_flush_deferred(struct efa_inst *ei)
{
	struct te_plugin_slice *s;
	uint32_t n = 0;

	/* relaxed peek: a miss is caught on the next round (submit kicks after deferring) */
	if (!atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&ei->defer_lock);
	s = ei->defer_head;
	ei->defer_head = ei->defer_tail = NULL;
	atomic_store_explicit(&ei->n_defer, 0, memory_order_relaxed);
	pthread_mutex_unlock(&ei->defer_lock);
	while (s) {
		struct efa_spriv *p = efa_priv(s);
		struct te_plugin_slice *next = p->next;

		ei->host->slice_done(ei->ctx, s, (enum te_status)p->status, 0, p->detail);
		s = next;
		n++;
	}
	return n;
}

static void efa_defer_fail(struct efa_inst *ei, struct te_plugin_slice *s, enum te_status st,
			   const char *fmt, ...) TE_PLUGIN_PRINTF(4, 5);
static void efa_defer_fail(struct efa_inst *ei, struct te_plugin_slice *s, enum te_status st,
			   const char *fmt, ...)
{
	struct efa_spriv *p = efa_priv(s);
	va_list ap;

	p->status = st;
	va_start(ap, fmt);
	vsnprintf(p->detail, sizeof(p->detail), fmt, ap);
	va_end(ap);
	p->next = NULL;
	p->nic = NULL;
	pthread_mutex_lock(&ei->defer_lock);
	if (ei->defer_tail)
		efa_priv(ei->defer_tail)->next = s;
	else
		ei->defer_head = s;
	ei->defer_tail = s;
	atomic_fetch_add_explicit(&ei->n_defer, 1, memory_order_relaxed);
	pthread_mutex_unlock(&ei->defer_lock);
}

/* --- fence: what cancel asks for ---------------------------------------------------------- */

enum efa_fence {
	EFA_FENCE_IDLE, /* nothing to do */
	EFA_FENCE_DONE, /* closed connections or reported slices: outcomes may be on their way */
	EFA_FENCE_BUSY, /* the NIC was busy, or outcomes were on their way: look again */
};

/*
 * Remove @e from @nic's AV and insert it again (the NIC lock held: posts read e->fi_addr under
 * it). With FI_AV_REMOVE_CLEANUP, rxm closes its connection to the address on removal and
 * returns every operation queued on it as canceled; the next post connects again.
 */
static void efa_av_refresh_locked(struct efa_nic *nic, struct efa_av_entry *e,
				  const struct efa_peer *peer)
{
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int rc = fi_av_remove(nic->av, &e->fi_addr, 1, 0);

	if (rc) {
		efa_log(nic->ei, TE_PLUGIN_LOG_WARN,
			"%s: fi_av_remove of %s: %s; its canceled operations end when the provider "
			"completes them",
			nic->name, peer->name, fi_strerror(-rc));
		return;
	}
	rc = fi_av_insert(nic->av, e->addr, 1, &fa, 0, NULL);
	if (rc != 1 || fa == FI_ADDR_NOTAVAIL) {
		efa_log(nic->ei, TE_PLUGIN_LOG_ERROR,
			"%s: fi_av_insert of %s after a cancel: %s; transfers to it fail",
			nic->name, peer->name, rc < 0 ? fi_strerror(-rc) : "address not inserted");
		fa = FI_ADDR_NOTAVAIL;
	}
	e->fi_addr = fa;
}

/*
 * Take back the canceled slices of @nic, from the progress thread (it may wait for the NIC
 * lock, cancel may not). Over connections: close each one that carries a canceled slice
 * (efa_av_refresh_locked); what was queued on it comes back canceled through the CQ, and what
 * else ran on it is retried by the core. shm: a posted operation ran inside its post call
 * (CMA), so a canceled slice still held either waits for its peer (delivery completion, or no
 * CMA: nothing fences that) or was lost by the provider, which reports failed copies without
 * their context; it ends here once the peer's process is gone, whose memory cannot change.
 */
static enum efa_fence efa_nic_fence(struct efa_nic *nic)
{
	struct efa_inst *ei = nic->ei;
	struct efa_spriv *gone[EFA_CQ_BATCH];
	struct efa_peer *peers[EFA_FENCE_PEERS];
	uint32_t n_gone = 0, n_peers = 0;
	uint_fast64_t again = atomic_load_explicit(&nic->fence_again_ns, memory_order_relaxed);
	bool empty, more, waiting = false;

	if (!atomic_load(&nic->fence_req) && (!again || efa_now_ns() < again))
		return EFA_FENCE_IDLE;
	if (pthread_mutex_trylock(&nic->lock) != 0)
		return EFA_FENCE_BUSY;
	/*
	 * Only with no entry read and undelivered, and none left in the CQ, is a slice still in
	 * its slot one whose outcome is not on its way: peers and AV entries of the slices in
	 * the window stay alive while this thread holds the lock.
	 */
	if (atomic_load_explicit(&nic->reaping, memory_order_acquire)) {
		efa_nic_unlock(nic);
		return EFA_FENCE_BUSY;
	}
	if (efa_nic_reap_locked(nic, EFA_CQ_BATCH, &empty, &more) || !empty)
		return EFA_FENCE_BUSY; /* delivered what it read (and let go of the lock) */
	/* A cancel after this store asks again: its mark is set before its request. */
	atomic_store(&nic->fence_req, 0);
	atomic_store_explicit(&nic->fence_again_ns, 0, memory_order_relaxed);
	for (uint32_t k = 0; k < nic->window; k++) {
		struct te_plugin_slice *s =
			atomic_load_explicit(&nic->slots[k], memory_order_relaxed);
		struct efa_spriv *p;
		uint32_t i;

		if (!s)
			continue;
		p = efa_priv(s);
		if (atomic_load(&p->canceled) != EFA_CANCEL_ASKED)
			continue;
		/* Receives only, on these providers; costs nothing to ask. */
		(void)fi_cancel(&nic->ep->fid, &p->op.ctx);
		if (ei->shm) {
			if (!efa_peer_dead(p->peer) || n_gone == EFA_CQ_BATCH) {
				waiting = true;
				continue;
			}
			atomic_store(&p->canceled, EFA_CANCEL_FENCED);
			gone[n_gone++] = p;
			continue;
		}
		for (i = 0; i < n_peers && peers[i] != p->peer; i++)
			;
		if (i == n_peers) {
			if (n_peers == EFA_FENCE_PEERS) {
				waiting = true;
				continue;
			}
			peers[n_peers++] = p->peer;
		}
		atomic_store(&p->canceled, EFA_CANCEL_FENCED);
	}
	for (uint32_t i = 0; i < n_peers; i++)
		for (uint32_t j = 0; j < peers[i]->n_rnics; j++)
			efa_av_refresh_locked(nic,
					      peers[i]->entries[nic->index * peers[i]->n_rnics + j],
					      peers[i]);
	efa_nic_unlock(nic);
	for (uint32_t i = 0; i < n_gone; i++) {
		char why[96];

		snprintf(why, sizeof(why), "peer process %d exited", gone[i]->peer->pid);
		efa_slice_finish(ei, gone[i], FI_ECANCELED, 0, why);
	}
	if (waiting)
		atomic_store_explicit(&nic->fence_again_ns, efa_now_ns() + EFA_SAFETY_NS,
				      memory_order_relaxed);
	if (n_peers)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG,
			"%s: closed the connections to %u peer(s) to take back canceled operations",
			nic->name, n_peers);
	return n_gone || n_peers ? EFA_FENCE_DONE : waiting ? EFA_FENCE_BUSY : EFA_FENCE_IDLE;
}

/* --- progress threads ------------------------------------------------------------------ */

static bool efa_prog_busy_nics(const struct efa_prog *p)
{
	for (uint32_t i = 0; i < p->n_nics; i++)
		if (atomic_load_explicit(&p->nics[i]->inflight, memory_order_relaxed))
			return true;
	return false;
}

/*
 * Sleep until a CQ wait fd fires, a kick comes or the timeout passes. @yielded: a submit was
 * posting on one of our NICs (we left its CQ alone): wait for its kick only, briefly.
 */
static struct timespec efa_timespec(uint64_t ns)
{
	return (struct timespec){ .tv_sec = (time_t)(ns / 1000000000ull),
				  .tv_nsec = (long)(ns % 1000000000ull) };
}

/* ppoll the first @n of @p's fds (the kick fd, then CQ wait fds) for @ns; take a kick. */
static void efa_prog_ppoll(struct efa_prog *p, nfds_t n, uint64_t ns)
{
	struct timespec ts = efa_timespec(ns);

	if (ppoll(p->pfds, n, &ts, NULL) > 0 && (p->pfds[0].revents & POLLIN)) {
		uint64_t v;

		if (read(p->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			efa_log(p->ei, TE_PLUGIN_LOG_ERROR, "progress thread %u: kick read: %s",
				p->index, strerror(errno));
	}
}

static void efa_prog_sleep(struct efa_prog *p, bool yielded)
{
	struct efa_inst *ei = p->ei;
	uint64_t timeout_ns;
	nfds_t n = 1;

	/* seq_cst: pairs with efa_prog_kick's load after posting. */
	atomic_store(&p->sleeping, 1);
	if (p->index == 0 && atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		goto out_awake;
	if (yielded) {
		timeout_ns = ei->poll_ns;
	} else if (p->all_fd) {
		for (uint32_t i = 0; i < p->n_nics; i++) {
			struct efa_nic *nic = p->nics[i];
			int rc;

			efa_nic_lock(nic);
			rc = fi_trywait(nic->fabric, &nic->cq_fid, 1);
			efa_nic_unlock(nic);
			if (rc != FI_SUCCESS)
				goto out_awake;
		}
		n = 1 + p->n_nics;
		timeout_ns = efa_prog_busy_nics(p) ? EFA_SAFETY_NS : EFA_TICK_NS;
	} else {
		/*
		 * An operation of ours posted before sleeping was published may have completed
		 * unseen: poll once more. Only with operations in flight: on the passive side a
		 * second fi_cq_read per round only spins on the provider's lock while a peer
		 * copies (shm holds it for a whole CMA copy), taking a core from that peer.
		 * The fence pairs with the full barrier of submit's inflight increment.
		 */
		atomic_thread_fence(memory_order_seq_cst);
		if (efa_prog_busy_nics(p))
			for (uint32_t i = 0; i < p->n_nics; i++)
				if (efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, NULL))
					goto out_awake;
		/*
		 * Without a wait object the passive side must still poll now and then (the
		 * provider moves peers' data only inside fi_cq_read); with operations of ours
		 * in flight, poll_us bounds their completion latency.
		 */
		timeout_ns = ei->poll_ns;
	}
	efa_prog_ppoll(p, n, timeout_ns);
out_awake:
	atomic_store_explicit(&p->sleeping, 0, memory_order_relaxed);
}

/* Sleep on the kick fd alone, at most @ns. */
static void efa_prog_nap(struct efa_prog *p, uint64_t ns)
{
	atomic_store(&p->sleeping, 1);
	efa_prog_ppoll(p, 1, ns);
	atomic_store_explicit(&p->sleeping, 0, memory_order_relaxed);
}

/*
 * progress 'caller': while operations of ours are in flight the core polls them (the thread
 * in te_batch_wait, else its worker, at most ENGINE_DRIVE_NS after the waiter left), and
 * its polls serve the passive side too: sleep until efa_progress has reaped the last of
 * them (efa_progs_unpark) rather than wake up to check. Whether parked.
 */
static bool efa_prog_park(struct efa_prog *p)
{
	bool park;

	atomic_store_explicit(&p->parked, 1, memory_order_relaxed);
	/* Pairs with the fence in efa_progs_unpark: one of the two sees the other. */
	atomic_thread_fence(memory_order_seq_cst);
	park = efa_prog_busy_nics(p);
	if (park)
		efa_prog_nap(p, EFA_SAFETY_NS);
	atomic_store_explicit(&p->parked, 0, memory_order_relaxed);
	return park;
}

/*
 * After completions from the core's poll: wake parked threads with nothing left in flight.
 * The fence only where a thread's NICs drained: the poll that drained them saw its own
 * decrement, and a later one sees every earlier one.
 */
static void efa_progs_unpark(struct efa_inst *ei)
{
	for (uint32_t t = 0; t < ei->n_progs; t++) {
		struct efa_prog *p = &ei->progs[t];

		if (efa_prog_busy_nics(p))
			continue;
		atomic_thread_fence(memory_order_seq_cst);
		if (atomic_exchange_explicit(&p->parked, 0, memory_order_relaxed))
			efa_prog_wake(p);
	}
}

/* The fences cancel asked for on @p's NICs, and the outcomes they returned. Whether any acted. */
static bool efa_prog_fence(struct efa_prog *p)
{
	bool acted = false;

	for (uint32_t i = 0; i < p->n_nics; i++) {
		if (efa_nic_fence(p->nics[i]) == EFA_FENCE_DONE) {
			bool busy = false;

			/* Report what the closed connections returned now, in every mode. */
			(void)efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, &busy);
			acted = true;
		}
	}
	return acted;
}

static void *efa_prog_main(void *arg)
{
	struct efa_prog *p = arg;
	struct efa_inst *ei = p->ei;
	uint64_t last_work = efa_now_ns();

	while (!atomic_load_explicit(&ei->stopping, memory_order_acquire)) {
		bool yielded = false;
		uint32_t work = 0;
		uint64_t now = efa_now_ns();

		/* Before parking: the core waits on the slices cancel gave this thread. */
		if (efa_prog_fence(p)) {
			last_work = efa_now_ns();
			continue;
		}
		if (ei->progress == EFA_PROGRESS_CALLER && efa_prog_park(p)) {
			last_work = efa_now_ns();
			continue;
		}
		if (efa_caller_driving(ei, now)) {
			/* Nothing of ours in flight: check back when the core may have stopped. */
			efa_prog_nap(p, EFA_CALLER_NS -
						(now - atomic_load_explicit(&ei->caller_ns,
									    memory_order_relaxed)));
			last_work = efa_now_ns();
			continue;
		}
		/*
		 * A NIC whose lock a submit holds is skipped, not waited for (shm copies inside
		 * the post call): the submit kicks this thread when it is done.
		 */
		for (uint32_t i = 0; i < p->n_nics; i++)
			work += efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, &yielded);
		if (p->index == 0)
			work += efa_flush_deferred(ei);
		if (work) {
			last_work = efa_now_ns();
			continue;
		}
		if (ei->progress == EFA_PROGRESS_BUSY)
			continue;
		if (yielded) {
			efa_prog_sleep(p, true);
			continue;
		}
		/*
		 * Keep polling for spin_us after the last completion (a burst usually has more),
		 * yielding the core, then sleep: on the wait fd, or for poll_us without one.
		 * Providers without a wait fd that complete asynchronously want 'busy' (the
		 * default for efa); shm completes inside the post call, and submit kicks.
		 */
		if (efa_now_ns() - last_work < ei->spin_ns) {
			sched_yield();
			continue;
		}
		efa_prog_sleep(p, false);
	}
	return NULL;
}

static enum te_status efa_progs_start(struct efa_inst *ei)
{
	uint32_t n = ei->n_threads_opt ? EFA_MIN(ei->n_threads_opt, ei->n_nics) : 1;

	ei->progs = calloc(n, sizeof(*ei->progs));
	if (!ei->progs)
		return TE_ERR_NOMEM;
	ei->n_progs = n;
	for (uint32_t t = 0; t < n; t++) {
		struct efa_prog *p = &ei->progs[t];

		p->ei = ei;
		p->index = t;
		p->kick_fd = -1;
		p->all_fd = true;
		p->nics = calloc(ei->n_nics, sizeof(*p->nics));
		p->pfds = calloc(ei->n_nics + 1, sizeof(*p->pfds));
		if (!p->nics || !p->pfds)
			return TE_ERR_NOMEM;
		p->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (p->kick_fd < 0) {
			efa_error(ei, EFA_NAME ": eventfd: %s", strerror(errno));
			return TE_ERR_SYSTEM;
		}
		p->pfds[0] = (struct pollfd){ .fd = p->kick_fd, .events = POLLIN };
	}
	ei->all_fd = ei->n_nics > 0;
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_prog *p = &ei->progs[i % n];
		struct efa_nic *nic = &ei->nics[i];

		nic->prog = p;
		p->nics[p->n_nics] = nic;
		p->pfds[1 + p->n_nics] = (struct pollfd){ .fd = nic->wait_fd, .events = POLLIN };
		if (nic->wait_fd < 0) {
			p->all_fd = false;
			ei->all_fd = false;
		}
		p->n_nics++;
	}
	for (uint32_t t = 0; t < n; t++) {
		struct efa_prog *p = &ei->progs[t];
		sigset_t all, old;
		char name[16];
		int rc;

		/* Progress threads take no signals: the application's handlers run elsewhere. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = pthread_create(&p->thread, NULL, efa_prog_main, p);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (rc != 0) {
			efa_error(ei, EFA_NAME ": cannot start progress thread %u: %s", t,
				  strerror(rc));
			return TE_ERR_SYSTEM;
		}
		p->started = true;
		snprintf(name, sizeof(name), "te-efa-%u", t);
		pthread_setname_np(p->thread, name);
	}
	return TE_OK;
}

/* --- options ---------------------------------------------------------------------------- */

static const char *const efa_option_names[] = {
	"provider",
	"devices",
	"node",
	"iface",
	"window",
	"slice_size",
	"progress",
	"spin_us",
	"poll_us",
	"progress_threads",
	"write_completion",
	"warmup",
	"connect_timeout_ms",
};

static enum te_status efa_opt_u64(struct efa_inst *ei, const char *key, uint64_t def, uint64_t min,
				  uint64_t max, bool size_suffix, uint64_t *out)
{
	const char *s = ei->host->config_get(ei->ctx, key);

	if (!s || !*s) {
		*out = def;
		return TE_OK;
	}
	if (te_plugin_parse_u64(s, size_suffix, min, max, out))
		return TE_OK;
	efa_error(ei,
		  EFA_NAME ": option '%s': expected an integer%s in [%" PRIu64 ", %" PRIu64
			   "], got '%s'",
		  key, size_suffix ? " (optional " TE_PLUGIN_SIZE_SUFFIXES " suffix)" : "", min,
		  max, s);
	return TE_ERR_CONFIG;
}

/* One of @choices (NULL-terminated) for @key; index into *out, @def when absent. */
static enum te_status efa_opt_enum(struct efa_inst *ei, const char *key, const char *const *choices,
				   unsigned def, unsigned *out)
{
	const char *s = ei->host->config_get(ei->ctx, key);
	char list[128];
	size_t n = 0;
	int i;

	if (!s || !*s) {
		*out = def;
		return TE_OK;
	}
	i = te_plugin_parse_enum(s, choices);
	if (i >= 0) {
		*out = (unsigned)i;
		return TE_OK;
	}
	while (choices[n])
		n++;
	efa_error(ei, EFA_NAME ": option '%s': '%s' is not one of %s", key, s,
		  te_plugin_join(choices, n, list, sizeof(list)));
	return TE_ERR_CONFIG;
}

/* Provider names whose endpoints are addressed by IP (a node address applies). */
static bool efa_prov_is_ip(const char *prov)
{
	static const char *const ip[] = { "tcp", "net", "sockets", "udp", "verbs", NULL };
	size_t len = strcspn(prov, ";");

	for (unsigned i = 0; ip[i]; i++)
		if (strlen(ip[i]) == len && strncmp(prov, ip[i], len) == 0)
			return true;
	return false;
}

/* First IPv4 (else IPv6) address of interface @name, as text. */
static enum te_status efa_iface_addr(struct efa_inst *ei, const char *name, char *buf, size_t cap)
{
	struct ifaddrs *ifa = NULL, *best = NULL;

	if (getifaddrs(&ifa) != 0) {
		efa_error(ei, EFA_NAME ": option 'iface': getifaddrs: %s", strerror(errno));
		return TE_ERR_CONFIG;
	}
	for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
		if (!i->ifa_addr || strcmp(i->ifa_name, name) != 0)
			continue;
		if (i->ifa_addr->sa_family == AF_INET) {
			best = i;
			break;
		}
		if (i->ifa_addr->sa_family == AF_INET6 && !best)
			best = i;
	}
	if (!best) {
		freeifaddrs(ifa);
		efa_error(ei, EFA_NAME ": option 'iface': no interface '%s' with an IP address",
			  name);
		return TE_ERR_CONFIG;
	}
	if (best->ifa_addr->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)best->ifa_addr)->sin_addr, buf,
			  (socklen_t)cap);
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)best->ifa_addr)->sin6_addr,
			  buf, (socklen_t)cap);
	freeifaddrs(ifa);
	return TE_OK;
}

/*
 * Whether processes of this user may copy each other's memory with CMA: the syscalls are
 * not filtered (a copy from ourselves works), Yama allows it between unrelated processes and
 * the shm provider was not told to avoid it.
 */
static bool efa_cma_usable(void)
{
	const char *env = getenv("FI_SHM_DISABLE_CMA");
	char src = 1, dst = 0;
	struct iovec l = { .iov_base = &dst, .iov_len = 1 }, r = { .iov_base = &src, .iov_len = 1 };
	int scope = 0;
	FILE *f;

	if (env && *env && strcmp(env, "0") != 0 && strcasecmp(env, "no") != 0 &&
	    strcasecmp(env, "false") != 0)
		return false;
	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1 || dst != 1)
		return false;
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = 1;
		fclose(f);
	}
	return scope == 0;
}

static enum te_status efa_options(struct efa_inst *ei)
{
	static const char *const progress[] = { "auto", "adaptive", "busy", "caller", NULL };
	static const char *const completion[] = { "auto", "delivery", "transmit", NULL };
	char bad[64], known[256];
	const char *s, *iface, *node;
	unsigned prog, comp;
	enum te_status st;
	uint64_t v;

	if (te_plugin_unknown_option(ei->host, ei->ctx, efa_option_names,
				     TE_PLUGIN_ARRAY_LEN(efa_option_names), bad, sizeof(bad))) {
		efa_error(ei, EFA_NAME ": unknown option '%s' (known: %s)", bad,
			  te_plugin_join(efa_option_names, TE_PLUGIN_ARRAY_LEN(efa_option_names),
					 known, sizeof(known)));
		return TE_ERR_CONFIG;
	}
	s = ei->host->config_get(ei->ctx, "provider");
	if (!s || !*s)
		s = "efa";
	if (strlen(s) > EFA_MAX_PROV) {
		efa_error(ei, EFA_NAME ": option 'provider': longer than %u characters",
			  EFA_MAX_PROV);
		return TE_ERR_CONFIG;
	}
	snprintf(ei->provider, sizeof(ei->provider), "%s", s);
	s = ei->host->config_get(ei->ctx, "devices");
	if (s && *s) {
		ei->devices = strdup(s);
		if (!ei->devices)
			return TE_ERR_NOMEM;
	}

	iface = ei->host->config_get(ei->ctx, "iface");
	node = ei->host->config_get(ei->ctx, "node");
	if (iface && *iface && node && *node) {
		efa_error(ei, EFA_NAME ": options 'iface' and 'node' are mutually exclusive");
		return TE_ERR_CONFIG;
	}
	if (iface && *iface) {
		st = efa_iface_addr(ei, iface, ei->node, sizeof(ei->node));
		if (st != TE_OK)
			return st;
	} else if (node) {
		/* An explicit empty value leaves the choice to the provider. */
		if (strlen(node) >= sizeof(ei->node)) {
			efa_error(ei, EFA_NAME ": option 'node': '%s' is not an address", node);
			return TE_ERR_CONFIG;
		}
		snprintf(ei->node, sizeof(ei->node), "%s", node);
	} else if (efa_prov_is_ip(ei->provider)) {
		/* Loopback unless told otherwise: no traffic leaves the host by accident. */
		snprintf(ei->node, sizeof(ei->node), "127.0.0.1");
	}

	if ((st = efa_opt_u64(ei, "window", 0, 0, EFA_MAX_WINDOW, false, &v)) != TE_OK)
		return st;
	ei->window_opt = (uint32_t)v;
	if ((st = efa_opt_u64(ei, "slice_size", EFA_DEF_SLICE, 4096, EFA_MAX_SLICE, true,
			      &ei->slice_size)) != TE_OK)
		return st;
	if ((st = efa_opt_enum(ei, "progress", progress, 0, &prog)) != TE_OK)
		return st;
	/*
	 * auto: a real EFA device wants a dedicated polling core. Providers over IP move data
	 * in software only while polled: the waiting application thread polls best (no
	 * hand-off per completion). shm completes in the post call (CMA), so polling only
	 * reaps, and with several submitting threads a poller takes a CPU from a copier.
	 */
	if (prog == 2 || (prog == 0 && strcmp(ei->provider, "efa") == 0))
		ei->progress = EFA_PROGRESS_BUSY;
	else if (prog == 3 || (prog == 0 && efa_prov_is_ip(ei->provider)))
		ei->progress = EFA_PROGRESS_CALLER;
	else
		ei->progress = EFA_PROGRESS_ADAPTIVE;
	if ((st = efa_opt_u64(ei, "spin_us", 20, 0, 1000000, false, &v)) != TE_OK)
		return st;
	ei->spin_ns = v * 1000;
	if ((st = efa_opt_u64(ei, "poll_us", 50, 1, 1000000, false, &v)) != TE_OK)
		return st;
	ei->poll_ns = v * 1000;
	if ((st = efa_opt_u64(ei, "progress_threads", 1, 1, EFA_MAX_THREADS, false, &v)) != TE_OK)
		return st;
	ei->n_threads_opt = (uint32_t)v;
	if ((st = efa_opt_enum(ei, "write_completion", completion, 0, &comp)) != TE_OK)
		return st;
	/*
	 * auto: delivery, except on shm with CMA, where the initiator itself copies with
	 * process_vm_writev, so a WRITE that completes is already in the target's memory, while
	 * asking for delivery completion would make every WRITE wait for the target to poll
	 * (and hang on a dead target: shm never fails them).
	 */
	if (comp == 0)
		comp = strcmp(ei->provider, "shm") == 0 && efa_cma_usable() ? 2 : 1;
	ei->write_flags = comp == 1 ? FI_DELIVERY_COMPLETE : 0;
	s = ei->host->config_get(ei->ctx, "warmup");
	if (!s || !*s) {
		ei->warmup = true;
	} else if (!te_plugin_parse_bool(s, &ei->warmup)) {
		efa_error(ei, EFA_NAME ": option 'warmup': expected true or false, got '%s'", s);
		return TE_ERR_CONFIG;
	}
	if ((st = efa_opt_u64(ei, "connect_timeout_ms", 3000, 1, 600000, false,
			      &ei->connect_timeout_ms)) != TE_OK)
		return st;
	return TE_OK;
}

/* --- NICs ------------------------------------------------------------------------------- */

/* Whether domain @name is selected by the 'devices' option ("rdmap16s27" names the RDM one). */
static bool efa_device_wanted(const struct efa_inst *ei, const char *name)
{
	const char *p = ei->devices;

	if (!p)
		return true;
	while (*p) {
		size_t len = strcspn(p, ",");
		size_t nlen = strlen(name);

		while (len && (*p == ' ')) {
			p++;
			len--;
		}
		if (len && ((nlen == len && strncmp(name, p, len) == 0) ||
			    (nlen == len + 4 && strncmp(name, p, len) == 0 &&
			     strcmp(name + len, "-rdm") == 0)))
			return true;
		p += len;
		if (*p == ',')
			p++;
	}
	return false;
}

static int32_t efa_pci_numa(const struct fi_info *info, char *pci, size_t cap)
{
	const struct fi_pci_attr *a;
	char path[128];
	FILE *f;
	int numa = -1;

	pci[0] = '\0';
	if (!info->nic || !info->nic->bus_attr || info->nic->bus_attr->bus_type != FI_BUS_PCI)
		return -1;
	a = &info->nic->bus_attr->attr.pci;
	snprintf(pci, cap, "%04x:%02x:%02x.%x", a->domain_id, a->bus_id, a->device_id,
		 a->function_id);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", pci);
	f = fopen(path, "re");
	if (f) {
		if (fscanf(f, "%d", &numa) != 1)
			numa = -1;
		fclose(f);
	}
	return numa;
}

/* Open fabric, domain, CQ, AV and endpoint of @nic from its fi_info. */
static enum te_status efa_nic_open(struct efa_inst *ei, struct efa_nic *nic)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_info *info = nic->info;
	const char *step;
	uint32_t window;
	int ret;

	nic->wait_fd = -1;
	nic->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	pthread_mutex_init(&nic->lock, NULL);
	atomic_init(&nic->next_key, 1);
	snprintf(nic->name, sizeof(nic->name), "%s", info->domain_attr->name);
	nic->numa = efa_pci_numa(info, nic->pci, sizeof(nic->pci));
	if (info->nic && info->nic->link_attr)
		nic->speed_mbps = (uint64_t)info->nic->link_attr->speed / 1000000u;

	window = ei->window_opt ? ei->window_opt : (uint32_t)EFA_MIN(info->tx_attr->size, 1024u);
	if (!window)
		window = 256;
	nic->window = window;
	nic->n_words = (window + 63) / 64;
	nic->bits = calloc(nic->n_words, sizeof(*nic->bits));
	nic->slots = calloc(window, sizeof(*nic->slots));
	if (!nic->bits || !nic->slots)
		return TE_ERR_NOMEM;
	/* Bits past the window stay set: never claimed. */
	if (window % 64)
		atomic_store(&nic->bits[nic->n_words - 1], ~0ull << (window % 64));

	step = "fi_fabric";
	ret = fi_fabric(info->fabric_attr, &nic->fabric, NULL);
	if (ret)
		goto err_fi;
	step = "fi_domain";
	ret = fi_domain(nic->fabric, info, &nic->domain, NULL);
	if (ret)
		goto err_fi;
	cq_attr.size = window + EFA_RX_BUFS + EFA_HELLO_PAIRS * 4u;
	ret = -FI_ENOSYS;
	if (ei->progress != EFA_PROGRESS_BUSY) {
		cq_attr.wait_obj = FI_WAIT_FD;
		ret = fi_cq_open(nic->domain, &cq_attr, &nic->cq, NULL);
		if (ret == 0 && fi_control(&nic->cq->fid, FI_GETWAIT, &nic->wait_fd) != 0) {
			fi_close(&nic->cq->fid);
			nic->cq = NULL;
			nic->wait_fd = -1;
			ret = -FI_ENOSYS;
		}
	}
	if (ret) {
		cq_attr.wait_obj = FI_WAIT_NONE;
		step = "fi_cq_open";
		ret = fi_cq_open(nic->domain, &cq_attr, &nic->cq, NULL);
		if (ret)
			goto err_fi;
	}
	nic->cq_fid = &nic->cq->fid;
	step = "fi_av_open";
	ret = fi_av_open(nic->domain, &av_attr, &nic->av, NULL);
	if (ret)
		goto err_fi;
	if (strcmp(ei->prov_name, "shm") == 0) {
		/*
		 * shm names its region after the pid unless told otherwise: a process killed
		 * without closing it leaves the name behind in /dev/shm, and a later process
		 * with the same pid fails fi_enable with EBUSY. A name of our own avoids that
		 * (and says whose region it is: te-efa-<pid>-...).
		 */
		char name[64];

		snprintf(name, sizeof(name), "te-efa-%d-%" PRIx64 "-%u", (int)getpid(),
			 efa_now_ns() ^ (uint64_t)(uintptr_t)nic, nic->index);
		free(info->src_addr);
		info->src_addr = strdup(name);
		if (!info->src_addr)
			return TE_ERR_NOMEM;
		info->src_addrlen = strlen(name) + 1;
	}
	step = "fi_endpoint";
	ret = fi_endpoint(nic->domain, info, &nic->ep, NULL);
	if (ret)
		goto err_fi;
	step = "fi_ep_bind(cq)";
	ret = fi_ep_bind(nic->ep, &nic->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto err_fi;
	step = "fi_ep_bind(av)";
	ret = fi_ep_bind(nic->ep, &nic->av->fid, 0);
	if (ret)
		goto err_fi;
	step = "fi_enable";
	ret = fi_enable(nic->ep);
	if (ret)
		goto err_fi;
	nic->addrlen = sizeof(nic->addr);
	step = "fi_getname";
	ret = fi_getname(&nic->ep->fid, nic->addr, &nic->addrlen);
	if (ret)
		goto err_fi;
	if (nic->addrlen == 0 || nic->addrlen > EFA_MAX_ADDR) {
		efa_error(ei, EFA_NAME ": %s: endpoint address of %zu bytes (at most %u)",
			  nic->name, nic->addrlen, EFA_MAX_ADDR);
		return TE_ERR_NO_DEVICE;
	}
	return TE_OK;

err_fi:
	efa_error(ei, EFA_NAME ": %s (provider %s): %s: %s", nic->name, ei->prov_name, step,
		  fi_strerror(-ret));
	return TE_ERR_NO_DEVICE;
}

/* libfabric's interface for memory of kind @mem_type. */
static enum fi_hmem_iface efa_hmem_iface(uint32_t mem_type)
{
	switch (mem_type) {
	case TE_PLUGIN_MEM_CUDA:
		return FI_HMEM_CUDA;
	case TE_PLUGIN_MEM_HIP:
		return FI_HMEM_ROCR;
	default:
		return FI_HMEM_SYSTEM;
	}
}

/*
 * Register @len bytes at @addr on @nic with @access: host memory, or GPU memory of @mem_type
 * on device @dev through the provider's FI_HMEM interface; *mr_out, its descriptor and key.
 */
static int efa_nic_reg(struct efa_nic *nic, void *addr, size_t len, uint64_t access,
		       uint32_t mem_type, int32_t dev, struct fid_mr **mr_out, void **desc_out,
		       uint64_t *key_out)
{
	struct iovec iov = { .iov_base = addr, .iov_len = len };
	struct fi_mr_attr attr = {
		.mr_iov = &iov,
		.iov_count = 1,
		.access = access,
		.iface = efa_hmem_iface(mem_type),
	};
	struct fid_mr *mr = NULL;
	int ret;

	if (mem_type == TE_PLUGIN_MEM_CUDA)
		attr.device.cuda = dev;
	/* Without FI_MR_PROV_KEY the requested key must be unique within the domain. */
	if (!(nic->mr_mode & FI_MR_PROV_KEY))
		attr.requested_key =
			atomic_fetch_add_explicit(&nic->next_key, 1, memory_order_relaxed);
	efa_nic_lock(nic);
	ret = fi_mr_regattr(nic->domain, &attr, 0, &mr);
	if (ret == 0 && (nic->mr_mode & FI_MR_ENDPOINT)) {
		ret = fi_mr_bind(mr, &nic->ep->fid, 0);
		if (ret == 0)
			ret = fi_mr_enable(mr);
		if (ret) {
			fi_close(&mr->fid);
			mr = NULL;
		}
	}
	efa_nic_unlock(nic);
	if (ret)
		return ret;
	*key_out = fi_mr_key(mr);
	if (*key_out == FI_KEY_NOTAVAIL) {
		efa_nic_lock(nic);
		fi_close(&mr->fid);
		efa_nic_unlock(nic);
		return -FI_EKEYREJECTED;
	}
	*desc_out = fi_mr_desc(mr);
	*mr_out = mr;
	return 0;
}

/* Register the warm-up message area of @nic and post its receives. */
static enum te_status efa_nic_msg_setup(struct efa_inst *ei, struct efa_nic *nic)
{
	uint64_t key;
	int ret;

	nic->msg = aligned_alloc(4096, 4096);
	if (!nic->msg)
		return TE_ERR_NOMEM;
	memset(nic->msg, 0, 4096);
	efa_put_u64(nic->msg, EFA_HELLO_MAGIC);
	ret = efa_nic_reg(nic, nic->msg, 4096, FI_SEND | FI_RECV, TE_PLUGIN_MEM_CPU, -1,
			  &nic->msg_mr, &nic->msg_desc, &key);
	if (ret) {
		efa_error(ei, EFA_NAME ": %s: fi_mr_regattr of the message area: %s", nic->name,
			  fi_strerror(-ret));
		return TE_ERR_NO_DEVICE;
	}
	for (uint32_t i = 0; i < EFA_RX_BUFS; i++) {
		struct efa_rxbuf *rx = &nic->rx[i];

		rx->op.kind = EFA_OP_RECV;
		rx->buf = nic->msg + EFA_MSG_LEN * (i + 1); /* [0, EFA_MSG_LEN): the hello */
		efa_rx_post(nic, rx);
	}
	return TE_OK;
}

/* fi_getinfo hints for RDM endpoints with RMA of the configured provider (@hmem: FI_HMEM). */
static struct fi_info *efa_hints(const struct efa_inst *ei, bool thread_safe, bool hmem)
{
	struct fi_info *h = fi_allocinfo();

	if (!h)
		return NULL;
	h->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MSG |
		  FI_SEND | FI_RECV;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->ep_attr->type = FI_EP_RDM;
	/* Every mode this plugin honours; the provider returns the subset it needs. */
	h->domain_attr->mr_mode =
		FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	if (hmem) {
		/* Descriptors go with every operation anyway: FI_MR_HMEM costs nothing. */
		h->caps |= FI_HMEM;
		h->domain_attr->mr_mode |= FI_MR_HMEM;
	}
	h->domain_attr->threading = thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
	h->domain_attr->av_type = FI_AV_TABLE;
	h->fabric_attr->prov_name = strdup(ei->provider);
	if (!h->fabric_attr->prov_name) {
		fi_freeinfo(h);
		return NULL;
	}
	return h;
}

/* fi_getinfo of the configured provider (NULL with *ret_out on failure). */
static struct fi_info *efa_getinfo(const struct efa_inst *ei, const char *node, bool hmem,
				   int *ret_out)
{
	struct fi_info *list = NULL, *hints;
	int ret = -FI_ENOMEM;

	/* The plugin serializes every call per NIC itself: FI_THREAD_DOMAIN is enough. */
	for (int safe = 0; safe <= 1 && !list; safe++) {
		hints = efa_hints(ei, safe, hmem);
		if (!hints)
			break;
		ret = fi_getinfo(ei->api_version, node, NULL, node ? FI_SOURCE : 0, hints, &list);
		fi_freeinfo(hints);
		if (ret)
			list = NULL;
	}
	if (list && hmem && !(list->caps & FI_HMEM)) {
		fi_freeinfo(list);
		list = NULL;
		ret = -FI_ENODATA;
	}
	*ret_out = ret;
	return list;
}

/*
 * The GPU kinds whose FI_HMEM interface works in the first domain of @list: libfabric answers
 * -FI_ENOSYS (or -FI_EOPNOTSUPP) for an interface it was built without or could not load
 * (Debian's libfabric has no CUDA or ROCr), before it looks at the address, so a host page
 * tells. Other answers leave the kind to reg_mem, which stages a region it cannot register.
 */
static uint32_t efa_hmem_probe(struct efa_inst *ei, struct fi_info *list)
{
	static const uint32_t kinds[] = { TE_PLUGIN_MEM_CUDA, TE_PLUGIN_MEM_HIP };
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	uint32_t usable = 0;
	void *page = NULL;
	int ret;

	ret = fi_fabric(list->fabric_attr, &fabric, NULL);
	if (ret == 0)
		ret = fi_domain(fabric, list, &domain, NULL);
	if (ret == 0 && posix_memalign(&page, 4096, 4096) != 0)
		ret = -FI_ENOMEM;
	for (size_t k = 0; ret == 0 && k < TE_PLUGIN_ARRAY_LEN(kinds); k++) {
		struct iovec iov = { .iov_base = page, .iov_len = 4096 };
		struct fi_mr_attr attr = {
			.mr_iov = &iov,
			.iov_count = 1,
			.access = FI_READ | FI_WRITE,
			.iface = efa_hmem_iface(kinds[k]),
			.requested_key = k + 1,
		};
		struct fid_mr *mr = NULL;
		int r = fi_mr_regattr(domain, &attr, 0, &mr);

		if (r == 0)
			fi_close(&mr->fid);
		if (r != -FI_ENOSYS && r != -FI_EOPNOTSUPP)
			usable |= kinds[k];
	}
	if (ret)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG, "FI_HMEM probe of %s: %s",
			list->fabric_attr->prov_name ? list->fabric_attr->prov_name : "?",
			fi_strerror(-ret));
	if (domain)
		fi_close(&domain->fid);
	if (fabric)
		fi_close(&fabric->fid);
	free(page);
	return usable;
}

/* Find the domains, open one NIC per domain (at most EFA_MAX_NICS). */
static enum te_status efa_nics_open(struct efa_inst *ei)
{
	const char *node = ei->node[0] ? ei->node : NULL;
	struct fi_info *list = NULL, *pick[EFA_MAX_NICS];
	uint32_t n = 0, want = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
	enum te_status st;
	int ret = -FI_ENOMEM;

	ei->api_version = EFA_MIN(fi_version(), want);
	/*
	 * GPU memory (FI_HMEM) first where the engine has memory kinds, then host memory only.
	 * An FI_HMEM provider is kept only when one of its GPU interfaces works here.
	 */
	if (TE_PLUGIN_HAS(ei->host, struct te_plugin_host, mem_query) && ei->host->mem_query) {
		list = efa_getinfo(ei, node, true, &ret);
		if (list)
			ei->gpu_types = efa_hmem_probe(ei, list);
		if (list && !ei->gpu_types) {
			fi_freeinfo(list);
			list = NULL;
		}
	}
	if (!list)
		list = efa_getinfo(ei, node, false, &ret);
	if (ret || !list) {
		if (strcmp(ei->provider, "efa") == 0)
			efa_error(ei, "no EFA device found: fi_getinfo(efa): %s",
				  fi_strerror(-ret));
		else
			efa_error(ei,
				  EFA_NAME
				  ": no RDM endpoint with RMA from libfabric provider '%s'%s%s: "
				  "fi_getinfo: %s",
				  ei->provider, node ? " on node " : "", node ? node : "",
				  fi_strerror(-ret));
		return TE_ERR_NO_DEVICE;
	}
	for (struct fi_info *i = list; i && n < EFA_MAX_NICS; i = i->next) {
		bool dup = false;

		if (!i->domain_attr || !i->domain_attr->name || !(i->caps & FI_RMA) ||
		    !efa_device_wanted(ei, i->domain_attr->name))
			continue;
		for (uint32_t k = 0; k < n && !dup; k++)
			dup = strcmp(pick[k]->domain_attr->name, i->domain_attr->name) == 0;
		if (!dup)
			pick[n++] = i;
	}
	if (n == 0) {
		efa_error(ei, EFA_NAME ": provider '%s' has no domain named in 'devices' (%s)",
			  ei->provider, ei->devices ? ei->devices : "");
		fi_freeinfo(list);
		return TE_ERR_NO_DEVICE;
	}
	ei->nics = calloc(n, sizeof(*ei->nics));
	if (!ei->nics) {
		fi_freeinfo(list);
		return TE_ERR_NOMEM;
	}
	for (uint32_t k = 0; k < n; k++) {
		ei->nics[k].ei = ei;
		ei->nics[k].index = k;
		ei->nics[k].wait_fd = -1;
		ei->nics[k].info = fi_dupinfo(pick[k]);
		if (!ei->nics[k].info) {
			fi_freeinfo(list);
			return TE_ERR_NOMEM;
		}
	}
	ei->n_nics = n;
	snprintf(ei->prov_name, sizeof(ei->prov_name), "%s",
		 pick[0]->fabric_attr->prov_name ? pick[0]->fabric_attr->prov_name : ei->provider);
	ei->max_msg = pick[0]->ep_attr->max_msg_size;
	ei->shm = strcmp(ei->prov_name, "shm") == 0;
	/* shm and other local-only providers reach peers on this host only. */
	ei->same_host = strncmp(ei->prov_name, "shm", 3) == 0 ||
			((pick[0]->domain_attr->caps & FI_LOCAL_COMM) &&
			 !(pick[0]->domain_attr->caps & FI_REMOTE_COMM));
	fi_freeinfo(list);
	for (uint32_t k = 0; k < n; k++) {
		st = efa_nic_open(ei, &ei->nics[k]);
		if (st == TE_OK)
			st = efa_nic_msg_setup(ei, &ei->nics[k]);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

/* Fill the published blob: magic, version, NIC count, provider name, NIC addresses. */
static enum te_status efa_blob(struct efa_inst *ei, uint8_t *blob, size_t *len_out)
{
	size_t plen = strlen(ei->prov_name), off = EFA_BLOB_HDR + plen;

	efa_put_u32(blob, EFA_BLOB_MAGIC);
	blob[4] = 1;
	blob[5] = (uint8_t)ei->n_nics;
	blob[6] = (uint8_t)plen;
	blob[7] = 0;
	memcpy(blob + EFA_BLOB_HDR, ei->prov_name, plen);
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		if (off + 4 + nic->addrlen > EFA_BLOB_MAX) {
			efa_error(ei, EFA_NAME ": %u NIC addresses do not fit a %u-byte blob",
				  ei->n_nics, EFA_BLOB_MAX);
			return TE_ERR_TOO_LARGE;
		}
		efa_put_u16(blob + off, (uint16_t)nic->addrlen);
		efa_put_u16(blob + off + 2, (uint16_t)(int16_t)nic->numa);
		memcpy(blob + off + 4, nic->addr, nic->addrlen);
		off += 4 + nic->addrlen;
	}
	*len_out = off;
	return TE_OK;
}

/* --- install ------------------------------------------------------------------------------ */

/* Teardown shared by fini and a failing init; @ei may be partly built. */
static void efa_destroy(struct efa_inst *ei)
{
	uint32_t reported = 0, peers = 0, mems = 0, rkeys = 0;

	atomic_store_explicit(&ei->stopping, true, memory_order_release);
	for (uint32_t t = 0; ei->progs && t < ei->n_progs; t++) {
		struct efa_prog *p = &ei->progs[t];

		if (p->started) {
			efa_prog_wake(p);
			pthread_join(p->thread, NULL);
			p->started = false;
		}
	}
	/* Single-threaded from here. Every slice still held is reported exactly once. */
	reported += efa_flush_deferred(ei);
	for (uint32_t i = 0; ei->nics && i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		if (nic->ep) {
			/* Closing the endpoint ends every operation still posted on it. */
			fi_close(&nic->ep->fid);
			nic->ep = NULL;
			nic->closed = true;
		}
		if (nic->cq)
			reported += efa_nic_poll(nic, UINT32_MAX, NULL);
		for (uint32_t k = 0; nic->slots && k < nic->window; k++) {
			struct te_plugin_slice *s =
				atomic_load_explicit(&nic->slots[k], memory_order_relaxed);
			struct efa_peer *peer;
			struct efa_spriv *p;

			if (!s)
				continue;
			p = efa_priv(s);
			peer = p->peer; /* the slice (and its priv) may be gone after slice_done */
			efa_slot_release(nic, k);
			atomic_fetch_sub(&p->mem->inflight, 1);
			atomic_fetch_sub(&nic->inflight, 1);
			atomic_fetch_sub(&peer->paths[nic->index].inflight, 1);
			ei->host->slice_done(ei->ctx, s, TE_ERR_CANCELED, 0,
					     EFA_NAME ": instance shut down");
			atomic_fetch_sub(&peer->refs, 1);
			reported++;
		}
	}
	while (ei->peers) {
		peers++;
		efa_peer_free_locked(ei, ei->peers);
	}
	while (ei->rkeys) {
		struct efa_rkey *k = ei->rkeys;

		ei->rkeys = k->next;
		rkeys++;
		free(k);
	}
	while (ei->mems) {
		struct efa_mem *m = ei->mems;

		ei->mems = m->next;
		for (uint32_t i = 0; i < ei->n_nics; i++)
			if (m->mr && m->mr[i])
				fi_close(&m->mr[i]->fid);
		free(m->mr);
		free(m->desc);
		free(m->key);
		free(m);
		mems++;
	}
	for (uint32_t i = 0; ei->nics && i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		if (nic->msg_mr)
			fi_close(&nic->msg_mr->fid);
		for (uint32_t k = 0; k < nic->n_av; k++)
			free(nic->av_entries[k]);
		free(nic->av_entries);
		if (nic->av)
			fi_close(&nic->av->fid);
		if (nic->cq)
			fi_close(&nic->cq->fid);
		if (nic->domain)
			fi_close(&nic->domain->fid);
		if (nic->fabric)
			fi_close(&nic->fabric->fid);
		if (nic->info)
			fi_freeinfo(nic->info);
		free(nic->msg);
		free(nic->bits);
		free(nic->slots);
		pthread_mutex_destroy(&nic->lock);
	}
	if (reported || peers || rkeys || mems)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG,
			"fini reported %u completions and released %u peers, %u remote keys, "
			"%u regions",
			reported, peers, rkeys, mems);
	for (uint32_t t = 0; ei->progs && t < ei->n_progs; t++) {
		if (ei->progs[t].kick_fd >= 0)
			close(ei->progs[t].kick_fd);
		free(ei->progs[t].nics);
		free(ei->progs[t].pfds);
	}
	free(ei->progs);
	free(ei->nics);
	free(ei->devices);
	pthread_mutex_destroy(&ei->lock);
	pthread_mutex_destroy(&ei->defer_lock);
	free(ei);
}

/*
 * rxm closes its connection to an address removed from the AV, returning the operations queued
 * on it, only with FI_AV_REMOVE_CLEANUP, which libfabric reads once, at its first use in the
 * process: without it a canceled operation to a stopped peer could end only when that peer ran
 * again. There is no other way to set it; an explicit setting is kept and said. shm needs none.
 */
static void efa_env_init(struct efa_inst *ei)
{
	const char *v = getenv("FI_AV_REMOVE_CLEANUP");

	if (strcmp(ei->provider, "shm") == 0)
		return;
	if (!v) {
		if (setenv("FI_AV_REMOVE_CLEANUP", "1", 0) != 0)
			efa_log(ei, TE_PLUGIN_LOG_WARN, "setenv(FI_AV_REMOVE_CLEANUP): %s",
				strerror(errno));
		return;
	}
	if (strcmp(v, "1") != 0 && strcasecmp(v, "yes") != 0 && strcasecmp(v, "true") != 0 &&
	    strcasecmp(v, "on") != 0)
		efa_log(ei, TE_PLUGIN_LOG_WARN,
			"FI_AV_REMOVE_CLEANUP=%s: a canceled or timed-out operation ends only when "
			"the provider completes it, not when its connection is closed",
			v);
}

static enum te_status efa_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	uint8_t *blob = NULL;
	struct efa_inst *ei;
	enum te_status st;
	size_t len = 0;

	if (!host || !inst_out || !TE_PLUGIN_HAS(host, struct te_plugin_host, local_name) ||
	    !host->log || !host->slice_done || !host->config_get || !host->publish)
		return TE_ERR_INVALID_ARG;
	if (host->abi_major != TE_PLUGIN_ABI_MAJOR)
		return TE_ERR_ABI_MISMATCH;
	ei = calloc(1, sizeof(*ei));
	if (!ei)
		return TE_ERR_NOMEM;
	ei->host = host;
	ei->ctx = ctx;
	pthread_mutex_init(&ei->lock, NULL);
	pthread_mutex_init(&ei->defer_lock, NULL);

	st = efa_options(ei);
	if (st != TE_OK)
		goto err_destroy;
	efa_env_init(ei);
	st = efa_nics_open(ei);
	if (st != TE_OK)
		goto err_destroy;
	if (ei->gpu_types)
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"GPU memory: moved by provider %s through FI_HMEM (%s%s%s)", ei->prov_name,
			(ei->gpu_types & TE_PLUGIN_MEM_CUDA) ? "cuda" : "",
			ei->gpu_types == (TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP) ? ", " : "",
			(ei->gpu_types & TE_PLUGIN_MEM_HIP) ? "hip" : "");
	else
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"GPU memory: staged by the core here; peers cannot reach GPU regions over "
			"efa (provider %s has no usable FI_HMEM interface)",
			ei->prov_name);
	blob = malloc(EFA_BLOB_MAX);
	if (!blob) {
		st = TE_ERR_NOMEM;
		goto err_destroy;
	}
	st = efa_blob(ei, blob, &len);
	if (st != TE_OK)
		goto err_destroy;
	st = host->publish(ctx, blob, len);
	if (st != TE_OK) {
		efa_error(ei, EFA_NAME ": publish failed: %d", st);
		goto err_destroy;
	}
	st = efa_progs_start(ei);
	if (st != TE_OK)
		goto err_destroy;
	free(blob);
	efa_log(ei, TE_PLUGIN_LOG_INFO,
		"provider %s, %u NIC(s) (first: %s, mr_mode 0x%" PRIx64
		", %s), window %u, slice %" PRIu64 ", progress %s, %s completion of WRITEs",
		ei->prov_name, ei->n_nics, ei->nics[0].name, ei->nics[0].mr_mode,
		ei->nics[0].wait_fd >= 0 ? "wait fd" : "polled", ei->nics[0].window, ei->slice_size,
		ei->progress == EFA_PROGRESS_BUSY     ? "busy"
		: ei->progress == EFA_PROGRESS_CALLER ? "caller"
						      : "adaptive",
		ei->write_flags ? "delivery" : "transmit");
	*inst_out = (struct te_plugin_inst *)ei;
	return TE_OK;

err_destroy:
	free(blob);
	efa_destroy(ei);
	return st;
}

static void efa_fini(struct te_plugin_inst *inst)
{
	if (inst)
		efa_destroy(efa_inst_of(inst));
}

static enum te_status efa_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t max_slice;

	if (!ei || !caps)
		return TE_ERR_INVALID_ARG;
	max_slice = EFA_MIN(ei->max_msg ? ei->max_msg : EFA_MAX_SLICE, EFA_MAX_SLICE);
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, mem_types))
		caps->mem_types = TE_PLUGIN_MEM_CPU | ei->gpu_types;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, ops))
		caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, progress))
		caps->progress = ei->progress == EFA_PROGRESS_CALLER ? TE_PLUGIN_PROGRESS_MANUAL
								     : TE_PLUGIN_PROGRESS_AUTO;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, thread_level))
		caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, flags))
		caps->flags = ei->same_host ? TE_PLUGIN_CAP_SAME_HOST_ONLY : 0;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, max_slice_size))
		caps->max_slice_size = max_slice;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, default_slice_size))
		caps->default_slice_size = EFA_MIN(ei->slice_size, max_slice);
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, slice_priv_size))
		caps->slice_priv_size = sizeof(struct efa_spriv);
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, max_devices))
		caps->max_devices = ei->n_nics;
	return TE_OK;
}

static enum te_status efa_query_devices(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint32_t n;

	if (!ei || !n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	n = EFA_MIN(max, ei->n_nics);
	for (uint32_t i = 0; i < n; i++) {
		struct te_plugin_device *d = &devices[i];
		const struct efa_nic *nic = &ei->nics[i];

		if (TE_PLUGIN_HAS(d, struct te_plugin_device, name))
			snprintf(d->name, sizeof(d->name), "%s", nic->name);
		if (TE_PLUGIN_HAS(d, struct te_plugin_device, numa_node))
			d->numa_node = nic->numa;
		if (TE_PLUGIN_HAS(d, struct te_plugin_device, pci))
			snprintf(d->pci, sizeof(d->pci), "%s", nic->pci);
		if (TE_PLUGIN_HAS(d, struct te_plugin_device, link_speed_mbps))
			d->link_speed_mbps = nic->speed_mbps;
		if (TE_PLUGIN_HAS(d, struct te_plugin_device, mem_types))
			d->mem_types = TE_PLUGIN_MEM_CPU | ei->gpu_types;
	}
	*n_out = n;
	return TE_OK;
}

/* --- memory ---------------------------------------------------------------------------- */

static enum te_status efa_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t fi_access = FI_READ | FI_WRITE;
	struct efa_mem *m;
	uint32_t i;

	if (!ei || !addr || length == 0 || !mem_out || (access & ~EFA_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(mem_type & ei->gpu_types)) {
		efa_error(ei, EFA_NAME ": provider %s moves no %s memory itself (no FI_HMEM)",
			  ei->prov_name, mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda");
		return TE_ERR_MEMORY_TYPE;
	}
	if ((uint64_t)(uintptr_t)addr > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	if (access & TE_PLUGIN_ACCESS_REMOTE_READ)
		fi_access |= FI_REMOTE_READ;
	if (access & TE_PLUGIN_ACCESS_REMOTE_WRITE)
		fi_access |= FI_REMOTE_WRITE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = (uint64_t)(uintptr_t)addr;
	m->length = length;
	m->access = access;
	m->mr = calloc(ei->n_nics, sizeof(*m->mr));
	m->desc = calloc(ei->n_nics, sizeof(*m->desc));
	m->key = calloc(ei->n_nics, sizeof(*m->key));
	if (!m->mr || !m->desc || !m->key)
		goto err_nomem;
	/* Topology: the NICs on the region's NUMA node carry its slices; else all NICs. */
	for (i = 0; i < ei->n_nics; i++) {
		if (mem_type == TE_PLUGIN_MEM_CPU && dev >= 0 && ei->nics[i].numa == dev) {
			m->pref[m->n_pref++] = (uint8_t)i;
			m->nic_mask |= 1ull << i;
		}
	}
	if (!m->n_pref) {
		for (i = 0; i < ei->n_nics; i++)
			m->pref[m->n_pref++] = (uint8_t)i;
		m->nic_mask = 0;
	}
	for (i = 0; i < ei->n_nics; i++) {
		int ret = efa_nic_reg(&ei->nics[i], addr, length, fi_access, mem_type, dev,
				      &m->mr[i], &m->desc[i], &m->key[i]);
		/* GPU memory the provider's FI_HMEM interface cannot take: the core stages it. */
		bool gpu_refused = mem_type != TE_PLUGIN_MEM_CPU &&
				   (ret == -FI_ENOSYS || ret == -FI_EOPNOTSUPP ||
				    ret == -FI_EINVAL || ret == -FI_EACCES);

		if (ret) {
			if (gpu_refused)
				efa_error(ei,
					  EFA_NAME ": %s: fi_mr_regattr of %s:%d [%p, +%" PRIu64
						   ") through FI_HMEM: %s; the core stages it",
					  ei->nics[i].name,
					  mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda", dev, addr,
					  length, fi_strerror(-ret));
			else
				efa_error(ei,
					  EFA_NAME ": %s: fi_mr_regattr of [%p, +%" PRIu64 "): %s",
					  ei->nics[i].name, addr, length, fi_strerror(-ret));
			while (i--) {
				efa_nic_lock(&ei->nics[i]);
				fi_close(&m->mr[i]->fid);
				efa_nic_unlock(&ei->nics[i]);
			}
			free(m->mr);
			free(m->desc);
			free(m->key);
			free(m);
			if (gpu_refused)
				return TE_ERR_UNSUPPORTED;
			return ret == -FI_ENOMEM ? TE_ERR_NOMEM : TE_ERR_SYSTEM;
		}
	}
	pthread_mutex_lock(&ei->lock);
	m->next = ei->mems;
	if (ei->mems)
		ei->mems->prev = m;
	ei->mems = m;
	pthread_mutex_unlock(&ei->lock);
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;

err_nomem:
	free(m->mr);
	free(m->desc);
	free(m->key);
	free(m);
	return TE_ERR_NOMEM;
}

static enum te_status efa_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_mem *m = (struct efa_mem *)mem;
	uint32_t busy;

	if (!ei || !m)
		return TE_ERR_INVALID_ARG;
	/* Our own operations still use it: the provider may yet read or write it. */
	busy = atomic_load_explicit(&m->inflight, memory_order_acquire);
	if (busy) {
		efa_error(ei,
			  EFA_NAME ": region [0x%" PRIx64 ", +%" PRIu64 ") has %u operation(s) "
				   "in flight",
			  m->addr, m->length, busy);
		return TE_ERR_BUSY;
	}
	pthread_mutex_lock(&ei->lock);
	if (m->prev)
		m->prev->next = m->next;
	else
		ei->mems = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&ei->lock);
	/* Closing the MR revokes its key: peers' later operations on it fail at the target. */
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		efa_nic_lock(&ei->nics[i]);
		fi_close(&m->mr[i]->fid);
		efa_nic_unlock(&ei->nics[i]);
	}
	free(m->mr);
	free(m->desc);
	free(m->key);
	free(m);
	return TE_OK;
}

static enum te_status efa_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	const struct efa_mem *m = (const struct efa_mem *)mem;
	size_t len;
	uint8_t *p = buf;

	if (!ei || !m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	len = EFA_KEY_HDR + 8u * ei->n_nics;
	if (cap < len)
		return TE_ERR_TOO_LARGE;
	efa_put_u32(p, EFA_KEY_MAGIC);
	p[4] = 1;
	p[5] = (uint8_t)ei->n_nics;
	/* The target's mr_mode decides how its provider reads remote addresses. */
	efa_put_u16(p + 6, (ei->nics[0].mr_mode & FI_MR_VIRT_ADDR) ? 0 : EFA_KEY_OFFSET);
	efa_put_u32(p + 8, m->access);
	efa_put_u32(p + 12, 0);
	efa_put_u64(p + 16, m->addr);
	efa_put_u64(p + 24, m->length);
	efa_put_u64(p + 32, m->nic_mask);
	for (uint32_t i = 0; i < ei->n_nics; i++)
		efa_put_u64(p + EFA_KEY_HDR + 8u * i, m->key[i]);
	*len_out = len;
	return TE_OK;
}

/* --- peers ------------------------------------------------------------------------------ */

/* Send one warm-up message per NIC pair so connections exist before the first transfer. */
static void efa_peer_warmup(struct efa_inst *ei, struct efa_peer *peer)
{
	uint64_t deadline = efa_now_ns() + ei->connect_timeout_ms * 1000000ull;

	for (uint32_t k = 0; k < peer->n_hello; k++) {
		struct efa_hello *h = &peer->hello[k];
		struct efa_nic *nic = &ei->nics[h->nic];
		const struct efa_av_entry *e = peer->entries[h->nic * peer->n_rnics + h->rnic];
		ssize_t ret;

		h->op.kind = EFA_OP_HELLO;
		h->peer = peer;
		atomic_fetch_add_explicit(&peer->refs, 1, memory_order_relaxed);
		for (;;) {
			efa_nic_lock(nic);
			ret = e->fi_addr == FI_ADDR_NOTAVAIL
				      ? -FI_EADDRNOTAVAIL
				      : fi_send(nic->ep, nic->msg, EFA_HELLO_LEN, nic->msg_desc,
						e->fi_addr, &h->op.ctx);
			efa_nic_unlock(nic);
			/* -FI_EAGAIN while the connection is set up: the progress thread runs it. */
			if (ret != -FI_EAGAIN || efa_now_ns() >= deadline)
				break;
			efa_prog_kick(nic->prog);
			usleep(100);
		}
		if (ret) {
			atomic_fetch_sub_explicit(&peer->refs, 1, memory_order_relaxed);
			efa_log(ei, TE_PLUGIN_LOG_INFO,
				"%s: warm-up message to %s (remote NIC %u) not sent: %s", nic->name,
				peer->name, h->rnic, fi_strerror((int)-ret));
			if (ret == -FI_EAGAIN)
				break; /* out of time for the others too */
		} else {
			efa_prog_kick(nic->prog);
		}
	}
}

static enum te_status efa_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				    const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	const uint8_t *b = blob;
	const uint8_t *raddr[EFA_MAX_NICS];
	size_t rlen[EFA_MAX_NICS], off;
	char prov[EFA_MAX_PROV + 1];
	struct efa_peer *peer;
	uint32_t n_r, pairs;
	enum te_status st = TE_OK;

	if (!ei || !peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len < EFA_BLOB_HDR || efa_get_u32(b) != EFA_BLOB_MAGIC || b[4] != 1 || b[5] == 0 ||
	    b[5] > EFA_MAX_NICS || b[6] == 0 || b[6] > EFA_MAX_PROV ||
	    len < EFA_BLOB_HDR + (size_t)b[6])
		goto err_malformed;
	n_r = b[5];
	memcpy(prov, b + EFA_BLOB_HDR, b[6]);
	prov[b[6]] = '\0';
	off = EFA_BLOB_HDR + b[6];
	for (uint32_t j = 0; j < n_r; j++) {
		if (len - off < 4)
			goto err_malformed;
		rlen[j] = efa_get_u16(b + off);
		if (rlen[j] == 0 || rlen[j] > EFA_MAX_ADDR || len - off - 4 < rlen[j])
			goto err_malformed;
		raddr[j] = b + off + 4;
		off += 4 + rlen[j];
	}
	if (off != len)
		goto err_malformed;
	if (strcmp(prov, ei->prov_name) != 0) {
		efa_error(ei,
			  EFA_NAME ": peer %s uses libfabric provider '%s', this engine '%s': they "
				   "cannot reach each other",
			  peer_name, prov, ei->prov_name);
		return TE_ERR_PEER_UNREACHABLE;
	}

	peer = calloc(1, sizeof(*peer));
	if (!peer)
		return TE_ERR_NOMEM;
	peer->ei = ei;
	peer->n_rnics = n_r;
	peer->name = strdup(peer_name);
	peer->entries = calloc((size_t)ei->n_nics * n_r, sizeof(*peer->entries));
	peer->paths = calloc(ei->n_nics, sizeof(*peer->paths));
	peer->pidfd = -1;
	pairs = ei->n_nics * n_r <= EFA_HELLO_PAIRS ? ei->n_nics * n_r : ei->n_nics;
	peer->hello = ei->warmup ? calloc(pairs, sizeof(*peer->hello)) : NULL;
	if (!peer->name || !peer->entries || !peer->paths || (ei->warmup && !peer->hello)) {
		free(peer->name);
		free(peer->entries);
		free(peer->paths);
		free(peer->hello);
		free(peer);
		return TE_ERR_NOMEM;
	}
	atomic_init(&peer->refs, 1);
	if (ei->shm)
		efa_peer_watch(ei, peer, raddr[0], rlen[0]);
	pthread_mutex_lock(&ei->lock);
	peer->next = ei->peers;
	if (ei->peers)
		ei->peers->prev = peer;
	ei->peers = peer;
	for (uint32_t i = 0; i < ei->n_nics && st == TE_OK; i++) {
		for (uint32_t j = 0; j < n_r && st == TE_OK; j++) {
			struct efa_av_entry *e = NULL;

			st = efa_av_get_locked(&ei->nics[i], raddr[j], rlen[j], &e);
			if (st == TE_OK)
				peer->entries[i * n_r + j] = e;
		}
	}
	if (st != TE_OK) {
		efa_peer_free_locked(ei, peer);
		pthread_mutex_unlock(&ei->lock);
		return st;
	}
	pthread_mutex_unlock(&ei->lock);
	if (ei->warmup) {
		for (uint32_t i = 0; i < ei->n_nics; i++) {
			for (uint32_t j = 0; j < n_r; j++) {
				if (pairs != ei->n_nics * n_r && j != i % n_r)
					continue;
				peer->hello[peer->n_hello++] =
					(struct efa_hello){ .nic = i, .rnic = j };
			}
		}
		efa_peer_warmup(ei, peer);
	}
	efa_log(ei, TE_PLUGIN_LOG_DEBUG, "peer %s: %u NIC(s), %u warm-up message(s)", peer_name,
		n_r, peer->n_hello);
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;

err_malformed:
	efa_error(ei, EFA_NAME ": peer %s: malformed transport blob (%zu bytes)", peer_name, len);
	return TE_ERR_METADATA_MALFORMED;
}

static void efa_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_peer *peer = (struct efa_peer *)handle;

	if (!ei || !peer)
		return;
	/* Slices and warm-up messages still in flight keep it until they complete. */
	efa_peer_unref(ei, peer);
}

static enum te_status efa_unpack_remote_key(struct te_plugin_inst *inst,
					    struct te_plugin_peer *handle, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_peer *peer = (struct efa_peer *)handle;
	const uint8_t *p = blob;
	struct efa_rkey *k;
	uint64_t kaddr, klen, mask;
	uint32_t n, access;
	uint16_t flags;

	if (!ei || !peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len < EFA_KEY_HDR || efa_get_u32(p) != EFA_KEY_MAGIC || p[4] != 1)
		goto err_malformed;
	n = p[5];
	flags = efa_get_u16(p + 6);
	access = efa_get_u32(p + 8);
	kaddr = efa_get_u64(p + 16);
	klen = efa_get_u64(p + 24);
	mask = efa_get_u64(p + 32);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if (n != peer->n_rnics || len != EFA_KEY_HDR + 8u * n || (flags & ~EFA_KEY_OFFSET) ||
	    (access & ~EFA_ACCESS_ALL) || efa_get_u32(p + 12) != 0 || klen == 0 ||
	    kaddr > UINT64_MAX - klen || kaddr != addr || klen != length || (n < 64 && (mask >> n)))
		goto err_malformed;
	k = calloc(1, sizeof(*k) + n * sizeof(k->keys[0]));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = access;
	k->offset = flags & EFA_KEY_OFFSET;
	k->n_keys = n;
	for (uint32_t j = 0; j < n; j++) {
		k->keys[j] = efa_get_u64(p + EFA_KEY_HDR + 8u * j);
		if (!mask || (mask & (1ull << j)))
			k->pref[k->n_pref++] = (uint8_t)j;
	}
	pthread_mutex_lock(&ei->lock);
	k->next = ei->rkeys;
	if (ei->rkeys)
		ei->rkeys->prev = k;
	ei->rkeys = k;
	pthread_mutex_unlock(&ei->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	efa_error(ei,
		  EFA_NAME ": peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64
			   ", +%" PRIu64 ")",
		  peer->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void efa_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_rkey *k = (struct efa_rkey *)rkey;

	if (!ei || !k)
		return;
	/* Posted operations carry copies of the key: nothing in flight refers to it. */
	pthread_mutex_lock(&ei->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ei->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ei->lock);
	free(k);
}

/* --- submit and cancel --------------------------------------------------------------------- */

/* The NIC for @s: round-robin over those near its local region, avoiding excluded ones. */
static struct efa_nic *efa_pick_nic(struct efa_inst *ei, struct efa_mem *m, uint64_t excluded)
{
	uint32_t start;

	if (ei->n_nics == 1)
		return &ei->nics[0];
	/* relaxed: a striping counter; any interleaving is fine */
	start = atomic_fetch_add_explicit(&m->rr, 1, memory_order_relaxed);
	for (uint32_t k = 0; k < m->n_pref; k++) {
		uint32_t i = m->pref[(start + k) % m->n_pref];

		if (!(excluded & (1ull << i)))
			return &ei->nics[i];
	}
	for (uint32_t k = 0; k < ei->n_nics; k++) {
		uint32_t i = (start + k) % ei->n_nics;

		if (!(excluded & (1ull << i)))
			return &ei->nics[i];
	}
	return &ei->nics[m->pref[start % m->n_pref]];
}

/* Initiator-side checks the core already made: defence in depth, no syscall. */
static enum te_status efa_check_slice(const struct te_plugin_slice *s, char *why, size_t len)
{
	const struct efa_rkey *k = (const struct efa_rkey *)s->rkey;
	const struct efa_mem *m = (const struct efa_mem *)s->local_mem;
	uint64_t local = (uint64_t)(uintptr_t)s->local;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;

	if (local < m->addr || s->length > m->length || local - m->addr > m->length - s->length) {
		snprintf(why, len, EFA_NAME ": local range [%p, +%" PRIu64 ") outside its region",
			 s->local, s->length);
		return TE_ERR_OUT_OF_RANGE;
	}
	if (s->remote < k->addr || s->length > k->length ||
	    s->remote - k->addr > k->length - s->length || !(k->access & need)) {
		snprintf(why, len,
			 EFA_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				  ") outside the remote-%s buffer [0x%" PRIx64 ", +%" PRIu64 ")",
			 s->remote, s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "readable" : "writable", k->addr,
			 k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	return TE_OK;
}

/* Post @s on @nic (slot and references taken). 0 or a negative libfabric error. */
/* Post @s on @nic, whose lock the caller holds. */
static ssize_t efa_post_locked(struct efa_inst *ei, struct efa_nic *nic, struct te_plugin_slice *s)
{
	struct efa_spriv *p = efa_priv(s);
	const struct efa_rkey *k = (const struct efa_rkey *)s->rkey;
	const struct efa_peer *peer = p->peer;
	uint32_t j = k->pref[nic->index % k->n_pref];
	fi_addr_t fa = peer->entries[nic->index * peer->n_rnics + j]->fi_addr;
	/* Without FI_MR_VIRT_ADDR at the target, remote addresses are offsets in the region. */
	uint64_t raddr = k->offset ? s->remote - k->addr : s->remote;
	void *desc = p->mem->desc[nic->index];
	ssize_t ret;

	/* A fence could not insert the address again (efa_nic_fence logged why). */
	if (fa == FI_ADDR_NOTAVAIL)
		return -FI_EADDRNOTAVAIL;
	if (s->opcode == TE_PLUGIN_OP_READ) {
		ret = fi_read(nic->ep, s->local, s->length, desc, fa, raddr, k->keys[j],
			      &p->op.ctx);
	} else {
		struct iovec iov = { .iov_base = s->local, .iov_len = s->length };
		struct fi_rma_iov rma = { .addr = raddr, .len = s->length, .key = k->keys[j] };
		struct fi_msg_rma msg = {
			.msg_iov = &iov,
			.desc = &desc,
			.iov_count = 1,
			.addr = fa,
			.rma_iov = &rma,
			.rma_iov_count = 1,
			.context = &p->op.ctx,
		};

		/* Delivery complete: a WRITE is done when the bytes are in the target's memory. */
		ret = fi_writemsg(nic->ep, &msg, FI_COMPLETION | ei->write_flags);
	}
	return ret;
}

/*
 * A post to @path answered -FI_EAGAIN. With nothing of ours in flight there, that is not a
 * full queue but a connection that does not come up (rxm retries a refused connect forever):
 * after connect_timeout_ms of it the peer counts as unreachable.
 */
static bool efa_path_unreachable(struct efa_inst *ei, struct efa_path *path)
{
	uint_fast64_t since, now;

	if (atomic_load_explicit(&path->inflight, memory_order_relaxed))
		return false;
	now = efa_now_ns();
	since = atomic_load_explicit(&path->eagain_since, memory_order_relaxed);
	if (!since) {
		atomic_compare_exchange_strong_explicit(&path->eagain_since, &since, now,
							memory_order_relaxed, memory_order_relaxed);
		return false;
	}
	return now - since > ei->connect_timeout_ms * 1000000ull;
}

static enum te_status efa_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				 uint32_t n, uint32_t *accepted_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t kick = 0; /* progress threads to wake, by index */
	bool deferred = false;
	enum te_status ret = TE_OK;
	struct efa_nic *held = NULL; /* the NIC whose lock this call holds */
	uint64_t held_since = 0;
	uint32_t i, run = 0;

	if (!ei || !accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	if (atomic_load_explicit(&ei->stopping, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct efa_spriv *p;
		struct efa_path *path;
		struct efa_nic *nic;
		char why[EFA_PRIV_DETAIL];
		enum te_status bad;
		int64_t slot;
		ssize_t rc;

		if (!s || !s->priv || !s->peer || !s->rkey || !s->local_mem || !s->local ||
		    s->length == 0 || s->length > EFA_MAX_SLICE ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			efa_log(ei, TE_PLUGIN_LOG_ERROR, "submit: malformed slice %u of %u", i, n);
			ret = TE_ERR_INVALID_ARG;
			break;
		}
		p = efa_priv(s);
		atomic_store_explicit(&p->canceled, 0, memory_order_relaxed);
		bad = efa_check_slice(s, why, sizeof(why));
		if (bad != TE_OK) {
			efa_defer_fail(ei, s, bad, "%s", why);
			deferred = true;
			continue;
		}
		/*
		 * A dead shm peer may have left its region's lock held: a post to it would spin
		 * in the provider forever. One poll of its pidfd per slice rules that out, except
		 * for a peer that dies while this post waits for its lock.
		 */
		if (ei->shm && efa_peer_dead((struct efa_peer *)s->peer)) {
			efa_defer_fail(ei, s, TE_ERR_PEER_UNREACHABLE,
				       EFA_NAME "[%s]: peer %s (process %d) exited", ei->prov_name,
				       ((struct efa_peer *)s->peer)->name,
				       ((struct efa_peer *)s->peer)->pid);
			deferred = true;
			continue;
		}
		nic = efa_pick_nic(ei, (struct efa_mem *)s->local_mem, s->excluded_devices);
		slot = efa_slot_claim(nic);
		if (slot < 0)
			break; /* window full: back-pressure */
		p->op.kind = EFA_OP_SLICE;
		p->slice = s;
		p->nic = nic;
		p->mem = (struct efa_mem *)s->local_mem;
		p->peer = (struct efa_peer *)s->peer;
		p->slot = (uint32_t)slot;
		s->device = nic->index;
		path = &p->peer->paths[nic->index];
		atomic_store_explicit(&nic->slots[slot], s, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->mem->inflight, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->peer->refs, 1, memory_order_relaxed);
		/* relaxed: counters read to choose between polling and sleeping, or for EAGAIN */
		atomic_fetch_add_explicit(&nic->inflight, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&path->inflight, 1, memory_order_relaxed);
		/*
		 * Consecutive cheap posts to one NIC share one lock hold: with several submitting
		 * threads, a lock handed over at every slice costs a futex wake per operation.
		 * A hold ends after EFA_POST_RUN posts or EFA_POST_HOLD_NS, so posts that copy
		 * (shm's CMA) still take the lock one at a time and the progress thread gets in
		 * between them to reap completions.
		 */
		if (held && (held != nic || run == EFA_POST_RUN ||
			     efa_now_ns() - held_since > EFA_POST_HOLD_NS)) {
			efa_nic_unlock(held);
			held = NULL;
		}
		if (!held) {
			efa_nic_lock(nic);
			held = nic;
			held_since = efa_now_ns();
			run = 0;
		}
		run++;
		rc = efa_post_locked(ei, nic, s);
		if (rc == 0) {
			if (atomic_load_explicit(&path->eagain_since, memory_order_relaxed))
				atomic_store_explicit(&path->eagain_since, 0, memory_order_relaxed);
			kick |= 1ull << nic->prog->index;
			continue;
		}
		atomic_fetch_sub_explicit(&path->inflight, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&nic->inflight, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&p->peer->refs, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&p->mem->inflight, 1, memory_order_relaxed);
		efa_slot_release(nic, (uint32_t)slot);
		if (rc == -FI_EAGAIN && efa_path_unreachable(ei, path)) {
			efa_defer_fail(ei, s, TE_ERR_PEER_UNREACHABLE,
				       EFA_NAME "[%s] %s: no connection to %s in %" PRIu64
						" ms (posts keep answering EAGAIN)",
				       ei->prov_name, nic->name, p->peer->name,
				       ei->connect_timeout_ms);
			deferred = true;
			continue;
		}
		if (rc == -FI_EAGAIN) {
			/* Provider queue full: the progress thread drains it, the core resubmits. */
			kick |= 1ull << nic->prog->index;
			break;
		}
		efa_defer_fail(ei, s, efa_status_of((int)-rc),
			       EFA_NAME "[%s] %s: posting %s of %" PRIu64 " bytes failed: %s",
			       ei->prov_name, nic->name,
			       s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE", s->length,
			       fi_strerror((int)-rc));
		deferred = true;
	}
	if (held)
		efa_nic_unlock(held);
	if (deferred)
		kick |= 1;
	for (uint32_t t = 0; kick && t < ei->n_progs; t++)
		if (kick & (1ull << t))
			efa_prog_kick(&ei->progs[t]);
	*accepted_out = i;
	return ret;
}

static enum te_status efa_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_spriv *p;
	struct efa_nic *nic;

	if (!ei || !s || !s->priv)
		return TE_ERR_INVALID_ARG;
	p = efa_priv(s);
	nic = p->nic;
	/*
	 * The slice memory is valid during the call, but priv may be stale (an earlier attempt,
	 * or a recycled slice not accepted yet): trust nothing before it checks out.
	 */
	if (!nic || nic < ei->nics || nic >= ei->nics + ei->n_nics || p->slot >= nic->window ||
	    atomic_load_explicit(&nic->slots[p->slot], memory_order_relaxed) != s)
		return TE_ERR_NOT_FOUND;
	/*
	 * What takes a posted RMA operation back (closing its connection; fi_cancel takes back
	 * receives only) needs the NIC lock, which a post may hold for long (shm copies inside
	 * the post call, and spins there on a stopped peer's region), and cancel must not block:
	 * the progress thread fences the slice (efa_nic_fence) and reports it when the provider
	 * returns it, canceled if it failed, with its real outcome otherwise.
	 */
	{
		unsigned none = EFA_CANCEL_NONE;

		/* seq_cst, before the request: efa_nic_fence clears requests, then looks. */
		if (!atomic_compare_exchange_strong(&p->canceled, &none, EFA_CANCEL_ASKED))
			return TE_OK;
	}
	atomic_fetch_add(&nic->fence_req, 1);
	efa_prog_wake(nic->prog);
	return TE_OK;
}

static enum te_status efa_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t all;

	if (!ei || !s)
		return TE_ERR_INVALID_ARG;
	/* submit picks the NIC avoiding excluded ones; here only check that one is left. */
	all = ei->n_nics >= 64 ? UINT64_MAX : (1ull << ei->n_nics) - 1;
	if ((s->excluded_devices & all) == all)
		return TE_ERR_NO_DEVICE;
	return TE_OK;
}

/*
 * progress 'caller' (MANUAL to the core): the thread waiting in te_batch_wait, or the core's
 * worker, reaps completions here, so a completion reaches its batch without a hand-off
 * between threads. NICs whose lock a submit holds are skipped; the next call gets them.
 */
static uint32_t efa_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint32_t done = 0;
	bool busy = false;

	if (!ei || atomic_load_explicit(&ei->stopping, memory_order_relaxed))
		return 0;
	atomic_store_explicit(&ei->caller_ns, efa_now_ns(), memory_order_relaxed);
	for (uint32_t i = 0; i < ei->n_nics && done < budget; i++)
		done += efa_nic_poll(&ei->nics[i], budget - done, &busy);
	done += efa_flush_deferred(ei);
	if (done)
		efa_progs_unpark(ei);
	return done;
}

/*
 * progress 'caller', ABI 1.1: the core's polling waiter found nothing; sleep on the CQ wait
 * fds (fi_trywait first: completions already queued end the wait at once), as the raw
 * libfabric loop does, rather than spinning against the peers for the CPUs. Not with a
 * provider without wait fds (shm), nor while a submit holds a NIC (it may be posting).
 */
static enum te_status efa_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct pollfd pfd[EFA_MAX_NICS];
	struct timespec ts = efa_timespec(timeout_ns);

	if (!ei || ei->progress != EFA_PROGRESS_CALLER || !ei->all_fd)
		return TE_ERR_UNSUPPORTED;
	atomic_store_explicit(&ei->caller_ns, efa_now_ns(), memory_order_relaxed);
	if (atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		return TE_OK; /* failures to report: progress() flushes them */
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];
		int rc;

		if (pthread_mutex_trylock(&nic->lock) != 0)
			return TE_OK;
		rc = fi_trywait(nic->fabric, &nic->cq_fid, 1);
		efa_nic_unlock(nic);
		if (rc != FI_SUCCESS)
			return TE_OK;
		pfd[i] = (struct pollfd){ .fd = nic->wait_fd, .events = POLLIN };
	}
	if (ppoll(pfd, ei->n_nics, &ts, NULL) < 0 && errno != EINTR)
		return TE_ERR_UNSUPPORTED;
	return TE_OK;
}

static const struct te_plugin_ops efa_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = efa_init,
	.fini = efa_fini,
	.query_caps = efa_query_caps,
	.query_devices = efa_query_devices,
	.reg_mem = efa_reg_mem,
	.dereg_mem = efa_dereg_mem,
	.pack_key = efa_pack_key,
	.load_peer = efa_load_peer,
	.unload_peer = efa_unload_peer,
	.unpack_remote_key = efa_unpack_remote_key,
	.release_remote_key = efa_release_remote_key,
	.submit = efa_submit,
	.progress = efa_progress,
	.cancel = efa_cancel,
	.retry_prepare = efa_retry_prepare,
	.wait = efa_wait,
};

static const struct te_plugin_desc efa_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = EFA_NAME,
	.version = "1.0",
	.description = "libfabric RDM transport (AWS EFA; tcp;ofi_rxm, shm, net for tests): "
		       "one-sided READ/WRITE",
	.ops = &efa_ops,
};

TE_PLUGIN_DEFINE(&efa_desc)
