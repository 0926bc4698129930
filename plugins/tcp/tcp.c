/* SPDX-License-Identifier: Apache-2.0 */
/* tcp.c: the tcp transport: pipelined, checked READ/WRITE requests over persistent TCP lanes. */

/*
 * Shape of the plugin (README.md has the wire format and the user-visible semantics):
 *
 * Initiator side. Every peer has `lanes` persistent connections, opened on first use with a
 * non-blocking connect. A lane owns a send queue and a table of `max_inflight` slots; a slot's
 * index and a 16-bit generation form the request id. Per-slice state lives in slice->priv
 * (queue link, encoded request header, result detail), so the data path never allocates.
 * submit() spreads slices round-robin over the lanes and, when nobody is sending on a lane,
 * sends right away from the calling thread with one sendmsg() gathering many headers and
 * payloads straight from the source buffers. What does not fit is sent by the lane's worker
 * when the socket becomes writable. Responses are read by the lane's worker: headers in bulk,
 * READ payloads straight into the destination.
 *
 * Serving side. Accepted connections are spread over the workers. Every request is checked
 * against the registered regions (one region, matching remote access) before memory is
 * touched; a WRITE payload is received straight into the region, a READ is answered with a
 * header plus an iovec pointing into the region.
 *
 * Threads. `workers` epoll threads (edge-triggered) serve both sides. A server connection is
 * only ever touched by its worker. A lane is shared by submitters, cancel and its worker under
 * lane->lock; the socket send side is owned by whoever set lane->sending, and only the lane's
 * worker closes its socket, so no thread ever uses a closed (or reused) descriptor.
 * host->slice_done is never called with a plugin lock held: it may re-enter unload_peer or
 * release_remote_key.
 *
 * Memory safety of the serving side. The region table is a sorted array under a
 * writer-preferring rwlock with a version counter bumped by dereg_mem. Each non-blocking
 * syscall that reads or writes registered memory runs under the read lock and first
 * re-validates its range if the version moved, so dereg_mem (write lock) waits for at most one
 * such syscall, never for a slow peer, and no byte moves after it returns.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, pthread_setname_np, pthread_rwlockattr_setkind_np */
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>

#define TCP_NAME "tcp"

/* --- limits and wire constants ------------------------------------------------------ */

#define TCP_MAX_LANES 64u
#define TCP_MAX_WORKERS 64u
#define TCP_MAX_INFLIGHT 4096u	   /* slot index must fit the low 16 bits of a request id */
#define TCP_MAX_FRAME (1ull << 30) /* longest READ/WRITE a server accepts */
#define TCP_DEF_SLICE (1ull << 20) /* chosen by measurement: see README.md */

#define TCP_WIRE_MAGIC 0x31504354u /* bytes "TCP1" */
#define TCP_WIRE_VERSION 2u
#define TCP_HDR_LEN 32u
#define TCP_OP_READ 0u
#define TCP_OP_WRITE 1u
#define TCP_OP_HELLO 2u
#define TCP_OP_AUTH 3u
#define TCP_DETAIL_WIRE 200u /* longest error detail a server sends */
#define TCP_NONCE 32u	     /* fresh random bytes per connection and side */
#define TCP_HELLO_REQ 56u    /* client id, epoch, lane, flags, client nonce */
#define TCP_HELLO_ANS 72u    /* flags, reserved, server nonce, server MAC */
#define TCP_HELLO_SECRET 1u  /* HELLO flags: the client has a secret; answer: auth required */
#define TCP_NO_DEADLINE 0xffffffffu /* request deadline field: none */
/* Every answer to an unauthenticated client: the same words whatever it asked (no oracle). */
#define TCP_NOT_AUTHED TCP_NAME ": not authenticated"
#define TCP_AUTH_FAILED TCP_NAME ": authentication failed"

/* Serving-side limits (options; README.md): defaults safe on a public network. */
#define TCP_DEF_MAX_CONNS 1024u
#define TCP_DEF_MAX_CONNS_HOST 64u
#define TCP_DEF_MAX_UNAUTH 128u
#define TCP_DEF_HELLO_MS 5000u
#define TCP_DEF_IDLE_MS 300000u
#define TCP_DEF_FRAME_MS 60000u
#define TCP_FENCES 4096u /* lane epochs remembered (client id, lane) */
/*
 * After a HELLO answered by another instance, submits to that peer fail at once for this
 * long; then a lane tries again (the core fetches the descriptor meanwhile; a peer whose
 * address answers with its own instance again is usable again).
 */
#define TCP_RESTART_HOLD_MS 1000u

#define TCP_BLOB_MAGIC 0x31424354u /* "TCB1": published endpoint */
#define TCP_BLOB_LEN 40u
#define TCP_KEY_MAGIC 0x314b4354u /* "TCK1": region key */
#define TCP_KEY_LEN 24u

#define TCP_RBUF 8192u /* header buffer per connection; >= TCP_HDR_LEN + TCP_DETAIL_WIRE */
#define TCP_CTL 256u   /* handshake bytes queued per connection (>= 2 frames, or 1 + detail) */
#define TCP_SCRATCH (256u << 10) /* per worker: where discarded payloads go */
#define TCP_LANE_IOV 512u	 /* iovecs per client sendmsg (<= UIO_MAXIOV) */
#define TCP_SRV_IOV 1024u	 /* iovecs per server sendmsg (UIO_MAXIOV) */
#define TCP_SRV_RING 256u	 /* responses queued per server connection */
#define TCP_RX_BUDGET (4u << 20) /* bytes read per wake-up before other sockets get a turn */
#define TCP_STAGE (1u << 20)	 /* staging buffer per connection and direction (GPU memory) */
#define TCP_STAGED_TYPES (TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP)
#define TCP_TICK_MS 100	   /* housekeeping period: connect timeouts, stalls */
#define TCP_STALL_TICKS 3u /* ticks without progress that break a lane with cancels */
#define TCP_EVENTS 64

#define TCP_ACCESS_ALL (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)
#define TCP_MIN(a, b) ((a) < (b) ? (a) : (b))

/* --- objects ------------------------------------------------------------------------ */

/* What an epoll event points at: the first member of every registered object. */
enum tcp_kind {
	TCP_EP_KICK,
	TCP_EP_LISTEN,
	TCP_EP_LANE,
	TCP_EP_CONN,
};

struct tcp_ep {
	enum tcp_kind kind;
	bool again; /* on its worker's again list (worker only) */
};

/* One frame header, both directions (little-endian on the wire, see README.md). */
struct tcp_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t op;
	uint16_t flags;
	uint32_t req_id;
	int32_t status;
	uint64_t addr;
	uint64_t length;
};

struct tcp_mem {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	uint32_t mem_type; /* TE_PLUGIN_MEM_CPU, or a GPU kind served by staging */
	int32_t dev;
};

struct tcp_region {
	uint64_t start;
	uint64_t end; /* exclusive */
	uint32_t access;
	struct tcp_mem *mem;
};

struct tcp_rkey {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	struct tcp_rkey *prev, *next; /* instance list, so fini can free what the core kept */
};

/*
 * Receive state of one connection. Headers (and error details) collect in buf; a payload
 * goes to dst directly, and only bytes that arrived in the same read as preceding
 * header-only frames (bulk mode) are copied out of buf.
 */
struct tcp_rx {
	uint8_t *buf; /* TCP_RBUF bytes */
	uint32_t pos, end;
	bool bulk;    /* the last frame carried no payload: read ahead */
	bool payload; /* a payload is being received */
	uint8_t *dst; /* where it goes; NULL: discarded */
	uint64_t left;
	uint64_t room; /* > 0: at most this many bytes reach dst per read (a staging buffer) */
};

/* Per-slice plugin state, in slice->priv. */
#define TCP_PRIV_DETAIL 176
struct tcp_spriv {
	struct te_plugin_slice *next; /* send queue, deferred-failure, fence or report list */
	/* Read by cancel without the lane lock: a slice's lane only changes between attempts. */
	_Atomic(struct tcp_lane *) lane;
	_Atomic uint32_t slot;
	uint32_t req_id;
	int32_t status; /* result kept until the slot can complete */
	/*
	 * On its lane's fence list (under the lane lock): a WRITE whose bytes may be in the
	 * network or the server's socket; reported once the server fenced its connection, or
	 * its deadline passed (tcp_lane_break).
	 */
	bool fencing;
	uint8_t hdr[TCP_HDR_LEN];
	char detail[TCP_PRIV_DETAIL];
};
_Static_assert(sizeof(struct tcp_spriv) <= 256, "slice_priv_size is at most 256 bytes");

/* Slot flags. A slot completes once SENT and ANSWERED are both set; whoever sets the later. */
#define TCP_SLOT_USED (1u << 0)
#define TCP_SLOT_IN_IOV (1u << 1)   /* part of a sendmsg in progress: cannot be unqueued */
#define TCP_SLOT_SENT (1u << 2)	    /* the whole request left; the sender is done with it */
#define TCP_SLOT_RECV (1u << 3)	    /* its payload is being received into slice->local */
#define TCP_SLOT_ANSWERED (1u << 4) /* the response was fully processed */
#define TCP_SLOT_CANCELED (1u << 5) /* cancel asked; report TE_ERR_CANCELED */
#define TCP_SLOT_ORPHAN (1u << 6)   /* already reported; waits only for its response */

struct tcp_slot {
	struct te_plugin_slice *slice; /* NULL when free or orphaned */
	uint64_t length;
	uint16_t gen;
	uint16_t flags;
	uint8_t op;
};

enum tcp_lane_state {
	TCP_LANE_DOWN,	     /* no socket; the next submit connects */
	TCP_LANE_CONNECTING, /* non-blocking connect in progress */
	TCP_LANE_UP,
	TCP_LANE_BROKEN, /* failed; its worker will report and close */
};

/* Handshake of a lane's connection (client side). */
enum tcp_hs {
	TCP_HS_HELLO, /* HELLO queued or sent; requests wait for its answer */
	TCP_HS_AUTH,  /* AUTH queued behind it; requests may follow it */
	TCP_HS_READY, /* the server accepted this connection (and fenced older ones of the lane) */
};

struct tcp_peer;
struct tcp_worker;

struct tcp_lane {
	struct tcp_ep ep;
	struct tcp_peer *peer;
	struct tcp_worker *w;
	uint32_t index;

	pthread_mutex_t lock;
	/* Everything below up to rx is under lock. */
	enum tcp_lane_state state;
	int fd;
	bool sending;  /* a thread is in the send loop (it owns the socket's send side) */
	bool out_kick; /* the socket became writable while someone was sending */
	bool closing;  /* the peer is being unloaded */
	uint64_t connect_start_ns;
	enum te_status err_status; /* why it broke (first reason wins) */
	char err_detail[TCP_PRIV_DETAIL];

	struct te_plugin_slice *sq_head, *sq_tail; /* requests not completely sent */
	uint64_t sq_off;			   /* bytes of sq_head's frame already sent */
	/* HELLO and AUTH bytes not yet sent (ctl, at the end); they precede every request. */
	uint32_t ctl_len, ctl_off;
	enum tcp_hs hs;
	uint64_t epoch;	  /* of the current (or last) connection; each connect takes the next */
	uint64_t base_ns; /* when its HELLO answer arrived: request deadlines count from it */
	bool refused;	  /* the last connect was refused: nobody listens at the address */
	bool peer_closed; /* the server closed or reset this connection (EOF, ECONNRESET) */
	/* A WRITE waits for a fence from a connection the server did not close itself. */
	bool fence_unclosed;

	/* WRITEs of torn-down connections waiting for the server's fence (tcp_spriv.fencing). */
	struct te_plugin_slice *fence_head, *fence_tail;
	uint32_t n_fence;
	uint64_t fence_connect_ns; /* when a reconnect for the fence last started */

	struct tcp_slot *slots;
	uint32_t *free_ids;
	uint32_t n_free;
	uint32_t n_orphan;
	uint32_t n_canceled;

	/*
	 * Held by the worker around each read into a slice's destination. cancel sets
	 * rx_redirect and then takes rx_lock once: after that no byte of the canceled READ
	 * reaches its destination (the rest is discarded).
	 */
	pthread_mutex_t rx_lock;
	atomic_bool rx_redirect;

	/* Worker only. */
	struct tcp_rx rx;
	uint32_t rx_slot;
	bool rx_flush; /* the handshake advanced: send what waited for it */
	uint64_t seen_progress;
	uint32_t stall_ticks;
	/* relaxed: a progress counter compared across housekeeping ticks only */
	_Atomic uint64_t progress;

	/* Under the worker's lock. */
	bool in_todo;
	struct tcp_lane *todo_next;
	struct tcp_lane *wprev, *wnext;

	/* Cold: used once per connection. */
	uint8_t nonce_c[TCP_NONCE];
	uint8_t ctl[TCP_CTL];
};

struct tcp_peer {
	struct tcp_inst *ti;
	char *name;
	char addr_text[72]; /* "[addr]:port" for details */
	struct sockaddr_storage sa;
	socklen_t salen;
	uint64_t nonce; /* the server instance its blob names */
	uint64_t cid;	/* random: names this peer object's lanes to the server (fences) */
	atomic_uint rr;
	atomic_bool restarted; /* the address answered with another instance (reported once) */
	/* Until then submits fail at once (relaxed: a hint; the next HELLO decides). */
	_Atomic uint64_t restarted_until_ns;
	atomic_uint lanes_open;
	struct tcp_peer *prev, *next; /* instance list, under ti->lock */
	uint32_t n_lanes;
	struct tcp_lane lanes[];
};

/* One queued response of a server connection. */
struct tcp_resp {
	uint8_t hdr[TCP_HDR_LEN];
	const uint8_t *payload; /* registered memory (READ) or detail (error); NULL: none */
	uint64_t len;
	uint64_t ver; /* region table version the payload range was checked at */
	bool ready;   /* a WRITE's answer waits for its payload */
	bool memory;  /* payload points into registered memory */
	bool staged;  /* ... of a GPU kind: sent through the connection's staging buffer */
	uint32_t mem_type;
	int32_t dev;
	uint64_t addr; /* the request, for re-checks and details */
	char detail[TCP_DETAIL_WIRE];
};

/* Handshake of an accepted connection (server side). */
enum tcp_chs {
	TCP_CHS_HELLO, /* waiting for the client's HELLO */
	TCP_CHS_AUTH,  /* HELLO answered with a challenge; waiting for AUTH */
	TCP_CHS_READY, /* serving requests */
};

struct tcp_conn {
	struct tcp_ep ep;
	struct tcp_worker *w;
	int fd;
	char who[72];
	uint8_t host[16]; /* the client's address (IPv4 as v4-mapped IPv6): per-host limit */
	enum tcp_chs hs;  /* written under w->lock (fencers of other workers read it) */
	bool closing;	  /* answer what is queued, then close */
	bool rx_paused;	  /* ring full: stop reading until responses drain */
	bool abort;	  /* close with a reset: unread bytes are never applied */
	/* Set under the region write lock by a newer connection of the same lane. */
	atomic_bool fenced;
	/* From its HELLO, under w->lock: the client's lane and that lane's epoch. */
	uint64_t cid, epoch;
	uint32_t lane;
	uint64_t accept_ns; /* HELLO/AUTH must complete within hello_timeout_ms of it */
	uint64_t base_ns;   /* when the HELLO answer was built: request deadlines count from it */
	uint64_t frame_start_ns;   /* first byte of the frame being received; 0: none */
	uint64_t active_ns;	   /* last complete frame (idle timeout) */
	uint64_t frames;	   /* complete frames so far */
	uint32_t ctl_len, ctl_off; /* of ctl: handshake answers, sent before any response */
	struct tcp_rx rx;
	/* The WRITE whose payload is being received. */
	uint32_t cur;	   /* its ring index */
	uint64_t cur_ver;  /* region table version its destination was checked at */
	uint64_t cur_addr; /* start of the request, for details */
	uint64_t cur_len;
	uint64_t cur_deadline; /* this side's clock; UINT64_MAX: none */
	/*
	 * A WRITE into GPU memory (served by staging): its bytes collect in rx_stage (rx_fill of
	 * them) and go to stage_dev, the next device address, through host->mem_copy.
	 */
	bool cur_staged;
	uint32_t cur_type;
	int32_t cur_dev;
	uint8_t *rx_stage; /* TCP_STAGE bytes, allocated at the first staged WRITE */
	uint64_t rx_fill;
	uint64_t stage_dev;
	/* A READ of GPU memory: the chunk [txs_base, +txs_len) of its payload is in tx_stage. */
	uint8_t *tx_stage;
	uint64_t txs_base, txs_len;
	struct tcp_resp *ring; /* TCP_SRV_RING entries, allocated once READY */
	uint32_t head, count;
	uint64_t tx_off; /* bytes of ring[head] already sent */
	struct tcp_conn *prev, *next;

	/* Cold: the handshake's. */
	uint8_t nonce_c[TCP_NONCE], nonce_s[TCP_NONCE];
	uint8_t ctl[TCP_CTL];
};

/* The newest epoch seen of one client lane (lane fencing). */
struct tcp_fence {
	uint64_t cid;
	uint64_t epoch;
	uint64_t used_ns;
	uint32_t lane;
};

struct tcp_worker {
	struct tcp_inst *ti;
	uint32_t index;
	pthread_t thread;
	bool started;
	int epfd;
	int kick_fd;
	struct tcp_ep kick_ep;

	pthread_mutex_t lock;
	bool kicked;
	struct tcp_lane *todo;
	struct te_plugin_slice *defer_head, *defer_tail;
	struct tcp_lane *lanes;
	struct tcp_conn *conns;
	uint32_t n_conns;

	/* Worker thread only. */
	uint64_t warn_ns; /* tcp_warn_limited */
	uint32_t warn_quiet;
	uint8_t *scratch;
	struct tcp_ep **again;
	uint32_t n_again, cap_again;
};

struct tcp_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;

	/* options */
	char bind_text[64];
	uint32_t lanes;
	uint32_t n_workers;
	uint32_t max_inflight;
	uint64_t slice_size;
	uint64_t connect_timeout_ms;
	uint64_t sockbuf; /* SO_SNDBUF/SO_RCVBUF; 0: kernel autotuning */
	uint64_t max_conns, max_conns_per_host, max_unauth;
	uint64_t hello_timeout_ms, idle_timeout_ms, frame_timeout_ms;

	bool auth;	      /* the engine has a secret: data connections authenticate */
	atomic_uint n_conns;  /* accepted connections open */
	atomic_uint n_unauth; /* of them, not READY yet */
	/* Refused connections: one warning per second at most (accepting worker only). */
	uint64_t refuse_log_ns;
	uint32_t refused_quiet;

	pthread_mutex_t fence_lock;
	struct tcp_fence *fences;
	uint32_t n_fences;

	int listen_fd;
	struct tcp_ep listen_ep;
	uint16_t port;
	char device[64];
	uint64_t nonce;

	/* Region table: sorted, disjoint. */
	pthread_rwlock_t reg_lock;
	struct tcp_region *regions;
	uint32_t n_regions, cap_regions;
	_Atomic uint64_t reg_ver; /* written under the write lock, read under the read lock */

	pthread_mutex_t lock; /* peers, rkeys, round-robin counters */
	struct tcp_peer *peers;
	struct tcp_rkey *rkeys;
	uint32_t next_peer_worker;
	atomic_uint next_conn_worker;

	struct tcp_worker *workers;
	atomic_bool stopping;
};

/* --- small helpers ------------------------------------------------------------------ */

/* The host prefixes every line with the plugin name. */
#define tcp_log(ti, level, ...) (ti)->host->log((ti)->ctx, (level), __VA_ARGS__)
/* Why the op running on this thread fails: the core quotes it to the user. */
#define tcp_set_error(ti, ...)                                                                     \
	do {                                                                                       \
		if ((ti)->host->set_error)                                                         \
			(ti)->host->set_error((ti)->ctx, __VA_ARGS__);                             \
	} while (0)

static inline struct tcp_inst *tcp_inst_of(struct te_plugin_inst *inst)
{
	return (struct tcp_inst *)inst;
}

static inline struct tcp_spriv *tcp_priv(const struct te_plugin_slice *s)
{
	return (struct tcp_spriv *)s->priv;
}

static void tcp_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void tcp_put_u32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void tcp_put_u64(uint8_t *p, uint64_t v)
{
	for (unsigned i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t tcp_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t tcp_get_u32(const uint8_t *p)
{
	uint32_t v = 0;

	for (unsigned i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t tcp_get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void tcp_hdr_encode(uint8_t *p, const struct tcp_hdr *h)
{
	tcp_put_u32(p, h->magic);
	p[4] = h->version;
	p[5] = h->op;
	tcp_put_u16(p + 6, h->flags);
	tcp_put_u32(p + 8, h->req_id);
	tcp_put_u32(p + 12, (uint32_t)h->status);
	tcp_put_u64(p + 16, h->addr);
	tcp_put_u64(p + 24, h->length);
}

static void tcp_hdr_decode(const uint8_t *p, struct tcp_hdr *h)
{
	h->magic = tcp_get_u32(p);
	h->version = p[4];
	h->op = p[5];
	h->flags = tcp_get_u16(p + 6);
	h->req_id = tcp_get_u32(p + 8);
	h->status = (int32_t)tcp_get_u32(p + 12);
	h->addr = tcp_get_u64(p + 16);
	h->length = tcp_get_u64(p + 24);
}

static void tcp_encode(uint8_t *p, uint8_t op, uint32_t req_id, int32_t status, uint64_t addr,
		       uint64_t length)
{
	struct tcp_hdr h = {
		.magic = TCP_WIRE_MAGIC,
		.version = TCP_WIRE_VERSION,
		.op = op,
		.req_id = req_id,
		.status = status,
		.addr = addr,
		.length = length,
	};

	tcp_hdr_encode(p, &h);
}

static uint64_t tcp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* "addr:port" / "[addr]:port" of a socket address. */
static void tcp_sa_text(const struct sockaddr_storage *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(s4->sin_port));
	}
}

/* Printable copy of a peer-supplied detail (it may hold any bytes). */
static void tcp_copy_detail(char *dst, size_t cap, const uint8_t *src, size_t len)
{
	size_t n = TCP_MIN(len, cap - 1);

	for (size_t i = 0; i < n; i++)
		dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? (char)src[i] : '?';
	dst[n] = '\0';
}

/* Fresh random bytes (nonces, client ids); false when the kernel cannot give them. */
static bool tcp_random(void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = getrandom((uint8_t *)buf + done, len - done, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		done += (size_t)n;
	}
	return true;
}

/*
 * What a side proves with its MAC (host->auth_mac): its role, the server instance, the
 * client's lane and epoch and both fresh nonces, so a proof is good for this connection only.
 */
#define TCP_TRANSCRIPT (16 + 8 + 8 + 8 + 4 + 2 * TCP_NONCE)
static void tcp_transcript(uint8_t out[TCP_TRANSCRIPT], bool server, uint64_t instance,
			   uint64_t cid, uint64_t epoch, uint32_t lane, const uint8_t *nonce_c,
			   const uint8_t *nonce_s)
{
	memset(out, 0, 16);
	memcpy(out, server ? "tcp-v2 server" : "tcp-v2 client", 14);
	tcp_put_u64(out + 16, instance);
	tcp_put_u64(out + 24, cid);
	tcp_put_u64(out + 32, epoch);
	tcp_put_u32(out + 40, lane);
	memcpy(out + 44, nonce_c, TCP_NONCE);
	memcpy(out + 44 + TCP_NONCE, nonce_s, TCP_NONCE);
}

/* --- region table (serving side) ------------------------------------------------------ */

/* Index of the first region whose end is above @addr. Under reg_lock. */
static uint32_t tcp_region_search(const struct tcp_inst *ti, uint64_t addr)
{
	uint32_t lo = 0, hi = ti->n_regions;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (ti->regions[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The ONE region holding [addr, addr+len) and granting @need, or NULL. Under reg_lock (read). */
static const struct tcp_region *tcp_region_find(const struct tcp_inst *ti, uint64_t addr,
						uint64_t len, uint32_t need)
{
	uint32_t i;

	if (len == 0 || addr > UINT64_MAX - len)
		return NULL;
	i = tcp_region_search(ti, addr);
	if (i < ti->n_regions && ti->regions[i].start <= addr && addr + len <= ti->regions[i].end &&
	    (ti->regions[i].access & need) == need)
		return &ti->regions[i];
	return NULL;
}

/* Whether [addr, addr+len) lies inside ONE region granting @need. Under reg_lock (read). */
static bool tcp_region_allows(const struct tcp_inst *ti, uint64_t addr, uint64_t len, uint32_t need)
{
	return tcp_region_find(ti, addr, len, need) != NULL;
}

/* "cuda:0" for a staged region's kind and device. */
static void tcp_kind_text(char *buf, size_t cap, uint32_t mem_type, int32_t dev)
{
	snprintf(buf, cap, "%s:%d", mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda", dev);
}

static void tcp_region_detail(const struct tcp_inst *ti, char *buf, size_t cap, uint8_t op,
			      uint64_t addr, uint64_t len, const char *extra)
{
	const char *name = ti->host->local_name ? ti->host->local_name(ti->ctx) : "";

	snprintf(buf, cap,
		 TCP_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
			  ") is not inside a registered remote-%s buffer of %s%s",
		 addr, len, op == TCP_OP_READ ? "readable" : "writable", name && *name ? name : "?",
		 extra);
}

/* --- workers: kicks, deferred completions, again list --------------------------------- */

static void tcp_worker_wake_locked(struct tcp_worker *w)
{
	uint64_t one = 1;

	if (w->kicked)
		return;
	w->kicked = true;
	/* A full counter (impossible in practice) still leaves the eventfd readable. */
	if (write(w->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		tcp_log(w->ti, TE_PLUGIN_LOG_ERROR, "worker %u: cannot wake: %s", w->index,
			strerror(errno));
}

/* Ask @l's worker to look at it (finish a failure, close it). Any thread. */
static void tcp_kick_lane(struct tcp_lane *l)
{
	struct tcp_worker *w = l->w;

	pthread_mutex_lock(&w->lock);
	if (!l->in_todo) {
		l->in_todo = true;
		l->todo_next = w->todo;
		w->todo = l;
	}
	tcp_worker_wake_locked(w);
	pthread_mutex_unlock(&w->lock);
}

/*
 * Fail @s from @w's thread: submit must not report synchronously (the core still touches
 * the slices it hands over after submit returns).
 */
static void tcp_defer_fail(struct tcp_worker *w, struct te_plugin_slice *s, enum te_status st,
			   const char *detail)
{
	struct tcp_spriv *p = tcp_priv(s);

	p->status = st;
	snprintf(p->detail, sizeof(p->detail), "%s", detail);
	p->next = NULL;
	atomic_store_explicit(&p->lane, NULL, memory_order_relaxed);
	pthread_mutex_lock(&w->lock);
	if (w->defer_tail)
		tcp_priv(w->defer_tail)->next = s;
	else
		w->defer_head = s;
	w->defer_tail = s;
	tcp_worker_wake_locked(w);
	pthread_mutex_unlock(&w->lock);
}

static void tcp_again_add(struct tcp_worker *w, struct tcp_ep *ep)
{
	if (ep->again)
		return;
	if (w->n_again == w->cap_again) {
		uint32_t ncap = w->cap_again ? w->cap_again * 2 : 16;
		struct tcp_ep **na = realloc(w->again, ncap * sizeof(*na));

		/* Without room the object simply waits for its next epoll edge. */
		if (!na)
			return;
		w->again = na;
		w->cap_again = ncap;
	}
	ep->again = true;
	w->again[w->n_again++] = ep;
}

static void tcp_again_remove(struct tcp_worker *w, struct tcp_ep *ep)
{
	if (!ep->again)
		return;
	for (uint32_t i = 0; i < w->n_again; i++) {
		if (w->again[i] == ep) {
			w->again[i] = w->again[--w->n_again];
			break;
		}
	}
	ep->again = false;
}

/* A warning that floods can repeat: at most one a second per worker, with a count. */
static void tcp_warn_limited(struct tcp_inst *ti, struct tcp_worker *w, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
static void tcp_warn_limited(struct tcp_inst *ti, struct tcp_worker *w, const char *fmt, ...)
{
	uint64_t now = tcp_now_ns();
	char line[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (now - w->warn_ns < 1000000000ull) {
		w->warn_quiet++;
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "%s", line);
		return;
	}
	if (w->warn_quiet)
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s (and %u more like it in the last second)", line,
			w->warn_quiet);
	else
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s", line);
	w->warn_ns = now;
	w->warn_quiet = 0;
}

/* --- initiator side: slots and completion ------------------------------------------- */

static void tcp_report(struct tcp_inst *ti, struct te_plugin_slice *s, enum te_status st,
		       const char *detail)
{
	ti->host->slice_done(ti->ctx, s, st, st == TE_OK ? s->length : 0,
			     st == TE_OK ? NULL : detail);
}

/* Free slot @id. Under lane lock. */
static void tcp_slot_free_locked(struct tcp_lane *l, uint32_t id)
{
	struct tcp_slot *slot = &l->slots[id];

	if (slot->flags & TCP_SLOT_CANCELED)
		l->n_canceled--;
	if (slot->flags & TCP_SLOT_ORPHAN)
		l->n_orphan--;
	slot->slice = NULL;
	slot->flags = 0;
	l->free_ids[l->n_free++] = id;
}

/*
 * Slot @id has both SENT and ANSWERED: free it and return the slice to report (NULL when it
 * was orphaned by cancel). The status to report is left in priv->status. Under lane lock.
 */
static struct te_plugin_slice *tcp_slot_finish_locked(struct tcp_lane *l, uint32_t id)
{
	struct tcp_slot *slot = &l->slots[id];
	struct te_plugin_slice *s = slot->slice;

	if (s && (slot->flags & TCP_SLOT_CANCELED)) {
		tcp_priv(s)->status = TE_ERR_CANCELED;
		snprintf(tcp_priv(s)->detail, TCP_PRIV_DETAIL, TCP_NAME ": canceled");
	}
	tcp_slot_free_locked(l, id);
	return s;
}

/*
 * Slot @id was canceled and is now fully sent but unanswered: report it now and let its
 * response be discarded when it comes. Under lane lock; returns the slice to report.
 */
static struct te_plugin_slice *tcp_slot_orphan_locked(struct tcp_lane *l, uint32_t id)
{
	struct tcp_slot *slot = &l->slots[id];
	struct te_plugin_slice *s = slot->slice;

	slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_CANCELED) | TCP_SLOT_ORPHAN);
	l->n_canceled--;
	l->n_orphan++;
	slot->slice = NULL;
	tcp_priv(s)->status = TE_ERR_CANCELED;
	snprintf(tcp_priv(s)->detail, TCP_PRIV_DETAIL, TCP_NAME ": canceled while in flight");
	return s;
}

static void tcp_report_priv(struct tcp_inst *ti, struct te_plugin_slice *s)
{
	struct tcp_spriv *p = tcp_priv(s);

	tcp_report(ti, s, (enum te_status)p->status, p->detail);
}

/*
 * Record why @l failed and mark it BROKEN; the caller then gets its worker to run
 * tcp_lane_break (directly, or with tcp_kick_lane). Under lane lock. The socket stays open
 * until the worker aborts it: only the worker closes a lane's socket, and another thread
 * may be inside a (non-blocking) syscall on it.
 */
static void tcp_lane_fail_locked(struct tcp_lane *l, enum te_status st, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
static void tcp_lane_fail_locked(struct tcp_lane *l, enum te_status st, const char *fmt, ...)
{
	va_list ap;

	if (l->state == TCP_LANE_DOWN)
		return;
	if (l->err_status == TE_OK) {
		l->err_status = st;
		va_start(ap, fmt);
		vsnprintf(l->err_detail, sizeof(l->err_detail), fmt, ap);
		va_end(ap);
	}
	l->state = TCP_LANE_BROKEN;
}

/* Close @fd with a reset: the kernel drops what it still holds to send, now. */
static void tcp_sock_abort(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* A list of slices to report, linked through tcp_spriv.next; reported without locks held. */
struct tcp_rlist {
	struct te_plugin_slice *head, *tail;
};

static void tcp_rlist_add(struct tcp_rlist *r, struct te_plugin_slice *s)
{
	tcp_priv(s)->next = NULL;
	if (r->tail)
		tcp_priv(r->tail)->next = s;
	else
		r->head = s;
	r->tail = s;
}

static void tcp_rlist_report(struct tcp_inst *ti, struct tcp_rlist *r)
{
	struct te_plugin_slice *s = r->head;

	r->head = r->tail = NULL;
	while (s) {
		/* Read first: once reported, the core may hand the slice out again at once. */
		struct te_plugin_slice *next = tcp_priv(s)->next;

		tcp_report_priv(ti, s);
		s = next;
	}
}

static void tcp_fence_add_locked(struct tcp_lane *l, struct te_plugin_slice *s)
{
	struct tcp_spriv *p = tcp_priv(s);

	p->fencing = true;
	p->next = NULL;
	if (l->fence_tail)
		tcp_priv(l->fence_tail)->next = s;
	else
		l->fence_head = s;
	l->fence_tail = s;
	l->n_fence++;
}

static void tcp_fence_unlink_locked(struct tcp_lane *l, struct te_plugin_slice *prev,
				    struct te_plugin_slice *s)
{
	struct te_plugin_slice *next = tcp_priv(s)->next;

	if (prev)
		tcp_priv(prev)->next = next;
	else
		l->fence_head = next;
	if (l->fence_tail == s)
		l->fence_tail = prev;
	l->n_fence--;
	tcp_priv(s)->fencing = false;
	if (!l->n_fence)
		l->fence_unclosed = false;
}

/*
 * Move the slices waiting for a fence to @out: all of them (the server fenced their
 * connections, or cannot apply them any more), or those whose deadline passed by @now (the
 * server drops request bytes that arrive after the deadline stamped in them). Under lane lock.
 */
static void tcp_fence_take_locked(struct tcp_lane *l, bool all, uint64_t now, struct tcp_rlist *out)
{
	struct te_plugin_slice *s = l->fence_head, *prev = NULL;

	while (s) {
		struct te_plugin_slice *next = tcp_priv(s)->next;

		if (all || now >= s->deadline_ns) {
			tcp_fence_unlink_locked(l, prev, s);
			tcp_rlist_add(out, s);
		} else {
			prev = s;
		}
		s = next;
	}
}

static void tcp_lane_connect_locked(struct tcp_inst *ti, struct tcp_lane *l);

/*
 * Abort @l's connection (a reset: the kernel drops what it has not sent) and end what it
 * held; the lane is DOWN afterwards and reconnects on demand. Its worker only (or fini).
 * When a sender is still in its loop the lane stays BROKEN: the sender kicks the worker when
 * it leaves.
 *
 * No WRITE lands after it was reported: one whose bytes reached the socket and got no answer
 * may still be in the network or in the server's socket buffer, so it is reported only once
 * that cannot land any more: when a newer connection of this lane was accepted (the server
 * fenced the older ones first), when the server is gone (nobody listens where the old
 * connection was closed by the server, or another instance answers there), or when its
 * deadline passed (the server discards request bytes past the deadline stamped in them).
 * Such a lane reconnects at once to get the fence. Everything else is reported now.
 */
static void tcp_lane_break(struct tcp_inst *ti, struct tcp_lane *l, enum te_status st,
			   const char *detail)
{
	struct tcp_rlist now_list = { 0 };
	char why[TCP_PRIV_DETAIL];
	uint32_t n = 0, fenced = 0;
	uint64_t now = tcp_now_ns();
	struct te_plugin_slice *partial;
	enum te_status rst;
	bool gone, closed_by_peer, reconnect = false;

	pthread_mutex_lock(&l->lock);
	if (l->state == TCP_LANE_DOWN) {
		pthread_mutex_unlock(&l->lock);
		return;
	}
	if (l->err_status == TE_OK) {
		l->err_status = st;
		snprintf(l->err_detail, sizeof(l->err_detail), "%s", detail);
	}
	if (l->sending) {
		l->state = TCP_LANE_BROKEN;
		pthread_mutex_unlock(&l->lock);
		return;
	}
	rst = l->err_status;
	snprintf(why, sizeof(why), "%s", l->err_detail);
	closed_by_peer = l->peer_closed;
	gone = rst == TE_ERR_PEER_RESTARTED || (l->refused && !l->fence_unclosed) || l->closing ||
	       atomic_load_explicit(&ti->stopping, memory_order_relaxed);
	partial = l->sq_off ? l->sq_head : NULL;
	if (l->fd >= 0) {
		epoll_ctl(l->w->epfd, EPOLL_CTL_DEL, l->fd, NULL);
		tcp_sock_abort(l->fd);
	}
	l->fd = -1;
	l->state = TCP_LANE_DOWN;
	l->err_status = TE_OK;
	l->err_detail[0] = '\0';
	l->out_kick = false;
	l->peer_closed = false;
	l->refused = false;
	l->ctl_len = l->ctl_off = 0;
	l->hs = TCP_HS_HELLO;
	l->sq_head = l->sq_tail = NULL;
	l->sq_off = 0;
	for (uint32_t id = 0; id < ti->max_inflight; id++) {
		struct tcp_slot *slot = &l->slots[id];
		struct te_plugin_slice *s = slot->slice;
		bool on_wire, canceled;

		if (!(slot->flags & TCP_SLOT_USED))
			continue;
		on_wire = slot->op == TCP_OP_WRITE && !(slot->flags & TCP_SLOT_ANSWERED) &&
			  ((slot->flags & TCP_SLOT_SENT) || (s && s == partial));
		canceled = (slot->flags & TCP_SLOT_CANCELED) != 0;
		tcp_slot_free_locked(l, id);
		if (!s)
			continue; /* orphan: already reported */
		n++;
		tcp_priv(s)->status = canceled ? TE_ERR_CANCELED : rst;
		snprintf(tcp_priv(s)->detail, TCP_PRIV_DETAIL, "%s",
			 canceled ? TCP_NAME ": canceled while in flight" : why);
		if (on_wire && !gone && now < s->deadline_ns) {
			tcp_fence_add_locked(l, s);
			fenced++;
		} else {
			tcp_rlist_add(&now_list, s);
		}
	}
	if (fenced && !closed_by_peer)
		l->fence_unclosed = true;
	tcp_fence_take_locked(l, gone, now, &now_list);
	l->rx.pos = l->rx.end = 0;
	l->rx.payload = false;
	l->rx.left = 0;
	l->rx.dst = NULL;
	l->rx.bulk = false;
	l->stall_ticks = 0;
	if (l->n_fence && now - l->fence_connect_ns >= TCP_TICK_MS * 1000000ull) {
		l->fence_connect_ns = now;
		tcp_lane_connect_locked(ti, l);
		reconnect = l->state == TCP_LANE_BROKEN;
	}
	pthread_mutex_unlock(&l->lock);

	if (n || rst != TE_ERR_CANCELED)
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"lane %u to %s closed, %u request(s) failed (%u wait for the server's "
			"fence): %s",
			l->index, l->peer->name, n, fenced, why);
	tcp_rlist_report(ti, &now_list);
	if (reconnect)
		tcp_kick_lane(l); /* the connect failed at once: break again (no fence yet) */
}

/* --- initiator side: sending ---------------------------------------------------------- */

/* Bytes of @s's request frame on the wire. */
static uint64_t tcp_frame_len(const struct te_plugin_slice *s)
{
	return TCP_HDR_LEN + (s->opcode == TE_PLUGIN_OP_WRITE ? s->length : 0);
}

/*
 * Account @sent bytes of the gathered queue prefix. Slots whose request is now complete
 * become SENT; those that can finish are collected into @rep. Under lane lock.
 */
static uint32_t tcp_lane_advance_locked(struct tcp_lane *l, uint64_t sent,
					struct te_plugin_slice **rep)
{
	uint32_t n = 0;

	if (l->ctl_off < l->ctl_len) {
		uint64_t take = TCP_MIN(sent, (uint64_t)(l->ctl_len - l->ctl_off));

		l->ctl_off += (uint32_t)take;
		sent -= take;
		if (l->ctl_off == l->ctl_len)
			l->ctl_off = l->ctl_len = 0;
	}
	while (sent && l->sq_head) {
		struct te_plugin_slice *s = l->sq_head;
		struct tcp_spriv *p = tcp_priv(s);
		uint64_t rem = tcp_frame_len(s) - l->sq_off;
		uint32_t id = atomic_load_explicit(&p->slot, memory_order_relaxed);
		struct tcp_slot *slot = &l->slots[id];

		if (sent < rem) {
			l->sq_off += sent;
			break;
		}
		sent -= rem;
		l->sq_off = 0;
		l->sq_head = p->next;
		if (!l->sq_head)
			l->sq_tail = NULL;
		slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_IN_IOV) | TCP_SLOT_SENT);
		if (slot->flags & TCP_SLOT_ANSWERED)
			rep[n++] = tcp_slot_finish_locked(l, id);
		else if ((slot->flags & TCP_SLOT_CANCELED) && !(slot->flags & TCP_SLOT_RECV) &&
			 slot->op == TCP_OP_READ)
			rep[n++] = tcp_slot_orphan_locked(l, id); /* a WRITE waits for its fence */
	}
	/* Gathered but not (completely) sent: cancel may unqueue them again. */
	for (struct te_plugin_slice *s = l->sq_head; s; s = tcp_priv(s)->next) {
		struct tcp_slot *slot =
			&l->slots[atomic_load_explicit(&tcp_priv(s)->slot, memory_order_relaxed)];

		if (!(slot->flags & TCP_SLOT_IN_IOV))
			break;
		slot->flags &= (uint16_t)~TCP_SLOT_IN_IOV;
	}
	return n;
}

/* Whether @l has bytes to send: handshake frames, or requests once the HELLO was answered. */
static bool tcp_lane_has_output_locked(const struct tcp_lane *l)
{
	return l->ctl_off < l->ctl_len || (l->hs != TCP_HS_HELLO && l->sq_head);
}

/*
 * The request deadline field of @s on @l: milliseconds from the connection's base (when its
 * HELLO answer arrived here), rounded down. The server counts them from when it built that
 * answer, which is earlier in real time, so the server's deadline falls at or before the
 * slice's: a WRITE byte it takes in before its deadline was taken in before the slice's.
 */
static uint32_t tcp_deadline_field(const struct tcp_lane *l, const struct te_plugin_slice *s)
{
	uint64_t ms;

	if (!s->deadline_ns || s->deadline_ns == UINT64_MAX)
		return TCP_NO_DEADLINE;
	if (s->deadline_ns <= l->base_ns)
		return 0;
	ms = (s->deadline_ns - l->base_ns) / 1000000u;
	return ms >= TCP_NO_DEADLINE ? TCP_NO_DEADLINE - 1 : (uint32_t)ms;
}

/*
 * Send what is queued on @l until the queue is empty or the socket is full. Any thread; one
 * sender at a time (l->sending), others leave their requests to it. The socket stays open
 * while l->sending is set because only the worker closes it, and only when nobody sends.
 */
static void tcp_lane_flush(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct iovec iov[TCP_LANE_IOV];
	struct te_plugin_slice *rep[TCP_LANE_IOV];
	bool kick;

	pthread_mutex_lock(&l->lock);
	if (l->sending) {
		/* The active sender goes around once more. */
		l->out_kick = true;
		pthread_mutex_unlock(&l->lock);
		return;
	}
	if (l->state != TCP_LANE_UP || !tcp_lane_has_output_locked(l)) {
		pthread_mutex_unlock(&l->lock);
		return;
	}
	l->sending = true;
	while (l->state == TCP_LANE_UP && tcp_lane_has_output_locked(l)) {
		struct msghdr msg = { .msg_iov = iov };
		uint64_t off = l->sq_off;
		uint32_t n_iov = 0, n_rep;
		int fd = l->fd, err;
		ssize_t r;

		l->out_kick = false;
		if (l->ctl_off < l->ctl_len)
			iov[n_iov++] =
				(struct iovec){ l->ctl + l->ctl_off, l->ctl_len - l->ctl_off };
		for (struct te_plugin_slice *s = l->hs != TCP_HS_HELLO ? l->sq_head : NULL;
		     s && n_iov + 2 <= TCP_LANE_IOV; s = tcp_priv(s)->next) {
			struct tcp_spriv *p = tcp_priv(s);
			uint32_t id = atomic_load_explicit(&p->slot, memory_order_relaxed);

			l->slots[id].flags |= TCP_SLOT_IN_IOV;
			/* Stamped while no byte of the frame left (again, to the same value). */
			if (off == 0)
				tcp_put_u32(p->hdr + 12, tcp_deadline_field(l, s));
			if (off < TCP_HDR_LEN)
				iov[n_iov++] = (struct iovec){ p->hdr + off, TCP_HDR_LEN - off };
			if (s->opcode == TE_PLUGIN_OP_WRITE) {
				uint64_t skip = off > TCP_HDR_LEN ? off - TCP_HDR_LEN : 0;

				iov[n_iov++] = (struct iovec){ (uint8_t *)s->local + skip,
							       s->length - skip };
			}
			off = 0;
		}
		msg.msg_iovlen = n_iov;
		pthread_mutex_unlock(&l->lock);
		r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		err = errno;
		pthread_mutex_lock(&l->lock);
		if (r > 0)
			atomic_fetch_add_explicit(&l->progress, (uint64_t)r, memory_order_relaxed);
		n_rep = tcp_lane_advance_locked(l, r > 0 ? (uint64_t)r : 0, rep);
		if (n_rep) {
			pthread_mutex_unlock(&l->lock);
			for (uint32_t i = 0; i < n_rep; i++)
				tcp_report_priv(ti, rep[i]);
			pthread_mutex_lock(&l->lock);
		}
		if (r >= 0 || err == EINTR)
			continue;
		if (err == EAGAIN || err == EWOULDBLOCK) {
			/* Writable again meanwhile? Then the edge is gone: try once more. */
			if (l->out_kick)
				continue;
			break;
		}
		if (err == EPIPE || err == ECONNRESET)
			l->peer_closed = true;
		tcp_lane_fail_locked(l, TE_ERR_CONN_RESET,
				     TCP_NAME ": send to %s (%s) lane %u failed: %s", l->peer->name,
				     l->peer->addr_text, l->index, strerror(err));
	}
	l->sending = false;
	kick = l->state == TCP_LANE_BROKEN;
	pthread_mutex_unlock(&l->lock);
	if (kick)
		tcp_kick_lane(l);
}

static void tcp_sock_tune(const struct tcp_inst *ti, int fd)
{
	int one = 1, sz = (int)ti->sockbuf;

	/* Requests are small and latency-bound: never wait for Nagle. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (sz) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	}
}

/*
 * Open @l's socket and start connecting, with a HELLO queued: the next epoch of this lane, a
 * fresh client nonce. Under lane lock; the lane is DOWN.
 */
static void tcp_lane_connect_locked(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_peer *peer = l->peer;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
				  .data.ptr = &l->ep };
	uint8_t *b = l->ctl + TCP_HDR_LEN;
	int fd;

	l->err_status = TE_OK;
	l->err_detail[0] = '\0';
	l->connect_start_ns = tcp_now_ns();
	l->refused = false;
	l->peer_closed = false;
	l->hs = TCP_HS_HELLO;
	l->epoch++;
	if (!tcp_random(l->nonce_c, TCP_NONCE)) {
		l->state = TCP_LANE_CONNECTING; /* so that fail records the reason */
		tcp_lane_fail_locked(l, TE_ERR_SYSTEM, TCP_NAME ": no random bytes for a nonce: %s",
				     strerror(errno));
		return;
	}
	tcp_encode(l->ctl, TCP_OP_HELLO, 0, 0, peer->nonce, TCP_HELLO_REQ);
	tcp_put_u64(b, peer->cid);
	tcp_put_u64(b + 8, l->epoch);
	tcp_put_u32(b + 16, l->index);
	tcp_put_u32(b + 20, ti->auth ? TCP_HELLO_SECRET : 0);
	memcpy(b + 24, l->nonce_c, TCP_NONCE);
	l->ctl_len = TCP_HDR_LEN + TCP_HELLO_REQ;
	l->ctl_off = 0;
	fd = socket(peer->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		l->state = TCP_LANE_CONNECTING; /* so that fail records the reason */
		tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
				     TCP_NAME ": cannot create a socket for %s: %s", peer->name,
				     strerror(errno));
		return;
	}
	tcp_sock_tune(ti, fd);
	l->fd = fd;
	if (connect(fd, (const struct sockaddr *)&peer->sa, peer->salen) == 0) {
		l->state = TCP_LANE_UP;
	} else if (errno == EINPROGRESS) {
		l->state = TCP_LANE_CONNECTING;
	} else {
		l->state = TCP_LANE_CONNECTING;
		l->refused = errno == ECONNREFUSED;
		tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
				     TCP_NAME ": connect to %s (%s) failed: %s", peer->name,
				     peer->addr_text, strerror(errno));
		return;
	}
	if (epoll_ctl(l->w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
		tcp_lane_fail_locked(l, TE_ERR_SYSTEM, TCP_NAME ": epoll_ctl for %s: %s",
				     peer->name, strerror(errno));
}

/* --- initiator side: receiving ------------------------------------------------------ */

/*
 * One readv on @fd. With a payload in progress: into its destination (or @scratch when it
 * is discarded) and at most one header beyond it into the buffer. Otherwise into the
 * buffer: exactly @need bytes, or all the room when the stream is in bulk mode. Returns the
 * byte count, 0 at end of stream, -errno on error.
 */
static ssize_t tcp_rx_read(int fd, struct tcp_rx *rx, uint8_t *scratch, size_t need)
{
	struct iovec iov[2];
	uint64_t take = 0;
	int n = 0;
	ssize_t r;

	if (rx->pos == rx->end) {
		rx->pos = rx->end = 0;
	} else if (TCP_RBUF - rx->end < TCP_HDR_LEN + TCP_DETAIL_WIRE) {
		memmove(rx->buf, rx->buf + rx->pos, rx->end - rx->pos);
		rx->end -= rx->pos;
		rx->pos = 0;
	}
	if (rx->payload) {
		take = rx->left;
		if (!rx->dst && take > TCP_SCRATCH)
			take = TCP_SCRATCH;
		if (rx->dst && rx->room && take > rx->room)
			take = rx->room;
		iov[n++] = (struct iovec){ rx->dst ? rx->dst : scratch, take };
		/* The next header only once the payload's end is within reach. */
		if (take == rx->left)
			iov[n++] = (struct iovec){ rx->buf + rx->end, TCP_HDR_LEN };
	} else {
		size_t room = TCP_RBUF - rx->end;

		iov[n++] =
			(struct iovec){ rx->buf + rx->end, rx->bulk ? room : TCP_MIN(need, room) };
	}
	do
		r = readv(fd, iov, n);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (rx->payload) {
		uint64_t got = TCP_MIN((uint64_t)r, take);

		if (rx->dst)
			rx->dst += got;
		if (rx->dst && rx->room)
			rx->room -= got;
		rx->left -= got;
		rx->end += (uint32_t)((uint64_t)r - got);
	} else {
		rx->end += (uint32_t)r;
	}
	return r;
}

/* Move buffered bytes that belong to the payload just announced into its destination. */
static void tcp_rx_prefix(struct tcp_rx *rx)
{
	uint64_t c = TCP_MIN((uint64_t)(rx->end - rx->pos), rx->left);

	if (!c)
		return;
	if (rx->dst) {
		memcpy(rx->dst, rx->buf + rx->pos, c);
		rx->dst += c;
	}
	rx->pos += (uint32_t)c;
	rx->left -= c;
}

/* Buffered bytes of the READ payload just announced, unless its slice was canceled. */
static void tcp_lane_prefix(struct tcp_lane *l)
{
	if (l->rx.end == l->rx.pos || !l->rx.dst) {
		tcp_rx_prefix(&l->rx);
		return;
	}
	pthread_mutex_lock(&l->rx_lock);
	if (atomic_load_explicit(&l->rx_redirect, memory_order_relaxed))
		l->rx.dst = NULL;
	tcp_rx_prefix(&l->rx);
	pthread_mutex_unlock(&l->rx_lock);
}

/* The READ payload of slot l->rx_slot arrived completely. Worker only. */
static void tcp_lane_payload_done(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_slot *slot;
	struct te_plugin_slice *s = NULL;

	l->rx.payload = false;
	l->rx.dst = NULL;
	pthread_mutex_lock(&l->lock);
	slot = &l->slots[l->rx_slot];
	slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_RECV) | TCP_SLOT_ANSWERED);
	if (slot->flags & TCP_SLOT_SENT)
		s = tcp_slot_finish_locked(l, l->rx_slot);
	pthread_mutex_unlock(&l->lock);
	if (s)
		tcp_report_priv(ti, s);
}

enum tcp_parse {
	TCP_PARSE_MORE,	   /* need more bytes (*need says how many for exact reads) */
	TCP_PARSE_PAYLOAD, /* a payload is being received */
	TCP_PARSE_FAIL,	   /* the lane must break: *st and why say how */
	TCP_PARSE_NEXT,	   /* a frame was handled: go on */
};

/*
 * The answer to this connection's HELLO or AUTH. Worker only. The server proves the secret
 * in its HELLO answer before this side proves it (and before any request leaves); a READY
 * connection means the server fenced every older connection of this lane, so the WRITEs
 * waiting for that are reported here.
 */
static enum tcp_parse tcp_lane_handshake(struct tcp_inst *ti, struct tcp_lane *l,
					 const struct tcp_hdr *h, uint32_t avail, size_t *need,
					 enum te_status *st, char *why, size_t why_len)
{
	struct tcp_rx *rx = &l->rx;
	struct tcp_peer *peer = l->peer;
	uint8_t want = l->hs == TCP_HS_HELLO ? TCP_OP_HELLO : TCP_OP_AUTH;
	uint64_t ok_len = want == TCP_OP_HELLO ? TCP_HELLO_ANS : 0;
	struct tcp_rlist fenced = { 0 };
	const uint8_t *b;

	*st = TE_ERR_CONN_RESET;
	if (h->op != want || h->req_id != 0 || (h->status == TE_OK && h->length != ok_len) ||
	    (h->status != TE_OK &&
	     (h->status > -1 || h->status < -139 || h->length > TCP_DETAIL_WIRE))) {
		snprintf(why, why_len,
			 TCP_NAME ": protocol error from %s (%s): bad answer to %s (op %u, status "
				  "%" PRId32 ", %" PRIu64 " bytes)",
			 peer->name, peer->addr_text, want == TCP_OP_HELLO ? "HELLO" : "AUTH",
			 h->op, h->status, h->length);
		return TCP_PARSE_FAIL;
	}
	if (avail < TCP_HDR_LEN + h->length) {
		*need = TCP_HDR_LEN + (size_t)h->length - avail;
		return TCP_PARSE_MORE;
	}
	b = rx->buf + rx->pos + TCP_HDR_LEN;
	if (h->status != TE_OK || (want == TCP_OP_HELLO && h->addr != peer->nonce)) {
		char text[TCP_DETAIL_WIRE + 1];

		*st = h->status == TE_OK ? TE_ERR_PEER_RESTARTED : (enum te_status)h->status;
		tcp_copy_detail(text, sizeof(text), b, h->status == TE_OK ? 0 : (size_t)h->length);
		if (*st == TE_ERR_PEER_RESTARTED)
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) is another instance now (restarted; expected "
					  "instance %016" PRIx64 ")",
				 peer->name, peer->addr_text, peer->nonce);
		else
			snprintf(why, why_len, TCP_NAME ": %s (%s) refused the connection: %s",
				 peer->name, peer->addr_text, text);
		return TCP_PARSE_FAIL;
	}
	if (want == TCP_OP_HELLO && (tcp_get_u32(b) & TCP_HELLO_SECRET)) {
		uint8_t tr[TCP_TRANSCRIPT], mac[TE_PLUGIN_MAC_SIZE];

		*st = TE_ERR_AUTH;
		if (!ti->auth) {
			snprintf(why, why_len,
				 TCP_NAME
				 ": %s (%s) requires authentication on its data port; this "
				 "engine has no secret (auth.secret)",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		tcp_transcript(tr, true, peer->nonce, peer->cid, l->epoch, l->index, l->nonce_c,
			       b + 8);
		if (ti->host->auth_check(ti->ctx, tr, sizeof(tr), b + 8 + TCP_NONCE) != TE_OK) {
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) did not prove the shared secret on its data "
					  "port: refused",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		tcp_transcript(tr, false, peer->nonce, peer->cid, l->epoch, l->index, l->nonce_c,
			       b + 8);
		if (ti->host->auth_mac(ti->ctx, tr, sizeof(tr), mac) != TE_OK) {
			snprintf(why, why_len, TCP_NAME ": cannot compute the proof for %s (%s)",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		pthread_mutex_lock(&l->lock);
		/* Behind what is left of the HELLO (the answer may overtake the bookkeeping). */
		tcp_encode(l->ctl + l->ctl_len, TCP_OP_AUTH, 0, 0, 0, TE_PLUGIN_MAC_SIZE);
		memcpy(l->ctl + l->ctl_len + TCP_HDR_LEN, mac, sizeof(mac));
		l->ctl_len += TCP_HDR_LEN + TE_PLUGIN_MAC_SIZE;
		l->hs = TCP_HS_AUTH;
		l->base_ns = tcp_now_ns();
		pthread_mutex_unlock(&l->lock);
	} else {
		if (want == TCP_OP_HELLO && ti->auth) {
			*st = TE_ERR_AUTH;
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) serves its data port without authentication, "
					  "but this engine has a secret: refused",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		pthread_mutex_lock(&l->lock);
		if (want == TCP_OP_HELLO)
			l->base_ns = tcp_now_ns();
		l->hs = TCP_HS_READY;
		tcp_fence_take_locked(l, true, 0, &fenced);
		/* Its own instance answers again: a later restart is news again. */
		atomic_store_explicit(&peer->restarted, false, memory_order_relaxed);
		pthread_mutex_unlock(&l->lock);
	}
	rx->pos += TCP_HDR_LEN + (uint32_t)h->length;
	rx->bulk = true;
	l->rx_flush = true;
	tcp_rlist_report(ti, &fenced);
	return TCP_PARSE_NEXT;
}

/*
 * Handle every complete response in @l's buffer. Worker only. Validates each header
 * against the slot it names: a server cannot complete a request it was not sent, nor
 * deliver more bytes than were asked for.
 */
static enum tcp_parse tcp_lane_parse(struct tcp_inst *ti, struct tcp_lane *l, size_t *need,
				     enum te_status *st, char *why, size_t why_len)
{
	struct tcp_rx *rx = &l->rx;
	struct tcp_peer *peer = l->peer;
	struct tcp_hdr h;

	for (;;) {
		uint32_t avail = rx->end - rx->pos;
		struct te_plugin_slice *done = NULL;
		struct tcp_slot *slot;
		uint32_t id;

		if (avail < TCP_HDR_LEN) {
			*need = TCP_HDR_LEN - avail;
			return TCP_PARSE_MORE;
		}
		tcp_hdr_decode(rx->buf + rx->pos, &h);
		*st = TE_ERR_CONN_RESET;
		if (h.magic != TCP_WIRE_MAGIC || h.version != TCP_WIRE_VERSION || h.flags) {
			snprintf(why, why_len,
				 TCP_NAME ": protocol error from %s (%s): bad frame header (magic "
					  "0x%08" PRIx32 ", version %u)",
				 peer->name, peer->addr_text, h.magic, h.version);
			return TCP_PARSE_FAIL;
		}
		/* hs changes only on this thread while the lane is UP. */
		if (l->hs != TCP_HS_READY) {
			enum tcp_parse r =
				tcp_lane_handshake(ti, l, &h, avail, need, st, why, why_len);

			if (r != TCP_PARSE_NEXT)
				return r;
			continue;
		}
		id = h.req_id & 0xffffu;
		if ((h.op != TCP_OP_READ && h.op != TCP_OP_WRITE) || id >= ti->max_inflight)
			goto bad_id;
		if (h.status != TE_OK) {
			/* Errors carry a short detail; wait until it is all here. */
			if (h.status > -1 || h.status < -139 || h.length > TCP_DETAIL_WIRE) {
				snprintf(why, why_len,
					 TCP_NAME ": protocol error from %s (%s): bad error frame "
						  "(status %" PRId32 ", %" PRIu64 " bytes)",
					 peer->name, peer->addr_text, h.status, h.length);
				return TCP_PARSE_FAIL;
			}
			if (avail < TCP_HDR_LEN + h.length) {
				*need = TCP_HDR_LEN + (size_t)h.length - avail;
				return TCP_PARSE_MORE;
			}
		}
		pthread_mutex_lock(&l->lock);
		slot = &l->slots[id];
		/* An answer may overtake the sender's bookkeeping (IN_IOV), not the request. */
		if (!(slot->flags & TCP_SLOT_USED) || slot->gen != (uint16_t)(h.req_id >> 16) ||
		    slot->op != h.op || !(slot->flags & (TCP_SLOT_SENT | TCP_SLOT_IN_IOV)) ||
		    (slot->flags & (TCP_SLOT_ANSWERED | TCP_SLOT_RECV)) ||
		    (h.status == TE_OK && h.length != (h.op == TCP_OP_READ ? slot->length : 0))) {
			pthread_mutex_unlock(&l->lock);
			goto bad_id;
		}
		if (h.status == TE_OK && h.op == TCP_OP_READ) {
			/* Orphans (canceled and reported) are drained, never written to. */
			slot->flags |= TCP_SLOT_RECV;
			rx->dst = slot->slice ? (uint8_t *)slot->slice->local : NULL;
			/* relaxed: written and read under l->lock or l->rx_lock */
			atomic_store_explicit(&l->rx_redirect, false, memory_order_relaxed);
			pthread_mutex_unlock(&l->lock);
			rx->pos += TCP_HDR_LEN;
			rx->payload = true;
			rx->left = h.length;
			rx->bulk = false;
			l->rx_slot = id;
			tcp_lane_prefix(l);
			if (rx->left)
				return TCP_PARSE_PAYLOAD;
			tcp_lane_payload_done(ti, l);
			continue;
		}
		if (h.status != TE_OK && slot->slice) {
			struct tcp_spriv *p = tcp_priv(slot->slice);

			p->status = h.status;
			tcp_copy_detail(p->detail, sizeof(p->detail),
					rx->buf + rx->pos + TCP_HDR_LEN, (size_t)h.length);
		}
		slot->flags |= TCP_SLOT_ANSWERED;
		if (slot->flags & TCP_SLOT_SENT)
			done = tcp_slot_finish_locked(l, id);
		pthread_mutex_unlock(&l->lock);
		rx->pos += TCP_HDR_LEN + (uint32_t)(h.status != TE_OK ? h.length : 0);
		rx->bulk = true;
		if (done)
			tcp_report_priv(ti, done);
	}

bad_id:
	snprintf(why, why_len,
		 TCP_NAME
		 ": protocol error from %s (%s): unexpected response (op %u, id 0x%08" PRIx32
		 ", status %" PRId32 ", %" PRIu64 " bytes)",
		 peer->name, peer->addr_text, h.op, h.req_id, h.status, h.length);
	return TCP_PARSE_FAIL;
}

/* Read and handle responses on @l until its socket is drained. Worker only. */
static void tcp_lane_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l)
{
	uint64_t budget = TCP_RX_BUDGET;
	enum te_status st = TE_ERR_CONN_RESET;
	char why[TCP_PRIV_DETAIL];
	struct tcp_peer *peer = l->peer;
	int fd;

	pthread_mutex_lock(&l->lock);
	fd = l->state == TCP_LANE_UP ? l->fd : -1;
	pthread_mutex_unlock(&l->lock);
	/* Only this thread closes the socket, so fd stays valid for the whole loop. */
	if (fd < 0)
		return;
	for (;;) {
		size_t need = TCP_HDR_LEN;
		ssize_t r;

		if (!l->rx.payload &&
		    tcp_lane_parse(ti, l, &need, &st, why, sizeof(why)) == TCP_PARSE_FAIL)
			goto fail;
		if (l->rx_flush) {
			/* The handshake advanced: its AUTH, or requests that waited for it. */
			l->rx_flush = false;
			tcp_lane_flush(ti, l);
		}
		if (budget == 0) {
			tcp_again_add(w, &l->ep);
			return;
		}
		if (l->rx.payload && l->rx.dst) {
			pthread_mutex_lock(&l->rx_lock);
			if (atomic_load_explicit(&l->rx_redirect, memory_order_relaxed))
				l->rx.dst = NULL;
			r = tcp_rx_read(fd, &l->rx, w->scratch, need);
			pthread_mutex_unlock(&l->rx_lock);
		} else {
			r = tcp_rx_read(fd, &l->rx, w->scratch, need);
		}
		if (r == -EAGAIN || r == -EWOULDBLOCK)
			return;
		if (r <= 0) {
			st = TE_ERR_CONN_RESET;
			if (r == 0 || r == -ECONNRESET) {
				/* The server's side ended: it applies nothing more from it. */
				pthread_mutex_lock(&l->lock);
				l->peer_closed = true;
				pthread_mutex_unlock(&l->lock);
			}
			if (r == 0)
				snprintf(why, sizeof(why),
					 TCP_NAME
					 ": connection to %s (%s) lane %u closed by the peer",
					 peer->name, peer->addr_text, l->index);
			else
				snprintf(why, sizeof(why),
					 TCP_NAME ": receive from %s (%s) lane %u failed: %s",
					 peer->name, peer->addr_text, l->index, strerror((int)-r));
			goto fail;
		}
		atomic_fetch_add_explicit(&l->progress, (uint64_t)r, memory_order_relaxed);
		budget -= TCP_MIN(budget, (uint64_t)r);
		if (l->rx.payload && l->rx.left == 0)
			tcp_lane_payload_done(ti, l);
	}

fail:
	if (st == TE_ERR_PEER_RESTARTED &&
	    (atomic_store_explicit(&peer->restarted_until_ns,
				   tcp_now_ns() + TCP_RESTART_HOLD_MS * 1000000ull,
				   memory_order_relaxed),
	     !atomic_exchange_explicit(&peer->restarted, true, memory_order_relaxed))) {
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s", why + strlen(TCP_NAME ": "));
		if (ti->host->peer_event)
			ti->host->peer_event(ti->ctx, (struct te_plugin_peer *)peer,
					     TE_PLUGIN_EVENT_DOWN, why);
	}
	tcp_lane_break(ti, l, st, why);
}

static void tcp_lane_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l,
			   uint32_t events)
{
	enum tcp_lane_state state;

	pthread_mutex_lock(&l->lock);
	if (l->state == TCP_LANE_CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		struct sockaddr_storage sa;
		socklen_t salen = sizeof(sa), len = sizeof(int);
		int err = 0;

		if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
			err = errno;
		if (err) {
			l->refused = err == ECONNREFUSED;
			tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
					     TCP_NAME ": connect to %s (%s) failed: %s",
					     l->peer->name, l->peer->addr_text, strerror(err));
		} else if (getpeername(l->fd, (struct sockaddr *)&sa, &salen) == 0)
			l->state = TCP_LANE_UP;
		/* else: an event of an earlier socket of this lane; still connecting */
	}
	state = l->state;
	pthread_mutex_unlock(&l->lock);

	if (state == TCP_LANE_BROKEN) {
		tcp_lane_break(ti, l, TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
		return;
	}
	if (state != TCP_LANE_UP)
		return;
	if (events & EPOLLOUT)
		tcp_lane_flush(ti, l);
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		tcp_lane_rx(ti, w, l);
}

/* --- serving side ------------------------------------------------------------------- */

static void tcp_conn_free(struct tcp_conn *c)
{
	free(c->rx.buf);
	free(c->ring);
	free(c->rx_stage);
	free(c->tx_stage);
	free(c);
}

static void tcp_conn_close(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
			   enum te_plugin_log_level level, const char *why)
{
	if (why)
		tcp_log(ti, level, "closing connection from %s: %s", c->who, why);
	/* Also leaves the epoll set: the descriptor is never duplicated. */
	if (c->abort)
		tcp_sock_abort(c->fd);
	else
		close(c->fd);
	pthread_mutex_lock(&w->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		w->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	w->n_conns--;
	pthread_mutex_unlock(&w->lock);
	/* relaxed: counters for the accept limits only */
	atomic_fetch_sub_explicit(&ti->n_conns, 1, memory_order_relaxed);
	if (c->hs != TCP_CHS_READY)
		atomic_fetch_sub_explicit(&ti->n_unauth, 1, memory_order_relaxed);
	tcp_again_remove(w, &c->ep);
	tcp_conn_free(c);
}

static struct tcp_resp *tcp_conn_reserve(struct tcp_conn *c, uint32_t *index_out)
{
	uint32_t i = (c->head + c->count) % TCP_SRV_RING;
	struct tcp_resp *e = &c->ring[i];

	c->count++;
	e->payload = NULL;
	e->len = 0;
	e->ready = true;
	e->memory = false;
	e->staged = false;
	if (index_out)
		*index_out = i;
	return e;
}

static void tcp_resp_error(struct tcp_resp *e, uint8_t op, uint32_t req_id, enum te_status st,
			   const char *detail)
{
	size_t n = strnlen(detail, TCP_DETAIL_WIRE);

	memcpy(e->detail, detail, n);
	tcp_encode(e->hdr, op, req_id, st, 0, n);
	e->payload = (const uint8_t *)e->detail;
	e->len = n;
	e->memory = false;
	e->staged = false;
}

/*
 * Under reg_lock (read), before any byte of the current WRITE reaches registered memory:
 * stop receiving into memory when the connection was fenced (a newer connection of its lane
 * took over), when the request's deadline passed (its client reports it from then on), or
 * when its destination was deregistered; the rest is discarded and the answer is an error.
 * The fence and deregistration take the write lock, so no receive straddles them.
 */
static void tcp_conn_recheck_locked(struct tcp_inst *ti, struct tcp_conn *c)
{
	uint64_t ver = atomic_load_explicit(&ti->reg_ver, memory_order_relaxed);
	struct tcp_resp *e = &c->ring[c->cur];
	char detail[TCP_DETAIL_WIRE];

	if (!c->rx.dst)
		return;
	/* relaxed: set under the write lock this thread's read lock is ordered after */
	if (atomic_load_explicit(&c->fenced, memory_order_relaxed)) {
		c->rx.dst = NULL;
		tcp_resp_error(e, TCP_OP_WRITE, tcp_get_u32(e->hdr + 8), TE_ERR_CONN_RESET,
			       TCP_NAME ": connection replaced by a newer one of its lane");
		return;
	}
	if (c->cur_deadline != UINT64_MAX && tcp_now_ns() >= c->cur_deadline) {
		snprintf(detail, sizeof(detail),
			 TCP_NAME ": WRITE [0x%" PRIx64 ", +%" PRIu64
				  ") passed its deadline after %" PRIu64
				  " bytes; the rest was discarded",
			 c->cur_addr, c->cur_len, c->cur_len - c->rx.left);
		c->rx.dst = NULL;
		tcp_resp_error(e, TCP_OP_WRITE, tcp_get_u32(e->hdr + 8), TE_ERR_TIMEOUT, detail);
		return;
	}
	if (ver == c->cur_ver)
		return;
	/* Staged: what is still to land starts at stage_dev, not in the staging buffer. */
	if (tcp_region_allows(ti, c->cur_staged ? c->stage_dev : (uint64_t)(uintptr_t)c->rx.dst,
			      c->cur_staged ? c->rx_fill + c->rx.left : c->rx.left,
			      TE_PLUGIN_ACCESS_REMOTE_WRITE)) {
		c->cur_ver = ver;
		return;
	}
	c->rx.dst = NULL;
	tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_WRITE, c->cur_addr, c->cur_len,
			  " (deregistered during the transfer)");
	tcp_resp_error(e, TCP_OP_WRITE, tcp_get_u32(e->hdr + 8), TE_ERR_REMOTE_ACCESS, detail);
}

/*
 * A staged WRITE: the bytes in the staging buffer land in GPU memory now, through the host's
 * mem_copy (the plugin that owns the kind), under the same checks as a receive into host
 * memory (fence, deadline, region still there). A failed copy answers the WRITE with the
 * driver's reason and discards the rest.
 */
static void tcp_conn_stage_flush(struct tcp_inst *ti, struct tcp_conn *c)
{
	struct tcp_resp *e = &c->ring[c->cur];

	if (!c->rx_fill || !c->rx.dst) {
		c->rx_fill = 0;
		return;
	}
	pthread_rwlock_rdlock(&ti->reg_lock);
	tcp_conn_recheck_locked(ti, c);
	if (c->rx.dst) {
		enum te_status st = ti->host->mem_copy(ti->ctx, (void *)(uintptr_t)c->stage_dev,
						       c->rx_stage, c->rx_fill, c->cur_type,
						       c->cur_dev, TE_PLUGIN_COPY_FROM_HOST);

		if (st == TE_OK) {
			c->stage_dev += c->rx_fill;
		} else {
			char detail[TCP_DETAIL_WIRE], kind[24];

			tcp_kind_text(kind, sizeof(kind), c->cur_type, c->cur_dev);
			snprintf(detail, sizeof(detail),
				 TCP_NAME ": WRITE [0x%" PRIx64 ", +%" PRIu64
					  ") into %s: the staging copy failed (status %d)",
				 c->cur_addr, c->cur_len, kind, (int)st);
			c->rx.dst = NULL;
			tcp_resp_error(e, TCP_OP_WRITE, tcp_get_u32(e->hdr + 8), st, detail);
		}
	}
	pthread_rwlock_unlock(&ti->reg_lock);
	c->rx_fill = 0;
	if (c->rx.dst) {
		c->rx.dst = c->rx_stage;
		c->rx.room = TCP_STAGE;
	}
}

/* After a read into the staging buffer: flush it when full or when the payload is all in. */
static void tcp_conn_staged_read(struct tcp_inst *ti, struct tcp_conn *c, const uint8_t *before)
{
	if (!c->rx.dst)
		return;
	c->rx_fill += (uint64_t)(c->rx.dst - before);
	if (c->rx.room == 0 || c->rx.left == 0)
		tcp_conn_stage_flush(ti, c);
}

static void tcp_conn_payload_done(struct tcp_inst *ti, struct tcp_conn *c)
{
	if (c->cur_staged)
		tcp_conn_stage_flush(ti, c);
	c->rx.payload = false;
	c->rx.dst = NULL;
	c->rx.room = 0;
	c->cur_staged = false;
	c->ring[c->cur].ready = true;
	c->frames++;
}

/* Copy buffered bytes of the WRITE just announced; registered memory only under the lock. */
static void tcp_conn_prefix(struct tcp_inst *ti, struct tcp_conn *c)
{
	if (c->rx.end == c->rx.pos)
		return;
	if (!c->rx.dst) {
		tcp_rx_prefix(&c->rx);
		return;
	}
	if (c->cur_staged) {
		/* Into the staging buffer, which is flushed whenever it fills. */
		while (c->rx.dst && c->rx.end > c->rx.pos && c->rx.left) {
			uint64_t n = TCP_MIN(TCP_MIN((uint64_t)(c->rx.end - c->rx.pos), c->rx.left),
					     c->rx.room);

			memcpy(c->rx.dst, c->rx.buf + c->rx.pos, n);
			c->rx.dst += n;
			c->rx.pos += (uint32_t)n;
			c->rx.left -= n;
			c->rx.room -= n;
			c->rx_fill += n;
			if (!c->rx.room || !c->rx.left)
				tcp_conn_stage_flush(ti, c);
		}
		if (!c->rx.dst)
			tcp_rx_prefix(&c->rx); /* discarded: drop the rest of what is buffered */
		return;
	}
	pthread_rwlock_rdlock(&ti->reg_lock);
	tcp_conn_recheck_locked(ti, c);
	tcp_rx_prefix(&c->rx);
	pthread_rwlock_unlock(&ti->reg_lock);
}

enum tcp_srv {
	TCP_SRV_MORE,	 /* need more bytes */
	TCP_SRV_PAYLOAD, /* a WRITE payload is being received */
	TCP_SRV_FULL,	 /* the response ring is full */
	TCP_SRV_CLOSE,	 /* malformed input: close the connection */
	TCP_SRV_NEXT,	 /* a handshake frame was handled: go on */
};

/* Queue a handshake answer: one header and @len body bytes, sent before any response. */
static void tcp_conn_ctl(struct tcp_conn *c, uint8_t op, int32_t status, uint64_t addr,
			 const void *body, uint32_t len)
{
	uint8_t *p = c->ctl + c->ctl_len;

	/* Callers queue at most one HELLO answer (104 bytes) and one refusal (232). */
	if (c->ctl_len + TCP_HDR_LEN + len > TCP_CTL)
		return;
	tcp_encode(p, op, 0, status, addr, len);
	if (len)
		memcpy(p + TCP_HDR_LEN, body, len);
	c->ctl_len += TCP_HDR_LEN + len;
}

/* Refuse @c with one error frame and close it once that is sent; nothing else is read. */
static void tcp_conn_refuse(struct tcp_conn *c, uint8_t op, enum te_status st, uint64_t addr,
			    const char *text)
{
	tcp_conn_ctl(c, op, st, addr, text, (uint32_t)strnlen(text, TCP_DETAIL_WIRE));
	c->closing = true;
}

/*
 * A frame that has no place before the connection is authenticated. With a secret every such
 * frame gets the same generic refusal, whatever it asked (no range check, no oracle); without
 * one it is a protocol error that closes the connection.
 */
static enum tcp_srv tcp_conn_unauth(struct tcp_inst *ti, struct tcp_conn *c,
				    const struct tcp_hdr *h, char *why, size_t why_len,
				    const char *what)
{
	if (!ti->auth) {
		snprintf(why, why_len, "%s (op %u, %" PRIu64 " bytes)", what, h->op, h->length);
		return TCP_SRV_CLOSE;
	}
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s: %s (op %u): refused", c->who, what,
		h->op);
	tcp_conn_refuse(c, h->op <= TCP_OP_AUTH ? h->op : TCP_OP_HELLO, TE_ERR_AUTH, 0,
			TCP_NOT_AUTHED);
	return TCP_SRV_NEXT;
}

/*
 * Lane fencing. Record @c's (client id, lane, epoch) as the lane's newest, mark @c READY, and
 * stop every older READY connection of that lane from applying anything more: their flag is
 * set, then the region write lock waits for the serving syscall in progress, and every later
 * one re-checks (reg_ver) and finds the flag. false (nothing changed): a newer epoch of the
 * lane was seen already (*newest_out), so @c is a stale reconnect. Worker of @c.
 */
static bool tcp_fence(struct tcp_inst *ti, struct tcp_conn *c, uint64_t *newest_out)
{
	uint64_t now = tcp_now_ns();
	struct tcp_fence *f = NULL;
	uint32_t n_fenced = 0;

	pthread_mutex_lock(&ti->fence_lock);
	for (uint32_t i = 0; i < ti->n_fences; i++) {
		if (ti->fences[i].cid == c->cid && ti->fences[i].lane == c->lane) {
			f = &ti->fences[i];
			break;
		}
	}
	if (f && f->epoch >= c->epoch) {
		*newest_out = f->epoch;
		pthread_mutex_unlock(&ti->fence_lock);
		return false;
	}
	if (!f && ti->n_fences < TCP_FENCES) {
		f = &ti->fences[ti->n_fences++];
	} else if (!f) {
		/* Full: forget the lane used longest ago (its deadlines still protect it). */
		f = &ti->fences[0];
		for (uint32_t i = 1; i < ti->n_fences; i++)
			if (ti->fences[i].used_ns < f->used_ns)
				f = &ti->fences[i];
	}
	*f = (struct tcp_fence){
		.cid = c->cid, .epoch = c->epoch, .used_ns = now, .lane = c->lane
	};
	pthread_mutex_lock(&c->w->lock);
	c->hs = TCP_CHS_READY;
	pthread_mutex_unlock(&c->w->lock);
	atomic_fetch_sub_explicit(&ti->n_unauth, 1, memory_order_relaxed);
	for (uint32_t k = 0; k < ti->n_workers; k++) {
		struct tcp_worker *w = &ti->workers[k];

		pthread_mutex_lock(&w->lock);
		for (struct tcp_conn *o = w->conns; o; o = o->next) {
			if (o != c && o->hs == TCP_CHS_READY && o->cid == c->cid &&
			    o->lane == c->lane && o->epoch < c->epoch) {
				atomic_store_explicit(&o->fenced, true, memory_order_relaxed);
				n_fenced++;
			}
		}
		pthread_mutex_unlock(&w->lock);
	}
	if (n_fenced) {
		pthread_rwlock_wrlock(&ti->reg_lock);
		/* relaxed: readers load it under the read lock, which orders it */
		atomic_fetch_add_explicit(&ti->reg_ver, 1, memory_order_relaxed);
		pthread_rwlock_unlock(&ti->reg_lock);
		/* Their workers close them at the next tick; nothing of theirs lands meanwhile. */
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"connection from %s (lane %u, epoch %" PRIu64 ") fenced %u older one(s)",
			c->who, c->lane, c->epoch, n_fenced);
	}
	pthread_mutex_unlock(&ti->fence_lock);
	return true;
}

/* The client proved itself (or no secret is configured): fence, then serve. */
static enum tcp_srv tcp_conn_ready(struct tcp_inst *ti, struct tcp_conn *c, uint8_t op, char *why,
				   size_t why_len)
{
	uint8_t body[TCP_HELLO_ANS] = { 0 };
	uint64_t newest = 0;

	c->ring = calloc(TCP_SRV_RING, sizeof(*c->ring));
	if (!c->ring) {
		snprintf(why, why_len, "no memory for its response ring");
		return TCP_SRV_CLOSE;
	}
	if (!tcp_fence(ti, c, &newest)) {
		char text[TCP_DETAIL_WIRE];

		snprintf(text, sizeof(text),
			 TCP_NAME ": lane %u epoch %" PRIu64
				  " is older than the lane's newest (%" PRIu64 "): refused",
			 c->lane, c->epoch, newest);
		tcp_log(ti, TE_PLUGIN_LOG_INFO, "connection from %s: %s", c->who, text);
		tcp_conn_refuse(c, op, TE_ERR_CONN_RESET, 0, text);
		return TCP_SRV_NEXT;
	}
	c->active_ns = tcp_now_ns();
	c->rx.bulk = true;
	if (op == TCP_OP_HELLO)
		tcp_conn_ctl(c, TCP_OP_HELLO, TE_OK, ti->nonce, body, sizeof(body));
	else
		tcp_conn_ctl(c, TCP_OP_AUTH, TE_OK, 0, NULL, 0);
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s ready (lane %u, epoch %" PRIu64 ")%s",
		c->who, c->lane, c->epoch, ti->auth ? ", authenticated" : "");
	return TCP_SRV_NEXT;
}

/*
 * The client's HELLO, then (with a secret) its AUTH. Nothing is served before; frames are read
 * one at a time, exactly (no read-ahead), so an unauthenticated client costs the 8 KiB header
 * buffer at most.
 */
static enum tcp_srv tcp_conn_handshake(struct tcp_inst *ti, struct tcp_conn *c,
				       const struct tcp_hdr *h, uint32_t avail, size_t *need,
				       char *why, size_t why_len)
{
	struct tcp_rx *rx = &c->rx;
	uint8_t want = c->hs == TCP_CHS_HELLO ? TCP_OP_HELLO : TCP_OP_AUTH;
	uint64_t body_len = want == TCP_OP_HELLO ? TCP_HELLO_REQ : TE_PLUGIN_MAC_SIZE;
	uint8_t tr[TCP_TRANSCRIPT];
	const uint8_t *b;

	if (h->magic != TCP_WIRE_MAGIC || h->version != TCP_WIRE_VERSION || h->flags || h->status ||
	    h->req_id || h->op != want || h->length != body_len)
		return tcp_conn_unauth(ti, c, h, why, why_len,
				       want == TCP_OP_HELLO ? "first frame is not a valid HELLO"
							    : "expected AUTH");
	if (avail < TCP_HDR_LEN + body_len) {
		*need = TCP_HDR_LEN + (size_t)body_len - avail;
		return TCP_SRV_MORE;
	}
	b = rx->buf + rx->pos + TCP_HDR_LEN;
	rx->pos += TCP_HDR_LEN + (uint32_t)body_len;
	c->frames++;
	if (want == TCP_OP_AUTH) {
		tcp_transcript(tr, false, ti->nonce, c->cid, c->epoch, c->lane, c->nonce_c,
			       c->nonce_s);
		if (ti->host->auth_check(ti->ctx, tr, sizeof(tr), b) != TE_OK) {
			tcp_warn_limited(ti, c->w,
					 "connection from %s: wrong proof of the shared secret: "
					 "refused",
					 c->who);
			tcp_conn_refuse(c, TCP_OP_AUTH, TE_ERR_AUTH, 0, TCP_AUTH_FAILED);
			return TCP_SRV_NEXT;
		}
		return tcp_conn_ready(ti, c, TCP_OP_AUTH, why, why_len);
	}
	if (h->addr != ti->nonce) {
		/* Meant for an earlier instance at this address: run nothing. */
		tcp_log(ti, TE_PLUGIN_LOG_INFO,
			"connection from %s expects instance %016" PRIx64 ", this is %016" PRIx64
			": refused",
			c->who, h->addr, ti->nonce);
		tcp_conn_refuse(c, TCP_OP_HELLO, TE_ERR_PEER_RESTARTED, ti->auth ? 0 : ti->nonce,
				TCP_NAME ": another instance serves this address now (restarted)");
		return TCP_SRV_NEXT;
	}
	c->cid = tcp_get_u64(b);
	c->epoch = tcp_get_u64(b + 8);
	c->lane = tcp_get_u32(b + 16);
	memcpy(c->nonce_c, b + 24, TCP_NONCE);
	if (!c->cid || !c->epoch)
		return tcp_conn_unauth(ti, c, h, why, why_len,
				       "HELLO without a client id or epoch");
	c->base_ns = tcp_now_ns();
	if (ti->auth) {
		uint8_t body[TCP_HELLO_ANS] = { 0 };

		if (!tcp_random(c->nonce_s, TCP_NONCE)) {
			snprintf(why, why_len, "no random bytes for a nonce: %s", strerror(errno));
			return TCP_SRV_CLOSE;
		}
		tcp_transcript(tr, true, ti->nonce, c->cid, c->epoch, c->lane, c->nonce_c,
			       c->nonce_s);
		tcp_put_u32(body, TCP_HELLO_SECRET);
		memcpy(body + 8, c->nonce_s, TCP_NONCE);
		if (ti->host->auth_mac(ti->ctx, tr, sizeof(tr), body + 8 + TCP_NONCE) != TE_OK) {
			snprintf(why, why_len, "cannot compute the proof of the secret");
			return TCP_SRV_CLOSE;
		}
		tcp_conn_ctl(c, TCP_OP_HELLO, TE_OK, ti->nonce, body, sizeof(body));
		pthread_mutex_lock(&c->w->lock);
		c->hs = TCP_CHS_AUTH;
		pthread_mutex_unlock(&c->w->lock);
		return TCP_SRV_NEXT;
	}
	return tcp_conn_ready(ti, c, TCP_OP_HELLO, why, why_len);
}

/*
 * Handle every complete request in @c's buffer. Every header field is checked; anything
 * malformed closes this connection only. Requests for memory outside the registered,
 * remote-accessible regions are answered with TE_ERR_REMOTE_ACCESS (a WRITE's payload is
 * discarded).
 */
static enum tcp_srv tcp_conn_parse(struct tcp_inst *ti, struct tcp_conn *c, size_t *need, char *why,
				   size_t why_len)
{
	struct tcp_rx *rx = &c->rx;

	while (!c->closing) {
		uint32_t avail = rx->end - rx->pos, idx;
		char detail[TCP_DETAIL_WIRE];
		const struct tcp_region *reg;
		struct tcp_resp *e;
		struct tcp_hdr h;
		uint64_t ver;
		uint32_t need_access, stype = TE_PLUGIN_MEM_CPU;
		int32_t sdev = -1;
		bool ok, staged;

		if (avail < TCP_HDR_LEN) {
			*need = TCP_HDR_LEN - avail;
			return TCP_SRV_MORE;
		}
		tcp_hdr_decode(rx->buf + rx->pos, &h);
		if (c->hs != TCP_CHS_READY) {
			enum tcp_srv r = tcp_conn_handshake(ti, c, &h, avail, need, why, why_len);

			if (r != TCP_SRV_NEXT)
				return r;
			continue;
		}
		if (c->count == TCP_SRV_RING)
			return TCP_SRV_FULL;
		if (h.magic != TCP_WIRE_MAGIC || h.version != TCP_WIRE_VERSION || h.flags) {
			snprintf(why, why_len,
				 "bad frame header (magic 0x%08" PRIx32 ", version %u, flags 0x%x)",
				 h.magic, h.version, h.flags);
			return TCP_SRV_CLOSE;
		}
		if (h.op != TCP_OP_READ && h.op != TCP_OP_WRITE) {
			snprintf(why, why_len, "unexpected op %u", h.op);
			return TCP_SRV_CLOSE;
		}
		if (h.length == 0 || h.length > TCP_MAX_FRAME) {
			snprintf(why, why_len, "request length %" PRIu64 " outside [1, %llu]",
				 h.length, TCP_MAX_FRAME);
			return TCP_SRV_CLOSE;
		}
		need_access = h.op == TCP_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						  : TE_PLUGIN_ACCESS_REMOTE_WRITE;
		pthread_rwlock_rdlock(&ti->reg_lock);
		reg = tcp_region_find(ti, h.addr, h.length, need_access);
		ok = reg != NULL;
		staged = ok && reg->mem->mem_type != TE_PLUGIN_MEM_CPU;
		if (staged) {
			stype = reg->mem->mem_type;
			sdev = reg->mem->dev;
		}
		ver = atomic_load_explicit(&ti->reg_ver, memory_order_relaxed);
		pthread_rwlock_unlock(&ti->reg_lock);
		e = tcp_conn_reserve(c, &idx);
		e->addr = h.addr;
		/* GPU memory is reached through a staging buffer of this connection. */
		if (staged && !(h.op == TCP_OP_READ ? c->tx_stage : c->rx_stage)) {
			uint8_t *buf = malloc(TCP_STAGE);

			if (h.op == TCP_OP_READ)
				c->tx_stage = buf;
			else
				c->rx_stage = buf;
			if (!buf) {
				ok = false;
				snprintf(detail, sizeof(detail),
					 TCP_NAME ": no memory for a staging buffer");
				tcp_resp_error(e, h.op, h.req_id, TE_ERR_NOMEM, detail);
			}
		}
		if (!reg) {
			tcp_region_detail(ti, detail, sizeof(detail), h.op, h.addr, h.length, "");
			tcp_resp_error(e, h.op, h.req_id, TE_ERR_REMOTE_ACCESS, detail);
			tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "request from %s rejected: %s", c->who,
				detail);
		}
		rx->pos += TCP_HDR_LEN;
		if (h.op == TCP_OP_READ) {
			if (ok) {
				tcp_encode(e->hdr, TCP_OP_READ, h.req_id, TE_OK, 0, h.length);
				e->payload = (const uint8_t *)(uintptr_t)h.addr;
				e->len = h.length;
				e->memory = true;
				e->ver = ver;
				e->staged = staged;
				e->mem_type = stype;
				e->dev = sdev;
			}
			rx->bulk = true;
			c->frames++;
			continue;
		}
		if (ok)
			tcp_encode(e->hdr, TCP_OP_WRITE, h.req_id, TE_OK, 0, 0);
		e->ready = false;
		c->cur = idx;
		c->cur_ver = ver;
		c->cur_addr = h.addr;
		c->cur_len = h.length;
		/* Deadlines count from this side's clock when the HELLO answer was built. */
		c->cur_deadline = (uint32_t)h.status == TCP_NO_DEADLINE
					  ? UINT64_MAX
					  : c->base_ns + (uint64_t)(uint32_t)h.status * 1000000ull;
		rx->payload = true;
		c->cur_staged = ok && staged;
		c->cur_type = stype;
		c->cur_dev = sdev;
		c->rx_fill = 0;
		c->stage_dev = h.addr;
		rx->dst = !ok ? NULL : staged ? c->rx_stage : (uint8_t *)(uintptr_t)h.addr;
		rx->room = ok && staged ? TCP_STAGE : 0;
		rx->left = h.length;
		rx->bulk = false;
		tcp_conn_prefix(ti, c);
		if (rx->left)
			return TCP_SRV_PAYLOAD;
		tcp_conn_payload_done(ti, c);
	}
	return TCP_SRV_MORE;
}

/* Send queued handshake bytes. Returns false when @c was closed; *blocked when the socket is full. */
static bool tcp_conn_tx_ctl(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
			    bool *blocked)
{
	*blocked = false;
	while (c->ctl_off < c->ctl_len) {
		ssize_t r = send(c->fd, c->ctl + c->ctl_off, c->ctl_len - c->ctl_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			*blocked = true;
			return true;
		}
		if (r < 0) {
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(errno));
			return false;
		}
		c->ctl_off += (uint32_t)r;
	}
	c->ctl_off = c->ctl_len = 0;
	return true;
}

/*
 * The response at the ring's head is a READ of GPU memory: send its header and payload from
 * the connection's staging buffer, refilled (through host->mem_copy, under the region read
 * lock, after the same re-check as host memory gets) a chunk at a time. Returns -1 when @c
 * was closed, 0 when the socket is full, 1 after progress.
 */
static int tcp_conn_tx_staged(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	struct tcp_resp *e = &c->ring[c->head];
	uint64_t sent = c->tx_off > TCP_HDR_LEN ? c->tx_off - TCP_HDR_LEN : 0, skip;
	struct iovec iov[2];
	struct msghdr msg = { .msg_iov = iov };
	char detail[TCP_DETAIL_WIRE];
	ssize_t r;

	if (sent == c->txs_base + c->txs_len && sent < e->len) {
		uint64_t n = TCP_MIN((uint64_t)TCP_STAGE, e->len - sent);
		enum te_status st = TE_OK;
		bool there;

		pthread_rwlock_rdlock(&ti->reg_lock);
		there = tcp_region_allows(ti, e->addr + sent, e->len - sent,
					  TE_PLUGIN_ACCESS_REMOTE_READ);
		if (there)
			st = ti->host->mem_copy(ti->ctx, c->tx_stage,
						(const void *)(uintptr_t)(e->addr + sent), n,
						e->mem_type, e->dev, TE_PLUGIN_COPY_TO_HOST);
		pthread_rwlock_unlock(&ti->reg_lock);
		if (!there || st != TE_OK) {
			if (c->tx_off) {
				/* Half sent: the stream cannot be repaired. */
				tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO,
					       there ? "staging copy failed while being read"
						     : "buffer deregistered while being read");
				return -1;
			}
			if (!there) {
				tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_READ, e->addr,
						  e->len, " (deregistered before it was sent)");
				st = TE_ERR_REMOTE_ACCESS;
			} else {
				char kind[24];

				tcp_kind_text(kind, sizeof(kind), e->mem_type, e->dev);
				snprintf(detail, sizeof(detail),
					 TCP_NAME ": READ [0x%" PRIx64 ", +%" PRIu64
						  ") of %s: the staging copy failed (status %d)",
					 e->addr, e->len, kind, (int)st);
			}
			tcp_resp_error(e, TCP_OP_READ, tcp_get_u32(e->hdr + 8), st, detail);
			return 1;
		}
		c->txs_base = sent;
		c->txs_len = n;
	}
	skip = sent - c->txs_base;
	msg.msg_iovlen = 0;
	if (c->tx_off < TCP_HDR_LEN)
		iov[msg.msg_iovlen++] =
			(struct iovec){ e->hdr + c->tx_off, TCP_HDR_LEN - c->tx_off };
	iov[msg.msg_iovlen++] = (struct iovec){ c->tx_stage + skip, c->txs_len - skip };
	do
		r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (r < 0) {
		tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(errno));
		return -1;
	}
	c->tx_off += (uint64_t)r;
	if (c->tx_off == TCP_HDR_LEN + e->len) {
		c->tx_off = 0;
		c->txs_base = c->txs_len = 0;
		c->head = (c->head + 1) % TCP_SRV_RING;
		c->count--;
	}
	return 1;
}

/*
 * Send ready responses until the ring is empty or the socket is full. READ payloads go
 * from registered memory, re-checked and sent under the region read lock. Returns false
 * when @c was closed.
 */
static bool tcp_conn_tx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	struct iovec iov[TCP_SRV_IOV];
	bool blocked;

	if (!tcp_conn_tx_ctl(ti, w, c, &blocked))
		return false;
	if (blocked)
		return true;
	while (c->count && c->ring[c->head].ready) {
		struct msghdr msg = { .msg_iov = iov };
		uint32_t n_iov = 0, k, n_mem = 0;
		uint64_t off = c->tx_off;
		ssize_t r;
		int err;

		if (c->ring[c->head].staged) {
			int p = tcp_conn_tx_staged(ti, w, c);

			if (p < 0)
				return false;
			if (p == 0)
				break;
			continue;
		}
		for (k = 0; k < c->count && 2 * (k + 1) <= TCP_SRV_IOV; k++) {
			const struct tcp_resp *e = &c->ring[(c->head + k) % TCP_SRV_RING];

			/* A staged READ goes alone, from the staging buffer. */
			if (!e->ready || e->staged)
				break;
			n_mem += e->memory;
		}
		if (n_mem) {
			uint64_t ver;

			pthread_rwlock_rdlock(&ti->reg_lock);
			ver = atomic_load_explicit(&ti->reg_ver, memory_order_relaxed);
			for (uint32_t i = 0; i < k; i++) {
				struct tcp_resp *e = &c->ring[(c->head + i) % TCP_SRV_RING];
				char detail[TCP_DETAIL_WIRE];

				if (!e->memory || e->ver == ver)
					continue;
				if (tcp_region_allows(ti, e->addr, e->len,
						      TE_PLUGIN_ACCESS_REMOTE_READ)) {
					e->ver = ver;
					continue;
				}
				if (i == 0 && c->tx_off) {
					/* Half sent: the stream cannot be repaired. */
					pthread_rwlock_unlock(&ti->reg_lock);
					tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO,
						       "buffer deregistered while being read");
					return false;
				}
				tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_READ, e->addr,
						  e->len, " (deregistered before it was sent)");
				tcp_resp_error(e, TCP_OP_READ, tcp_get_u32(e->hdr + 8),
					       TE_ERR_REMOTE_ACCESS, detail);
			}
		}
		for (uint32_t i = 0; i < k; i++) {
			const struct tcp_resp *e = &c->ring[(c->head + i) % TCP_SRV_RING];

			if (off < TCP_HDR_LEN)
				iov[n_iov++] =
					(struct iovec){ (void *)(e->hdr + off), TCP_HDR_LEN - off };
			if (e->len) {
				uint64_t skip = off > TCP_HDR_LEN ? off - TCP_HDR_LEN : 0;

				iov[n_iov++] = (struct iovec){ (void *)(e->payload + skip),
							       e->len - skip };
			}
			off = 0;
		}
		msg.msg_iovlen = n_iov;
		r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		err = errno;
		if (n_mem)
			pthread_rwlock_unlock(&ti->reg_lock);
		if (r < 0) {
			if (err == EINTR)
				continue;
			if (err == EAGAIN || err == EWOULDBLOCK)
				break;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(err));
			return false;
		}
		for (uint64_t sent = (uint64_t)r; sent && c->count;) {
			const struct tcp_resp *e = &c->ring[c->head];
			uint64_t rem = TCP_HDR_LEN + e->len - c->tx_off;

			if (sent < rem) {
				c->tx_off += sent;
				break;
			}
			sent -= rem;
			c->tx_off = 0;
			c->head = (c->head + 1) % TCP_SRV_RING;
			c->count--;
		}
	}
	if (c->closing && c->count == 0) {
		tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, NULL);
		return false;
	}
	if (c->rx_paused && c->count < TCP_SRV_RING) {
		c->rx_paused = false;
		tcp_again_add(w, &c->ep);
	}
	return true;
}

/*
 * After a read: a frame still incomplete started when the last complete one ended (or in
 * this wake-up); frame_timeout_ms counts from there, however slowly its bytes trickle in.
 */
static void tcp_conn_frame_clock(struct tcp_conn *c, uint64_t frames_before)
{
	bool partial = c->rx.payload || c->rx.end != c->rx.pos;
	uint64_t now;

	if (!partial && c->frames == frames_before) {
		c->frame_start_ns = 0;
		return;
	}
	now = tcp_now_ns();
	if (c->frames != frames_before)
		c->active_ns = now;
	if (!partial)
		c->frame_start_ns = 0;
	else if (!c->frame_start_ns || c->frames != frames_before)
		c->frame_start_ns = now;
}

/* Read and serve requests on @c until its socket is drained. Returns false when closed. */
static bool tcp_conn_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	uint64_t budget = TCP_RX_BUDGET, frames_before = c->frames;
	char why[160];

	while (!c->closing && !c->rx_paused) {
		size_t need = TCP_HDR_LEN;
		ssize_t r;

		if (!c->rx.payload) {
			enum tcp_srv pr = tcp_conn_parse(ti, c, &need, why, sizeof(why));

			if (pr == TCP_SRV_CLOSE) {
				c->abort = true;
				tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO, why);
				return false;
			}
			if (pr == TCP_SRV_FULL) {
				c->rx_paused = true;
				break;
			}
			if (c->closing)
				break;
		}
		if (atomic_load_explicit(&c->fenced, memory_order_relaxed)) {
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG,
				       "replaced by a newer connection of its lane (fenced)");
			return false;
		}
		if (budget == 0) {
			tcp_again_add(w, &c->ep);
			break;
		}
		if (c->rx.payload && c->rx.dst && c->cur_staged) {
			/* Into this connection's staging buffer: checked when it is flushed. */
			const uint8_t *before = c->rx.dst;

			r = tcp_rx_read(c->fd, &c->rx, w->scratch, need);
			if (r > 0)
				tcp_conn_staged_read(ti, c, before);
		} else if (c->rx.payload && c->rx.dst) {
			pthread_rwlock_rdlock(&ti->reg_lock);
			tcp_conn_recheck_locked(ti, c);
			r = tcp_rx_read(c->fd, &c->rx, w->scratch, need);
			pthread_rwlock_unlock(&ti->reg_lock);
		} else {
			r = tcp_rx_read(c->fd, &c->rx, w->scratch, need);
		}
		if (r == -EAGAIN || r == -EWOULDBLOCK)
			break;
		if (r <= 0) {
			bool mid = c->rx.payload || c->rx.end != c->rx.pos;

			snprintf(why, sizeof(why), "%s%s",
				 r == 0 ? "closed by the peer" : "receive: ",
				 r == 0 ? (mid ? " in the middle of a frame" : "")
					: strerror((int)-r));
			tcp_conn_close(ti, w, c, mid ? TE_PLUGIN_LOG_INFO : TE_PLUGIN_LOG_DEBUG,
				       why);
			return false;
		}
		budget -= TCP_MIN(budget, (uint64_t)r);
		if (c->rx.payload && c->rx.left == 0)
			tcp_conn_payload_done(ti, c);
	}
	tcp_conn_frame_clock(c, frames_before);
	return tcp_conn_tx(ti, w, c);
}

static void tcp_conn_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
			   uint32_t events)
{
	if ((events & EPOLLOUT) && !tcp_conn_tx(ti, w, c))
		return;
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		tcp_conn_rx(ti, w, c);
}

/* A client address as 16 bytes (IPv4 as v4-mapped IPv6), for the per-host limit. */
static void tcp_host_of(const struct sockaddr_storage *sa, uint8_t host[16])
{
	memset(host, 0, 16);
	if (sa->ss_family == AF_INET6) {
		memcpy(host, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	} else {
		host[10] = host[11] = 0xff;
		memcpy(host + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	}
}

/* Why a connection from @host would go over a limit, or NULL. Accepting worker. */
static const char *tcp_accept_limit(struct tcp_inst *ti, const uint8_t host[16], char *text,
				    size_t cap)
{
	uint32_t same = 0;

	/* relaxed: counters; a slot freed a moment ago is simply counted next time */
	if (atomic_load_explicit(&ti->n_conns, memory_order_relaxed) >= ti->max_conns) {
		snprintf(text, cap, "%" PRIu64 " connections open (max_conns)", ti->max_conns);
		return text;
	}
	if (atomic_load_explicit(&ti->n_unauth, memory_order_relaxed) >= ti->max_unauth) {
		snprintf(text, cap, "%" PRIu64 " connections not yet past their %s (max_unauth)",
			 ti->max_unauth, ti->auth ? "HELLO and AUTH" : "HELLO");
		return text;
	}
	for (uint32_t k = 0; k < ti->n_workers; k++) {
		struct tcp_worker *w = &ti->workers[k];

		pthread_mutex_lock(&w->lock);
		for (struct tcp_conn *c = w->conns; c; c = c->next)
			same += memcmp(c->host, host, 16) == 0;
		pthread_mutex_unlock(&w->lock);
	}
	if (same >= ti->max_conns_per_host) {
		snprintf(text, cap, "%" PRIu32 " connections from this host (max_conns_per_host)",
			 same);
		return text;
	}
	return NULL;
}

static void tcp_accept(struct tcp_inst *ti, struct tcp_worker *w0)
{
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t len = sizeof(sa);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET };
		struct tcp_worker *w;
		struct tcp_conn *c;
		char who[72], text[128];
		uint8_t host[16];
		int fd;

		fd = accept4(ti->listen_fd, (struct sockaddr *)&sa, &len,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				tcp_log(ti, TE_PLUGIN_LOG_WARN, "accept: %s", strerror(errno));
			return;
		}
		tcp_sa_text(&sa, who, sizeof(who));
		tcp_host_of(&sa, host);
		if (tcp_accept_limit(ti, host, text, sizeof(text))) {
			tcp_warn_limited(ti, w0, "connection from %s refused: %s", who, text);
			tcp_sock_abort(fd);
			continue;
		}
		tcp_sock_tune(ti, fd);
		c = calloc(1, sizeof(*c));
		if (c)
			c->rx.buf = malloc(TCP_RBUF);
		if (!c || !c->rx.buf) {
			tcp_log(ti, TE_PLUGIN_LOG_WARN, "no memory for a connection");
			if (c)
				tcp_conn_free(c);
			close(fd);
			continue;
		}
		c->ep.kind = TCP_EP_CONN;
		c->fd = fd;
		memcpy(c->who, who, sizeof(c->who));
		memcpy(c->host, host, sizeof(c->host));
		c->hs = TCP_CHS_HELLO;
		c->accept_ns = tcp_now_ns();
		atomic_init(&c->fenced, false);
		/* relaxed: a round-robin counter */
		w = &ti->workers[atomic_fetch_add_explicit(&ti->next_conn_worker, 1,
							   memory_order_relaxed) %
				 ti->n_workers];
		c->w = w;
		/* relaxed: counters for the accept limits only */
		atomic_fetch_add_explicit(&ti->n_conns, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&ti->n_unauth, 1, memory_order_relaxed);
		pthread_mutex_lock(&w->lock);
		c->next = w->conns;
		if (w->conns)
			w->conns->prev = c;
		w->conns = c;
		w->n_conns++;
		pthread_mutex_unlock(&w->lock);
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s", c->who);
		/* From here the connection belongs to w's thread: do not touch it. */
		ev.data.ptr = &c->ep;
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			/* w's thread owns it now: its next tick closes it (handshake deadline). */
			tcp_log(ti, TE_PLUGIN_LOG_WARN, "epoll_ctl for %s: %s", who,
				strerror(errno));
			pthread_mutex_lock(&w->lock);
			c->accept_ns = 0;
			pthread_mutex_unlock(&w->lock);
		}
	}
}

/* --- peers ------------------------------------------------------------------------- */

static void tcp_peer_free(struct tcp_inst *ti, struct tcp_peer *peer)
{
	pthread_mutex_lock(&ti->lock);
	if (peer->prev)
		peer->prev->next = peer->next;
	else
		ti->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_destroy(&l->lock);
		pthread_mutex_destroy(&l->rx_lock);
		free(l->slots);
		free(l->free_ids);
		free(l->rx.buf);
	}
	free(peer->name);
	free(peer);
}

/* Unlink a closed lane from its worker; the last lane of an unloaded peer frees it. */
static void tcp_lane_release(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_worker *w = l->w;
	struct tcp_peer *peer = l->peer;

	pthread_mutex_lock(&w->lock);
	if (l->wprev)
		l->wprev->wnext = l->wnext;
	else
		w->lanes = l->wnext;
	if (l->wnext)
		l->wnext->wprev = l->wprev;
	pthread_mutex_unlock(&w->lock);
	tcp_again_remove(w, &l->ep);
	/* acq_rel: the last one must see every other worker's final writes to its lanes */
	if (atomic_fetch_sub_explicit(&peer->lanes_open, 1, memory_order_acq_rel) == 1)
		tcp_peer_free(ti, peer);
}

/* --- workers ------------------------------------------------------------------------- */

/*
 * A lane handed to its worker: stream bulk data queued by submit, finish a failure, or
 * close it for an unloaded peer. A kick may be stale (the lane failed and reconnected
 * since): only the state found now counts.
 */
static void tcp_lane_service(struct tcp_inst *ti, struct tcp_lane *l)
{
	enum tcp_lane_state state;
	bool closing;

	pthread_mutex_lock(&l->lock);
	closing = l->closing;
	state = l->state;
	pthread_mutex_unlock(&l->lock);
	if (!closing) {
		if (state == TCP_LANE_UP)
			tcp_lane_flush(ti, l);
		else if (state == TCP_LANE_BROKEN)
			tcp_lane_break(ti, l, TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
		return;
	}
	tcp_lane_break(ti, l, TE_ERR_CANCELED, TCP_NAME ": peer unloaded");
	pthread_mutex_lock(&l->lock);
	state = l->state;
	pthread_mutex_unlock(&l->lock);
	/* Not down: a sender is still in its loop and kicks us again when it leaves. */
	if (state == TCP_LANE_DOWN)
		tcp_lane_release(ti, l);
}

static void tcp_worker_todo(struct tcp_inst *ti, struct tcp_worker *w)
{
	struct te_plugin_slice *defer;

	for (;;) {
		struct tcp_lane *l;

		pthread_mutex_lock(&w->lock);
		l = w->todo;
		if (l) {
			w->todo = l->todo_next;
			l->in_todo = false;
			pthread_mutex_unlock(&w->lock);
			tcp_lane_service(ti, l);
			continue;
		}
		defer = w->defer_head;
		w->defer_head = w->defer_tail = NULL;
		w->kicked = false;
		pthread_mutex_unlock(&w->lock);
		break;
	}
	while (defer) {
		struct te_plugin_slice *s = defer;

		defer = tcp_priv(s)->next;
		tcp_report_priv(ti, s);
	}
}

/*
 * The serving side's time limits: HELLO/AUTH within hello_timeout_ms of accept, each request
 * frame within frame_timeout_ms of its first byte (whatever trickles in), idle connections
 * after idle_timeout_ms; fenced connections go at once. Worker only (it owns its conns).
 */
static void tcp_conns_tick(struct tcp_inst *ti, struct tcp_worker *w, uint64_t now)
{
	enum {
		WHY_FENCED,
		WHY_HELLO,
		WHY_FRAME,
		WHY_IDLE
	};
	struct tcp_conn *hit[256];
	uint8_t why[256];
	uint32_t n = 0;

	pthread_mutex_lock(&w->lock);
	for (struct tcp_conn *c = w->conns; c && n < 256; c = c->next) {
		if (atomic_load_explicit(&c->fenced, memory_order_relaxed))
			why[n] = WHY_FENCED;
		else if (c->hs != TCP_CHS_READY &&
			 now - c->accept_ns > ti->hello_timeout_ms * 1000000ull)
			why[n] = WHY_HELLO;
		else if (c->frame_start_ns &&
			 now - c->frame_start_ns > ti->frame_timeout_ms * 1000000ull)
			why[n] = WHY_FRAME;
		else if (ti->idle_timeout_ms && c->hs == TCP_CHS_READY && !c->frame_start_ns &&
			 !c->count && !c->rx.payload &&
			 now - c->active_ns > ti->idle_timeout_ms * 1000000ull)
			why[n] = WHY_IDLE;
		else
			continue;
		hit[n++] = c;
	}
	pthread_mutex_unlock(&w->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct tcp_conn *c = hit[i];
		char text[160];

		switch (why[i]) {
		case WHY_FENCED:
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG,
				       "replaced by a newer connection of its lane (fenced)");
			break;
		case WHY_HELLO:
			snprintf(text, sizeof(text),
				 "connection from %s did not complete its %s within %" PRIu64
				 " ms (hello_timeout_ms): closed",
				 c->who, ti->auth ? "HELLO and AUTH" : "HELLO",
				 ti->hello_timeout_ms);
			tcp_warn_limited(ti, w, "%s", text);
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "handshake timeout");
			break;
		case WHY_FRAME:
			snprintf(text, sizeof(text),
				 "connection from %s: a request frame was not complete %" PRIu64
				 " ms after its first byte (frame_timeout_ms): closed",
				 c->who, ti->frame_timeout_ms);
			tcp_warn_limited(ti, w, "%s", text);
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "frame timeout");
			break;
		default:
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "idle (idle_timeout_ms)");
			break;
		}
	}
}

/*
 * Periodic checks: connect timeouts, lanes stuck with canceled requests, WRITEs waiting for a
 * fence (reported when their deadline passed; their lane reconnects to get the fence), and
 * the serving side's time limits.
 */
static void tcp_worker_tick(struct tcp_inst *ti, struct tcp_worker *w)
{
	struct tcp_lane *hit[64];
	struct tcp_rlist expired = { 0 };
	uint64_t now = tcp_now_ns();
	uint32_t n = 0;

	pthread_mutex_lock(&w->lock);
	for (struct tcp_lane *l = w->lanes; l && n < 64; l = l->wnext) {
		bool bad = false;

		pthread_mutex_lock(&l->lock);
		if (l->state == TCP_LANE_CONNECTING &&
		    now - l->connect_start_ns > ti->connect_timeout_ms * 1000000ull) {
			tcp_lane_fail_locked(
				l, TE_ERR_PEER_UNREACHABLE,
				TCP_NAME ": connect to %s (%s) timed out after %" PRIu64 " ms",
				l->peer->name, l->peer->addr_text, ti->connect_timeout_ms);
			bad = true;
		} else if (l->state == TCP_LANE_UP && (l->n_orphan || l->n_canceled)) {
			/* relaxed: only compared with itself one tick later */
			uint64_t prog = atomic_load_explicit(&l->progress, memory_order_relaxed);

			if (prog != l->seen_progress) {
				l->seen_progress = prog;
				l->stall_ticks = 0;
			} else if (++l->stall_ticks >= TCP_STALL_TICKS) {
				tcp_lane_fail_locked(l, TE_ERR_PATH_TIMEOUT,
						     TCP_NAME
						     ": lane %u to %s (%s) made no progress "
						     "for %u ms with canceled requests",
						     l->index, l->peer->name, l->peer->addr_text,
						     TCP_STALL_TICKS * TCP_TICK_MS);
				bad = true;
			}
		} else if (l->state == TCP_LANE_BROKEN && !l->sending) {
			bad = true; /* normally handled by a kick already */
		}
		if (l->n_fence) {
			tcp_fence_take_locked(l, false, now, &expired);
			if (l->n_fence && l->state == TCP_LANE_DOWN && !l->closing &&
			    now - l->fence_connect_ns >= TCP_TICK_MS * 1000000ull) {
				l->fence_connect_ns = now;
				tcp_lane_connect_locked(ti, l);
				bad = bad || l->state == TCP_LANE_BROKEN;
			}
		}
		pthread_mutex_unlock(&l->lock);
		if (bad)
			hit[n++] = l;
	}
	pthread_mutex_unlock(&w->lock);
	/* Reported without the worker lock: slice_done may call unload_peer, which takes it. */
	tcp_rlist_report(ti, &expired);
	for (uint32_t i = 0; i < n; i++)
		tcp_lane_break(ti, hit[i], TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
	tcp_conns_tick(ti, w, now);
}

static void tcp_run_again(struct tcp_inst *ti, struct tcp_worker *w)
{
	for (uint32_t rounds = w->n_again; rounds && w->n_again; rounds--) {
		struct tcp_ep *ep = w->again[0];

		w->again[0] = w->again[--w->n_again];
		ep->again = false;
		if (ep->kind == TCP_EP_LANE)
			tcp_lane_rx(ti, w, (struct tcp_lane *)ep);
		else if (ep->kind == TCP_EP_CONN)
			tcp_conn_rx(ti, w, (struct tcp_conn *)ep);
	}
}

static void *tcp_worker_main(void *arg)
{
	struct tcp_worker *w = arg;
	struct tcp_inst *ti = w->ti;
	struct epoll_event evs[TCP_EVENTS];
	uint64_t next_tick = tcp_now_ns() + TCP_TICK_MS * 1000000ull;

	while (!atomic_load_explicit(&ti->stopping, memory_order_acquire)) {
		uint64_t now;
		int n, timeout;

		tcp_worker_todo(ti, w);
		now = tcp_now_ns();
		if (now >= next_tick) {
			tcp_worker_tick(ti, w);
			next_tick = now + TCP_TICK_MS * 1000000ull;
		}
		timeout = w->n_again ? 0 : (int)((next_tick - now) / 1000000) + 1;
		n = epoll_wait(w->epfd, evs, TCP_EVENTS, timeout);
		if (n < 0) {
			if (errno != EINTR) {
				tcp_log(ti, TE_PLUGIN_LOG_ERROR, "worker %u: epoll_wait: %s",
					w->index, strerror(errno));
				usleep(10000); /* do not spin on a persistent error */
			}
			continue;
		}
		for (int i = 0; i < n; i++) {
			struct tcp_ep *ep = evs[i].data.ptr;
			uint64_t cnt;

			switch (ep->kind) {
			case TCP_EP_KICK:
				/* The work itself is picked up by tcp_worker_todo. */
				if (read(w->kick_fd, &cnt, sizeof(cnt)) < 0 && errno != EAGAIN)
					tcp_log(ti, TE_PLUGIN_LOG_ERROR, "worker %u: eventfd: %s",
						w->index, strerror(errno));
				break;
			case TCP_EP_LISTEN:
				tcp_accept(ti, w);
				break;
			case TCP_EP_LANE:
				tcp_lane_event(ti, w, (struct tcp_lane *)ep, evs[i].events);
				break;
			case TCP_EP_CONN:
				tcp_conn_event(ti, w, (struct tcp_conn *)ep, evs[i].events);
				break;
			}
		}
		tcp_run_again(ti, w);
	}
	return NULL;
}

/* --- options ------------------------------------------------------------------------- */

static const char *const tcp_option_names[] = {
	"bind",
	"port",
	"advertise",
	"lanes",
	"workers",
	"max_inflight",
	"slice_size",
	"connect_timeout_ms",
	"sockbuf",
	"max_conns",
	"max_conns_per_host",
	"max_unauth",
	"hello_timeout_ms",
	"idle_timeout_ms",
	"frame_timeout_ms",
};

static enum te_status tcp_opt_u64(struct tcp_inst *ti, const char *key, uint64_t def, uint64_t min,
				  uint64_t max, bool size_suffix, uint64_t *out)
{
	const char *s = ti->host->config_get(ti->ctx, key);

	if (!s) {
		*out = def;
		return TE_OK;
	}
	if (te_plugin_parse_u64(s, size_suffix, min, max, out))
		return TE_OK;
	tcp_log(ti, TE_PLUGIN_LOG_ERROR,
		"option '%s': expected an integer%s in [%" PRIu64 ", %" PRIu64 "], got '%s'", key,
		size_suffix ? " (optional " TE_PLUGIN_SIZE_SUFFIXES " suffix)" : "", min, max, s);
	return TE_ERR_CONFIG;
}

/* Resolve @host (numeric or a name, looked up once here) with @port into @ss. */
static enum te_status tcp_resolve(struct tcp_inst *ti, const char *opt, const char *host,
				  uint16_t port, bool passive, struct sockaddr_storage *ss,
				  socklen_t *len_out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int rc;

	if (passive)
		hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc != 0 || !res || res->ai_addrlen > sizeof(*ss) ||
	    (res->ai_family != AF_INET && res->ai_family != AF_INET6)) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "option '%s': cannot resolve '%s': %s", opt, host,
			rc ? gai_strerror(rc) : "no IPv4/IPv6 address");
		if (res)
			freeaddrinfo(res);
		return TE_ERR_CONFIG;
	}
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len_out = res->ai_addrlen;
	freeaddrinfo(res);
	if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	return TE_OK;
}

static bool tcp_is_wildcard(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)ss)->sin6_addr);
	return ((const struct sockaddr_in *)ss)->sin_addr.s_addr == htonl(INADDR_ANY);
}

/* Parse the options, open the listener and fill the published blob. */
static enum te_status tcp_setup(struct tcp_inst *ti, uint8_t blob[TCP_BLOB_LEN])
{
	const char *bind_s = ti->host->config_get(ti->ctx, "bind");
	const char *adv_s = ti->host->config_get(ti->ctx, "advertise");
	struct sockaddr_storage bsa, asa;
	socklen_t blen, alen;
	char text[72];
	uint64_t v, port;
	enum te_status st;
	int one = 1;

	if (te_plugin_unknown_option(ti->host, ti->ctx, tcp_option_names,
				     TE_PLUGIN_ARRAY_LEN(tcp_option_names), text, sizeof(text))) {
		char known[256];

		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "unknown option '%s' (known: %s)", text,
			te_plugin_join(tcp_option_names, TE_PLUGIN_ARRAY_LEN(tcp_option_names),
				       known, sizeof(known)));
		return TE_ERR_CONFIG;
	}
	if ((st = tcp_opt_u64(ti, "port", 0, 0, 65535, false, &port)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "lanes", 2, 1, TCP_MAX_LANES, false, &v)) != TE_OK)
		return st;
	ti->lanes = (uint32_t)v;
	if ((st = tcp_opt_u64(ti, "workers", 2, 1, TCP_MAX_WORKERS, false, &v)) != TE_OK)
		return st;
	ti->n_workers = (uint32_t)v;
	if ((st = tcp_opt_u64(ti, "max_inflight", 256, 1, TCP_MAX_INFLIGHT, false, &v)) != TE_OK)
		return st;
	ti->max_inflight = (uint32_t)v;
	if ((st = tcp_opt_u64(ti, "slice_size", TCP_DEF_SLICE, 4096, TCP_MAX_FRAME, true,
			      &ti->slice_size)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "connect_timeout_ms", 3000, 1, 600000, false,
			      &ti->connect_timeout_ms)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "sockbuf", 0, 0, 1ull << 30, true, &ti->sockbuf)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "max_conns", TCP_DEF_MAX_CONNS, 1, 1u << 20, false,
			      &ti->max_conns)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "max_conns_per_host", TCP_DEF_MAX_CONNS_HOST, 1, 1u << 20, false,
			      &ti->max_conns_per_host)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "max_unauth", TCP_DEF_MAX_UNAUTH, 1, 1u << 20, false,
			      &ti->max_unauth)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "hello_timeout_ms", TCP_DEF_HELLO_MS, 10, 600000, false,
			      &ti->hello_timeout_ms)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "idle_timeout_ms", TCP_DEF_IDLE_MS, 0, 86400000, false,
			      &ti->idle_timeout_ms)) != TE_OK ||
	    (st = tcp_opt_u64(ti, "frame_timeout_ms", TCP_DEF_FRAME_MS, 10, 86400000, false,
			      &ti->frame_timeout_ms)) != TE_OK)
		return st;

	if (!bind_s || !*bind_s)
		bind_s = "127.0.0.1";
	snprintf(ti->bind_text, sizeof(ti->bind_text), "%s", bind_s);
	st = tcp_resolve(ti, "bind", bind_s, (uint16_t)port, true, &bsa, &blen);
	if (st != TE_OK)
		return st;
	if (adv_s && *adv_s) {
		st = tcp_resolve(ti, "advertise", adv_s, 0, false, &asa, &alen);
		if (st != TE_OK)
			return st;
		if (tcp_is_wildcard(&asa)) {
			tcp_log(ti, TE_PLUGIN_LOG_ERROR,
				"option 'advertise': '%s' is a wildcard address; peers need one they "
				"can connect to",
				adv_s);
			return TE_ERR_CONFIG;
		}
	} else if (tcp_is_wildcard(&bsa)) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR,
			"option 'advertise' is required when 'bind' is the wildcard address '%s'",
			bind_s);
		return TE_ERR_CONFIG;
	} else {
		asa = bsa;
	}

	ti->listen_fd = socket(bsa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ti->listen_fd < 0) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "option 'bind': no %s socket: %s",
			bsa.ss_family == AF_INET6 ? "IPv6" : "IPv4", strerror(errno));
		return TE_ERR_CONFIG;
	}
	setsockopt(ti->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bsa.ss_family == AF_INET6 && tcp_is_wildcard(&bsa)) {
		int zero = 0;

		/* "::" serves IPv4 peers too, whatever net.ipv6.bindv6only says. */
		setsockopt(ti->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	}
	tcp_sa_text(&bsa, text, sizeof(text));
	if (bind(ti->listen_fd, (struct sockaddr *)&bsa, blen) != 0 ||
	    listen(ti->listen_fd, SOMAXCONN) != 0) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "options 'bind'/'port': cannot listen on %s: %s",
			text, strerror(errno));
		return TE_ERR_CONFIG;
	}
	blen = sizeof(bsa);
	if (getsockname(ti->listen_fd, (struct sockaddr *)&bsa, &blen) != 0)
		return TE_ERR_SYSTEM;
	ti->port = ntohs(bsa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bsa)->sin6_port
						   : ((struct sockaddr_in *)&bsa)->sin_port);
	tcp_sa_text(&bsa, text, sizeof(text));
	snprintf(ti->device, sizeof(ti->device), "tcp:%s", text);

	if (getrandom(&ti->nonce, sizeof(ti->nonce), GRND_NONBLOCK) != sizeof(ti->nonce))
		ti->nonce = tcp_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)ti;
	if (ti->nonce == 0)
		ti->nonce = 1;

	memset(blob, 0, TCP_BLOB_LEN);
	tcp_put_u32(blob, TCP_BLOB_MAGIC);
	blob[4] = 1;
	blob[5] = asa.ss_family == AF_INET6 ? 6 : 4;
	tcp_put_u16(blob + 6, ti->port);
	tcp_put_u64(blob + 8, ti->nonce);
	if (asa.ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&asa;

		memcpy(blob + 16, &s6->sin6_addr, 16);
		tcp_put_u32(blob + 32, s6->sin6_scope_id);
	} else {
		memcpy(blob + 16, &((const struct sockaddr_in *)&asa)->sin_addr, 4);
	}
	if (asa.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&asa)->sin6_port = htons(ti->port);
	else
		((struct sockaddr_in *)&asa)->sin_port = htons(ti->port);
	tcp_sa_text(&asa, text, sizeof(text));
	tcp_log(ti, TE_PLUGIN_LOG_INFO,
		"listening on %s, advertised as %s; %u lanes per peer, %u workers, slice %" PRIu64
		" bytes",
		ti->device + 4, text, ti->lanes, ti->n_workers, ti->slice_size);
	return TE_OK;
}

/* --- install -------------------------------------------------------------------------- */

static enum te_status tcp_workers_start(struct tcp_inst *ti)
{
	ti->workers = calloc(ti->n_workers, sizeof(*ti->workers));
	if (!ti->workers)
		return TE_ERR_NOMEM;
	for (uint32_t i = 0; i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		w->ti = ti;
		w->index = i;
		w->epfd = -1;
		w->kick_fd = -1;
		pthread_mutex_init(&w->lock, NULL);
	}
	for (uint32_t i = 0; i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];
		struct epoll_event ev = { .events = EPOLLIN };
		char name[16];
		int rc;

		w->kick_ep.kind = TCP_EP_KICK;
		w->scratch = malloc(TCP_SCRATCH);
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		w->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (!w->scratch || w->epfd < 0 || w->kick_fd < 0)
			goto err_system;
		ev.data.ptr = &w->kick_ep;
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->kick_fd, &ev) != 0)
			goto err_system;
		if (i == 0) {
			ev.events = EPOLLIN | EPOLLET;
			ev.data.ptr = &ti->listen_ep;
			if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, ti->listen_fd, &ev) != 0)
				goto err_system;
		}
		rc = pthread_create(&w->thread, NULL, tcp_worker_main, w);
		if (rc != 0) {
			errno = rc;
			goto err_system;
		}
		w->started = true;
		snprintf(name, sizeof(name), "te-tcp-%u", i);
		pthread_setname_np(w->thread, name);
		continue;
err_system:
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "cannot start worker %u: %s", i, strerror(errno));
		return TE_ERR_SYSTEM;
	}
	return TE_OK;
}

/* Teardown shared by fini and a failing init; @ti may be partly built. */
static void tcp_destroy(struct tcp_inst *ti)
{
	uint32_t peers = 0, rkeys = 0, mems;

	atomic_store_explicit(&ti->stopping, true, memory_order_release);
	for (uint32_t i = 0; ti->workers && i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		if (!w->started)
			continue;
		pthread_mutex_lock(&w->lock);
		w->kicked = false;
		tcp_worker_wake_locked(w);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		w->started = false;
	}
	if (ti->listen_fd >= 0)
		close(ti->listen_fd);

	/* Single-threaded from here. Every slice still held is reported exactly once. */
	while (ti->peers) {
		struct tcp_peer *peer = ti->peers;

		peers++;
		for (uint32_t i = 0; i < peer->n_lanes; i++) {
			struct tcp_lane *l = &peer->lanes[i];
			struct tcp_rlist rest = { 0 };

			tcp_lane_break(ti, l, TE_ERR_CANCELED, TCP_NAME ": instance shut down");
			/* WRITEs still waiting for a fence: shutting down, nobody waits longer. */
			pthread_mutex_lock(&l->lock);
			tcp_fence_take_locked(l, true, 0, &rest);
			pthread_mutex_unlock(&l->lock);
			tcp_rlist_report(ti, &rest);
		}
		tcp_peer_free(ti, peer);
	}
	for (uint32_t i = 0; ti->workers && i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		while (w->conns) {
			struct tcp_conn *c = w->conns;

			w->conns = c->next;
			close(c->fd);
			tcp_conn_free(c);
		}
		while (w->defer_head) {
			struct te_plugin_slice *s = w->defer_head;

			w->defer_head = tcp_priv(s)->next;
			tcp_report_priv(ti, s);
		}
		if (w->epfd >= 0)
			close(w->epfd);
		if (w->kick_fd >= 0)
			close(w->kick_fd);
		free(w->scratch);
		free(w->again);
		pthread_mutex_destroy(&w->lock);
	}
	while (ti->rkeys) {
		struct tcp_rkey *k = ti->rkeys;

		ti->rkeys = k->next;
		rkeys++;
		free(k);
	}
	mems = ti->n_regions;
	for (uint32_t i = 0; i < ti->n_regions; i++)
		free(ti->regions[i].mem);
	if (peers || rkeys || mems)
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"fini released %u peers, %u remote keys and %u regions", peers, rkeys,
			mems);
	free(ti->regions);
	free(ti->workers);
	free(ti->fences);
	pthread_rwlock_destroy(&ti->reg_lock);
	pthread_mutex_destroy(&ti->lock);
	pthread_mutex_destroy(&ti->fence_lock);
	free(ti);
}

static enum te_status tcp_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	uint8_t blob[TCP_BLOB_LEN];
	pthread_rwlockattr_t attr;
	struct tcp_inst *ti;
	enum te_status st;

	if (!host || !inst_out || !TE_PLUGIN_HAS(host, struct te_plugin_host, local_name) ||
	    !host->log || !host->slice_done || !host->config_get || !host->publish)
		return TE_ERR_INVALID_ARG;
	ti = calloc(1, sizeof(*ti));
	if (!ti)
		return TE_ERR_NOMEM;
	ti->host = host;
	ti->ctx = ctx;
	ti->listen_fd = -1;
	ti->listen_ep.kind = TCP_EP_LISTEN;
	pthread_mutex_init(&ti->lock, NULL);
	pthread_mutex_init(&ti->fence_lock, NULL);
	/* Since ABI 1.2 the host authenticates with the engine's secret, which we never see. */
	if (TE_PLUGIN_HAS(host, struct te_plugin_host, auth_check) && host->auth_mac &&
	    host->auth_check) {
		uint8_t probe[TE_PLUGIN_MAC_SIZE];

		ti->auth = host->auth_mac(ctx, NULL, 0, probe) == TE_OK;
	}
	pthread_rwlockattr_init(&attr);
	/*
	 * Serving syscalls hold the read side back to back under load; without writer
	 * preference dereg_mem could wait behind them forever.
	 */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&ti->reg_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	ti->fences = calloc(TCP_FENCES, sizeof(*ti->fences));
	if (!ti->fences) {
		st = TE_ERR_NOMEM;
		goto err_destroy;
	}

	st = tcp_setup(ti, blob);
	if (st != TE_OK)
		goto err_destroy;
	st = host->publish(ctx, blob, sizeof(blob));
	if (st != TE_OK) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "publish failed (%d)", st);
		goto err_destroy;
	}
	st = tcp_workers_start(ti);
	if (st != TE_OK)
		goto err_destroy;
	*inst_out = (struct te_plugin_inst *)ti;
	return TE_OK;

err_destroy:
	tcp_destroy(ti);
	return st;
}

static void tcp_fini(struct te_plugin_inst *inst)
{
	if (inst)
		tcp_destroy(tcp_inst_of(inst));
}

static enum te_status tcp_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct tcp_inst *ti = tcp_inst_of(inst);

	if (!ti || !caps)
		return TE_ERR_INVALID_ARG;
	/* Fill only what the core's struct has room for; it may predate later members. */
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, mem_types))
		caps->mem_types = TE_PLUGIN_MEM_CPU;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, ops))
		caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, progress))
		caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, thread_level))
		caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, flags))
		caps->flags = 0;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, max_slice_size))
		caps->max_slice_size = TCP_MAX_FRAME;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, default_slice_size))
		caps->default_slice_size = ti->slice_size;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, slice_priv_size))
		caps->slice_priv_size = sizeof(struct tcp_spriv);
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, max_devices))
		caps->max_devices = 1;
	/* GPU regions are served by staging through their owner (host->mem_copy). */
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, staged_mem_types))
		caps->staged_mem_types = TCP_STAGED_TYPES;
	return TE_OK;
}

static enum te_status tcp_query_devices(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct te_plugin_device *d = devices;

	if (!ti || !n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	if (max == 0) {
		*n_out = 0;
		return TE_OK;
	}
	if (TE_PLUGIN_HAS(d, struct te_plugin_device, name))
		snprintf(d->name, sizeof(d->name), "%s", ti->device);
	if (TE_PLUGIN_HAS(d, struct te_plugin_device, numa_node))
		d->numa_node = -1;
	if (TE_PLUGIN_HAS(d, struct te_plugin_device, pci))
		d->pci[0] = '\0';
	if (TE_PLUGIN_HAS(d, struct te_plugin_device, link_speed_mbps))
		d->link_speed_mbps = 0;
	if (TE_PLUGIN_HAS(d, struct te_plugin_device, mem_types))
		d->mem_types = TE_PLUGIN_MEM_CPU;
	*n_out = 1;
	return TE_OK;
}

/* --- memory -------------------------------------------------------------------------- */

static enum te_status tcp_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	uint64_t start = (uint64_t)(uintptr_t)addr;
	struct tcp_mem *m;
	uint32_t i;

	if (!ti || !addr || length == 0 || !mem_out || (access & ~TCP_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(mem_type & TCP_STAGED_TYPES))
		return TE_ERR_MEMORY_TYPE;
	/* GPU memory is served through staging: only when a loaded plugin owns the kind. */
	if (mem_type != TE_PLUGIN_MEM_CPU &&
	    ti->host->mem_copy(ti->ctx, NULL, NULL, 0, mem_type, dev, TE_PLUGIN_COPY_TO_HOST) !=
		    TE_OK) {
		tcp_set_error(ti,
			      TCP_NAME
			      ": cannot serve %s memory: no loaded transport owns that kind "
			      "to stage it",
			      mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda");
		return TE_ERR_MEMORY_TYPE;
	}
	if (start > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	m = malloc(sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = start;
	m->length = length;
	m->access = access;
	m->mem_type = mem_type;
	m->dev = dev;

	pthread_rwlock_wrlock(&ti->reg_lock);
	/* Disjoint regions keep "inside one region" a single binary search. */
	i = tcp_region_search(ti, start);
	if (i < ti->n_regions && ti->regions[i].start < start + length) {
		pthread_rwlock_unlock(&ti->reg_lock);
		free(m);
		return TE_ERR_ADDRESS_OVERLAPPED;
	}
	if (ti->n_regions == ti->cap_regions) {
		uint32_t ncap = ti->cap_regions ? ti->cap_regions * 2 : 16;
		struct tcp_region *nr = realloc(ti->regions, ncap * sizeof(*nr));

		if (!nr) {
			pthread_rwlock_unlock(&ti->reg_lock);
			free(m);
			return TE_ERR_NOMEM;
		}
		ti->regions = nr;
		ti->cap_regions = ncap;
	}
	memmove(&ti->regions[i + 1], &ti->regions[i], (ti->n_regions - i) * sizeof(*ti->regions));
	ti->regions[i] = (struct tcp_region){
		.start = start, .end = start + length, .access = access, .mem = m
	};
	ti->n_regions++;
	pthread_rwlock_unlock(&ti->reg_lock);
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;
}

static enum te_status tcp_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_mem *m = (struct tcp_mem *)mem;
	uint32_t i;

	if (!ti || !m)
		return TE_ERR_INVALID_ARG;
	/*
	 * The write lock waits for the serving syscall in progress on this region (each is
	 * non-blocking and short); later ones see the new version, re-check and find it gone.
	 */
	pthread_rwlock_wrlock(&ti->reg_lock);
	for (i = 0; i < ti->n_regions && ti->regions[i].mem != m; i++)
		;
	if (i == ti->n_regions) {
		pthread_rwlock_unlock(&ti->reg_lock);
		return TE_ERR_INVALID_HANDLE;
	}
	memmove(&ti->regions[i], &ti->regions[i + 1],
		(ti->n_regions - i - 1) * sizeof(*ti->regions));
	ti->n_regions--;
	/* relaxed: readers load it under the read lock, which orders it */
	atomic_fetch_add_explicit(&ti->reg_ver, 1, memory_order_relaxed);
	pthread_rwlock_unlock(&ti->reg_lock);
	free(m);
	return TE_OK;
}

static enum te_status tcp_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out)
{
	const struct tcp_mem *m = (const struct tcp_mem *)mem;
	uint8_t *p = buf;

	if (!inst || !m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	if (cap < TCP_KEY_LEN)
		return TE_ERR_TOO_LARGE;
	tcp_put_u32(p, TCP_KEY_MAGIC);
	tcp_put_u32(p + 4, m->access);
	tcp_put_u64(p + 8, m->addr);
	tcp_put_u64(p + 16, m->length);
	*len_out = TCP_KEY_LEN;
	return TE_OK;
}

/* --- peers ------------------------------------------------------------------------- */

static enum te_status tcp_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				    const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	const uint8_t *b = blob;
	struct tcp_peer *peer;
	uint32_t base;
	uint16_t port;

	if (!ti || !peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != TCP_BLOB_LEN || tcp_get_u32(b) != TCP_BLOB_MAGIC || b[4] != 1 ||
	    (b[5] != 4 && b[5] != 6) || tcp_get_u16(b + 6) == 0 || tcp_get_u32(b + 36) != 0) {
		char why[160];

		if (len != TCP_BLOB_LEN)
			snprintf(why, sizeof(why), "%zu bytes, expected %u", len, TCP_BLOB_LEN);
		else if (tcp_get_u32(b) != TCP_BLOB_MAGIC || b[4] != 1)
			snprintf(why, sizeof(why),
				 "magic 0x%08" PRIx32 " version %u, expected "
				 "0x%08x version 1",
				 tcp_get_u32(b), b[4], TCP_BLOB_MAGIC);
		else if (b[5] != 4 && b[5] != 6)
			snprintf(why, sizeof(why), "address family %u, expected 4 or 6", b[5]);
		else if (tcp_get_u16(b + 6) == 0)
			snprintf(why, sizeof(why), "port 0");
		else
			snprintf(why, sizeof(why), "reserved field 0x%08" PRIx32 " is not 0",
				 tcp_get_u32(b + 36));
		tcp_set_error(ti, TCP_NAME ": peer %s: malformed transport blob (%s)", peer_name,
			      why);
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "peer %s: malformed transport blob (%s)",
			peer_name, why);
		return TE_ERR_METADATA_MALFORMED;
	}
	port = tcp_get_u16(b + 6);
	peer = calloc(1, sizeof(*peer) + ti->lanes * sizeof(peer->lanes[0]));
	if (!peer)
		return TE_ERR_NOMEM;
	peer->ti = ti;
	peer->name = strdup(peer_name);
	peer->nonce = tcp_get_u64(b + 8);
	if (!tcp_random(&peer->cid, sizeof(peer->cid)) || !peer->cid) {
		tcp_set_error(ti, TCP_NAME ": peer %s: no random bytes for a client id", peer_name);
		free(peer->name);
		free(peer);
		return TE_ERR_SYSTEM;
	}
	peer->n_lanes = ti->lanes;
	if (b[5] == 6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&peer->sa;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		memcpy(&s6->sin6_addr, b + 16, 16);
		s6->sin6_scope_id = tcp_get_u32(b + 32);
		peer->salen = sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&peer->sa;

		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, b + 16, 4);
		peer->salen = sizeof(*s4);
	}
	tcp_sa_text(&peer->sa, peer->addr_text, sizeof(peer->addr_text));

	pthread_mutex_lock(&ti->lock);
	base = ti->next_peer_worker;
	ti->next_peer_worker += ti->lanes;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		l->ep.kind = TCP_EP_LANE;
		l->peer = peer;
		l->index = i;
		l->fd = -1;
		l->w = &ti->workers[(base + i) % ti->n_workers];
		pthread_mutex_init(&l->lock, NULL);
		pthread_mutex_init(&l->rx_lock, NULL);
		l->slots = calloc(ti->max_inflight, sizeof(*l->slots));
		l->free_ids = malloc(ti->max_inflight * sizeof(*l->free_ids));
		l->rx.buf = malloc(TCP_RBUF);
		/* Lowest ids on top: a lightly used lane keeps touching the same slots. */
		for (uint32_t k = 0; l->free_ids && k < ti->max_inflight; k++)
			l->free_ids[k] = ti->max_inflight - 1 - k;
		l->n_free = ti->max_inflight;
	}
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		if (!peer->name || !l->slots || !l->free_ids || !l->rx.buf) {
			/* Not yet visible to anyone: free it directly. */
			for (uint32_t k = 0; k < peer->n_lanes; k++) {
				pthread_mutex_destroy(&peer->lanes[k].lock);
				pthread_mutex_destroy(&peer->lanes[k].rx_lock);
				free(peer->lanes[k].slots);
				free(peer->lanes[k].free_ids);
				free(peer->lanes[k].rx.buf);
			}
			free(peer->name);
			free(peer);
			return TE_ERR_NOMEM;
		}
	}
	atomic_init(&peer->lanes_open, peer->n_lanes);
	pthread_mutex_lock(&ti->lock);
	peer->next = ti->peers;
	if (ti->peers)
		ti->peers->prev = peer;
	ti->peers = peer;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_lock(&l->w->lock);
		l->wnext = l->w->lanes;
		if (l->w->lanes)
			l->w->lanes->wprev = l;
		l->w->lanes = l;
		pthread_mutex_unlock(&l->w->lock);
	}
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "peer %s at %s (instance %016" PRIx64 ")", peer_name,
		peer->addr_text, peer->nonce);
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;
}

static void tcp_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle)
{
	struct tcp_peer *peer = (struct tcp_peer *)handle;
	uint32_t n;

	if (!inst || !peer)
		return;
	/*
	 * Closed by the lanes' workers: this may run on one of them (from slice_done) in the
	 * middle of using a lane, and only the worker may close a lane's socket. The last
	 * lane's worker frees the peer, possibly before this loop ends: read nothing of the
	 * peer after the last kick.
	 */
	n = peer->n_lanes;
	for (uint32_t i = 0; i < n; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_lock(&l->lock);
		l->closing = true;
		pthread_mutex_unlock(&l->lock);
		tcp_kick_lane(l);
	}
}

static enum te_status tcp_unpack_remote_key(struct te_plugin_inst *inst,
					    struct te_plugin_peer *peer, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	const uint8_t *p = blob;
	uint64_t kaddr, klen;
	struct tcp_rkey *k;
	uint32_t access;

	if (!ti || !peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != TCP_KEY_LEN || tcp_get_u32(p) != TCP_KEY_MAGIC)
		goto err_malformed;
	access = tcp_get_u32(p + 4);
	kaddr = tcp_get_u64(p + 8);
	klen = tcp_get_u64(p + 16);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if ((access & ~TCP_ACCESS_ALL) || klen == 0 || kaddr > UINT64_MAX - klen || kaddr != addr ||
	    klen != length)
		goto err_malformed;
	k = calloc(1, sizeof(*k));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = access;
	pthread_mutex_lock(&ti->lock);
	k->next = ti->rkeys;
	if (ti->rkeys)
		ti->rkeys->prev = k;
	ti->rkeys = k;
	pthread_mutex_unlock(&ti->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	tcp_set_error(ti,
		      TCP_NAME ": peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64
			       ", +%" PRIu64 ")",
		      ((struct tcp_peer *)peer)->name, len, addr, length);
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
		"peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64 ", +%" PRIu64 ")",
		((struct tcp_peer *)peer)->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void tcp_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_rkey *k = (struct tcp_rkey *)rkey;

	if (!ti || !k)
		return;
	pthread_mutex_lock(&ti->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ti->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ti->lock);
	free(k);
}

/* --- submit and cancel ----------------------------------------------------------------- */

/* Initiator-side checks the core should already have made: defence in depth, no syscall. */
static enum te_status tcp_check_slice(const struct te_plugin_slice *s, char *why, size_t len)
{
	const struct tcp_rkey *k = (const struct tcp_rkey *)s->rkey;
	const struct tcp_mem *m = (const struct tcp_mem *)s->local_mem;
	uint64_t local = (uint64_t)(uintptr_t)s->local;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;

	if (m &&
	    (local < m->addr || s->length > m->length || local - m->addr > m->length - s->length)) {
		snprintf(why, len,
			 TCP_NAME ": local range [%p, +%" PRIu64 ") outside its registered region",
			 s->local, s->length);
		return TE_ERR_OUT_OF_RANGE;
	}
	if (k && (s->remote < k->addr || s->length > k->length ||
		  s->remote - k->addr > k->length - s->length || !(k->access & need))) {
		snprintf(why, len,
			 TCP_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				  ") is not inside the remote-%s buffer [0x%" PRIx64 ", +%" PRIu64
				  ") it was submitted for",
			 s->remote, s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "readable" : "writable", k->addr,
			 k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	return TE_OK;
}

/* Take a slot for @s and queue its request. Under lane lock; l->n_free > 0. */
static void tcp_lane_enqueue_locked(struct tcp_lane *l, struct te_plugin_slice *s)
{
	struct tcp_spriv *p = tcp_priv(s);
	uint32_t id = l->free_ids[--l->n_free];
	struct tcp_slot *slot = &l->slots[id];

	slot->slice = s;
	slot->gen++;
	slot->flags = TCP_SLOT_USED;
	slot->op = s->opcode == TE_PLUGIN_OP_READ ? TCP_OP_READ : TCP_OP_WRITE;
	slot->length = s->length;
	p->next = NULL;
	p->fencing = false;
	p->req_id = (uint32_t)slot->gen << 16 | id;
	p->status = TE_OK;
	p->detail[0] = '\0';
	/* relaxed: cancel reads these under the lane lock, which it takes before trusting them */
	atomic_store_explicit(&p->slot, id, memory_order_relaxed);
	atomic_store_explicit(&p->lane, l, memory_order_relaxed);
	tcp_encode(p->hdr, slot->op, p->req_id, 0, s->remote, s->length);
	if (l->sq_tail)
		tcp_priv(l->sq_tail)->next = s;
	else
		l->sq_head = s;
	l->sq_tail = s;
}

/*
 * Start sending what was queued on @l (or let its worker report a failed connect). Little
 * data is sent right here: no wake-up, lowest latency. Bulk data (@bulk) is left to the
 * lane's worker, so that one thread streams it instead of the submitter and the worker
 * taking turns (measured: faster for 1 MiB WRITEs, see README.md).
 */
static void tcp_lane_push(struct tcp_inst *ti, struct tcp_lane *l, bool bulk)
{
	enum tcp_lane_state state;

	pthread_mutex_lock(&l->lock);
	state = l->state;
	pthread_mutex_unlock(&l->lock);
	if (state == TCP_LANE_BROKEN)
		tcp_kick_lane(l);
	else if (state == TCP_LANE_UP && bulk)
		tcp_kick_lane(l);
	else if (state == TCP_LANE_UP)
		tcp_lane_flush(ti, l);
}

#define TCP_TOUCHED 16
/*
 * Payload bytes one submit may queue on a lane and still send them itself. Measured: a
 * batch of 128 x 4 KiB WRITEs (256 KiB per lane) costs less CPU sent inline, 16 x 1 MiB
 * less sent by the worker.
 */
#define TCP_INLINE_BYTES (1u << 20)

static enum te_status tcp_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				 uint32_t n, uint32_t *accepted_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_lane *touched[TCP_TOUCHED];
	uint64_t bytes[TCP_TOUCHED];
	uint32_t n_touched = 0, i;
	enum te_status ret = TE_OK;

	if (!ti || !accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	if (atomic_load_explicit(&ti->stopping, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct tcp_peer *peer = s ? (struct tcp_peer *)s->peer : NULL;
		struct tcp_lane *l = NULL;
		char why[TCP_PRIV_DETAIL];
		enum te_status bad;
		uint32_t start, t;

		if (!s || !peer || !s->priv || !s->local || s->length == 0 ||
		    s->length > TCP_MAX_FRAME ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			tcp_log(ti, TE_PLUGIN_LOG_ERROR, "submit: malformed slice %u of %u", i, n);
			ret = TE_ERR_INVALID_ARG;
			break;
		}
		s->device = 0;
		bad = tcp_check_slice(s, why, sizeof(why));
		if (bad == TE_OK && atomic_load_explicit(&peer->restarted, memory_order_relaxed) &&
		    tcp_now_ns() <
			    atomic_load_explicit(&peer->restarted_until_ns, memory_order_relaxed)) {
			bad = TE_ERR_PEER_RESTARTED;
			snprintf(why, sizeof(why),
				 TCP_NAME ": %s (%s) was restarted; its descriptor is stale",
				 peer->name, peer->addr_text);
		}
		if (bad != TE_OK) {
			tcp_defer_fail(peer->lanes[0].w, s, bad, why);
			continue;
		}
		/* Round-robin stripes the slices of a large request over the lanes. */
		start = atomic_fetch_add_explicit(&peer->rr, 1, memory_order_relaxed);
		for (uint32_t k = 0; k < peer->n_lanes && !l; k++) {
			struct tcp_lane *c = &peer->lanes[(start + k) % peer->n_lanes];

			pthread_mutex_lock(&c->lock);
			if (c->n_free) {
				if (c->state == TCP_LANE_DOWN)
					tcp_lane_connect_locked(ti, c);
				tcp_lane_enqueue_locked(c, s);
				l = c;
			}
			pthread_mutex_unlock(&c->lock);
		}
		if (!l)
			break; /* every lane is full: back-pressure */
		for (t = 0; t < n_touched && touched[t] != l; t++)
			;
		if (t == n_touched) {
			if (n_touched == TCP_TOUCHED) {
				for (t = 0; t < n_touched; t++)
					tcp_lane_push(ti, touched[t], bytes[t] > TCP_INLINE_BYTES);
				n_touched = 0;
			}
			t = n_touched++;
			touched[t] = l;
			bytes[t] = 0;
		}
		if (s->opcode == TE_PLUGIN_OP_WRITE)
			bytes[t] += s->length;
	}
	for (uint32_t t = 0; t < n_touched; t++)
		tcp_lane_push(ti, touched[t], bytes[t] > TCP_INLINE_BYTES);
	*accepted_out = i;
	return ret;
}

/*
 * Cancel: a request not on the wire is removed and reported at once. A READ in flight is
 * reported at once too: its answer is drained when it comes, and once cancel returns no byte
 * of it reaches the destination. A WRITE whose bytes reached the socket cannot be recalled:
 * its lane is aborted and the WRITE is reported once it cannot land any more (see
 * tcp_lane_break): at once when its deadline passed, else when the server fenced the old
 * connection (one round trip to a live server) or, at the latest, at its deadline.
 */
static enum te_status tcp_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct te_plugin_slice *report = NULL;
	bool redirect = false, abort = false;
	struct tcp_spriv *p;
	struct tcp_slot *slot;
	struct tcp_lane *l;
	uint32_t id;

	if (!ti || !s || !s->priv)
		return TE_ERR_INVALID_ARG;
	p = tcp_priv(s);
	/* The slice memory is valid during the call even if it already completed. */
	l = atomic_load_explicit(&p->lane, memory_order_relaxed);
	id = atomic_load_explicit(&p->slot, memory_order_relaxed);
	if (!l || id >= ti->max_inflight)
		return TE_ERR_NOT_FOUND; /* never queued, or a deferred failure on its way */
	pthread_mutex_lock(&l->lock);
	if (p->fencing) {
		/* Waiting for the fence of a torn-down connection: its deadline also ends it. */
		if (tcp_now_ns() >= s->deadline_ns) {
			struct te_plugin_slice *prev = NULL;

			for (struct te_plugin_slice *q = l->fence_head; q && q != s;
			     q = tcp_priv(q)->next)
				prev = q;
			tcp_fence_unlink_locked(l, prev, s);
			p->status = TE_ERR_CANCELED;
			snprintf(p->detail, sizeof(p->detail),
				 TCP_NAME ": canceled; its deadline passed before the server "
					  "could be reached to fence it");
			report = s;
		}
		pthread_mutex_unlock(&l->lock);
		if (report)
			tcp_report_priv(ti, report);
		return TE_OK;
	}
	slot = &l->slots[id];
	if (!(slot->flags & TCP_SLOT_USED) || slot->slice != s) {
		pthread_mutex_unlock(&l->lock);
		return TE_ERR_NOT_FOUND; /* already reported */
	}
	if (slot->flags & TCP_SLOT_CANCELED) {
		pthread_mutex_unlock(&l->lock);
		return TE_OK;
	}
	if (!(slot->flags & (TCP_SLOT_IN_IOV | TCP_SLOT_SENT)) && !(s == l->sq_head && l->sq_off)) {
		/* Not a byte on the wire yet: take it out of the queue. */
		struct te_plugin_slice *prev = NULL;

		for (struct te_plugin_slice *q = l->sq_head; q && q != s; q = tcp_priv(q)->next)
			prev = q;
		if (prev)
			tcp_priv(prev)->next = p->next;
		else
			l->sq_head = p->next;
		if (l->sq_tail == s)
			l->sq_tail = prev;
		tcp_slot_free_locked(l, id);
		p->status = TE_ERR_CANCELED;
		snprintf(p->detail, sizeof(p->detail), TCP_NAME ": canceled before it was sent");
		report = s;
	} else if (slot->op == TCP_OP_WRITE) {
		/*
		 * Its bytes may be anywhere between here and the server's memory: abort the
		 * connection (its worker resets it and reports the WRITE once fenced).
		 */
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
		/* The others on this connection are collateral: retryable, not a path fault. */
		tcp_lane_fail_locked(l, TE_ERR_AGAIN,
				     TCP_NAME ": lane %u to %s (%s) reset to cancel a WRITE in "
					      "flight on it",
				     l->index, l->peer->name, l->peer->addr_text);
		abort = true;
	} else if ((slot->flags & TCP_SLOT_SENT) && !(slot->flags & TCP_SLOT_ANSWERED)) {
		/*
		 * A READ waiting for (or receiving) its answer: report now, drain the answer
		 * later. A payload being received stops reaching the destination below.
		 */
		redirect = (slot->flags & TCP_SLOT_RECV) != 0;
		if (redirect)
			atomic_store_explicit(&l->rx_redirect, true, memory_order_relaxed);
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
		report = tcp_slot_orphan_locked(l, id);
	} else {
		/* A READ request partly sent: reported (orphaned) as soon as it is all out. */
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
	}
	pthread_mutex_unlock(&l->lock);
	if (redirect) {
		/* The read in progress (non-blocking, short) ends; later ones see the redirect. */
		pthread_mutex_lock(&l->rx_lock);
		pthread_mutex_unlock(&l->rx_lock);
	}
	if (abort)
		tcp_kick_lane(l);
	if (report)
		tcp_report_priv(ti, report);
	return TE_OK;
}

static enum te_status tcp_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	if (!inst || !s)
		return TE_ERR_INVALID_ARG;
	/* One device; a retry takes whichever lane is free then (a broken one reconnects). */
	s->device = 0;
	return TE_OK;
}

static const struct te_plugin_ops tcp_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = tcp_init,
	.fini = tcp_fini,
	.query_caps = tcp_query_caps,
	.query_devices = tcp_query_devices,
	.reg_mem = tcp_reg_mem,
	.dereg_mem = tcp_dereg_mem,
	.pack_key = tcp_pack_key,
	.load_peer = tcp_load_peer,
	.unload_peer = tcp_unload_peer,
	.unpack_remote_key = tcp_unpack_remote_key,
	.release_remote_key = tcp_release_remote_key,
	.submit = tcp_submit,
	.cancel = tcp_cancel,
	.retry_prepare = tcp_retry_prepare,
};

static const struct te_plugin_desc tcp_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = TCP_NAME,
	.version = "1.0",
	.description = "TCP transport: pipelined, bounds-checked READ/WRITE over persistent lanes",
	.ops = &tcp_ops,
};

TE_PLUGIN_DEFINE(&tcp_desc)
