/* SPDX-License-Identifier: Apache-2.0 */
/* tcp.h: limits, objects and internal interfaces shared by the tcp plugin's source files. */
#ifndef TE_PLUGINS_TCP_H
#define TE_PLUGINS_TCP_H

/*
 * Shape of the plugin (README.md has the wire format and the user-visible semantics). Files:
 * tcp.c (options, setup, plugin ops), tcp_wire.c (wire format, frame reads, socket helpers),
 * tcp_client.c (initiator side), tcp_server.c (serving side), tcp_worker.c (epoll threads).
 *
 * Initiator side. Every peer has `lanes` persistent connections, opened on first use with a
 * non-blocking connect. A lane owns a send queue and a table of `max_inflight` slots; a slot's
 * index and a 16-bit generation form the request id. Per-slice state lives in slice->priv
 * (queue link, encoded request header, result detail), so the data path never allocates.
 * submit() puts slices of at least stripe_min bytes round-robin over the lanes (one large
 * transfer is striped) and smaller ones on the submitting thread's own lane, unless one submit
 * WRITEs at least 4 MiB to a peer: then those spread over its own lane and the lanes no other
 * thread used as its own in the last 100 ms (TCP_SPREAD_BYTES); when nobody is
 * sending on a lane, it sends right away from the calling thread with one sendmsg() gathering
 * many headers and payloads straight from the source buffers. What does not fit is sent by
 * the lane's worker when the socket becomes writable. Responses are read by the lane's
 * worker, or (progress 'caller') by the application thread waiting in te_batch_wait while it
 * waits: headers in bulk, READ payloads straight into the destination. One thread at a time
 * owns a lane's receive side (rx_busy); while a waiter drives, the lanes it polls are quiet
 * (no EPOLLIN), so their worker sleeps instead of racing it for every answer.
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
#include <poll.h>
#include <pthread.h>
#include <sched.h>
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
#include <te/te_plugin_util.h>

/*
 * The descriptor's version: the project version, which the build passes to every plugin
 * (plugins/meson.build); a build outside meson says 0.0.0.
 */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define TCP_NAME "tcp"

/* --- limits and wire constants ------------------------------------------------------ */

#define TCP_MAX_LANES 64u
#define TCP_MAX_WORKERS 64u
/*
 * Option 'workers' 0 (the default): one epoll thread per CPU this process may run on, at most
 * this many (4 was the fixed default before). On 2 CPUs, 2 workers each side against 4:
 * 4-thread cells 1.06x (geometric mean of 12; READ 8 MiB 0.83 -> 0.96 of the raw loop),
 * 1- and 2-thread cells 0.98x (of 14; one thread's striped WRITE 8 MiB 0.82x, still 0.98 of
 * the raw loop), the 32-engine mesh 1.04x (2026-12-06, bench/README.md).
 */
#define TCP_AUTO_WORKERS 4u
#define TCP_MAX_INFLIGHT 65536u /* slot index must fit the low 16 bits of a request id */
/*
 * Slot ids a lane starts with; it takes more, doubling, when a submit finds none free (up to
 * max_inflight), so that only a lane that had that many requests in flight holds their
 * memory (tcp_lane_room_locked).
 */
#define TCP_SLOTS_INITIAL 2048u
/*
 * A lane whose table grew past TCP_SLOTS_INITIAL gives the memory back (tcp_lane_shrink_locked)
 * once it has had no request in flight and none submitted for this many housekeeping ticks
 * (2 s): a burst of 65536 requests no longer holds 2 MiB plus a 256 KiB id ring per lane until
 * the peer is unloaded. A thread that submits deep batches back to back keeps its table.
 */
#define TCP_SLOTS_IDLE_TICKS 20u
#define TCP_MAX_FRAME (1ull << 30) /* longest READ/WRITE a server accepts */
/* Option defaults (1M slices chosen by measurement: README.md) are in tcp.c's tcp_options. */

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

/* Serving-side limits are options (tcp_options, README.md) with defaults safe on a public network. */
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
/*
 * Receive buffer of a lane and of a READY server connection: small payloads (frames of at
 * most TCP_GULP payload bytes) are read through it in bulk, many frames per readv, and copied out
 * (measured: see README.md, "How the defaults were chosen"). Larger payloads go straight to
 * their destination.
 */
#define TCP_RBUF_BIG (64u << 10)
#ifndef TCP_GULP
#define TCP_GULP (16u << 10)
#endif
#define TCP_SOCKBUF_MIN (64u << 10) /* option sockbuf: 0 or at least this */
#define TCP_CTL 256u /* handshake bytes queued per connection (>= 2 frames, or 1 + detail) */
#define TCP_SCRATCH (256u << 10)  /* per worker: where discarded payloads go */
#define TCP_LANE_IOV 512u	  /* iovecs per client sendmsg (<= UIO_MAXIOV) */
#define TCP_SRV_IOV 1024u	  /* iovecs per server sendmsg (UIO_MAXIOV) */
#define TCP_SRV_RING 512u	  /* answers queued per server connection: one sendmsg's worth */
#define TCP_RX_BUDGET (4u << 20)  /* bytes read per wake-up before other sockets get a turn */
#define TCP_DRV_BUDGET (1u << 20) /* bytes a driver reads per lane and progress() call */
#define TCP_DRV_LANES 64u	  /* lanes one progress() or wait() call looks at */
/*
 * Request headers per client sendmsg copied into the lane's txh, side by side, so that a run of
 * header-only frames (READs) is one iovec rather than one per request (measured: README.md,
 * "How the defaults were chosen"); the frames beyond go out of their slices as before. 1024,
 * as many as one submit hands over (the core's chunk): a batch of 1024 READs leaves in one
 * sendmsg of one iovec, as the raw loop's does (was 128: 128 in one iovec and the others one
 * each; READ 4K at batch 512 from 4 threads 0.98-1.09x over four runs, at 1024 from 2 threads
 * 1.03x over 12 rounds with the chunk of 1024; bench/README.md). 32 KiB per lane that needed
 * it.
 */
#define TCP_TXH_FRAMES 1024u
/*
 * ... but a lane starts with room for this many (4 KiB), and grows to TCP_TXH_FRAMES when a
 * sendmsg had more: lanes that never carry batches past 128 keep the memory they had.
 */
#define TCP_TXH_FIRST 128u
/* Frames per client sendmsg: header-only ones share iovecs, so more than TCP_LANE_IOV. */
#define TCP_LANE_FRAMES 1024u
/*
 * A scatter read (tcp_lane_rx_scatter) takes at most this many answers (2 iovecs each) and
 * this many bytes (option scatter: on; auto, but the second one under bbr), all of which it
 * puts back into a buffer when an answer comes unforeseen. The bytes: a worker's budget per
 * wake-up, so that it reads a batch of 64 KiB to 1 MiB answers in one readv as the raw loop
 * does (2 MiB per recvmsg); 1 MiB took 2.9 readv per batch of 32 x 64 KiB (bench/README.md).
 */
#define TCP_RX_CHAIN 256u
#define TCP_RX_CHAIN_BYTES TCP_RX_BUDGET
#define TCP_RX_CHAIN_BYTES_BBR (64u << 10)
/*
 * A lane with a slice in flight this large is left to its worker: the bytes are the work, a
 * polling waiter only takes a CPU from the copies (measured: 1 MiB READs 0.9x, 256 KiB equal,
 * 64 KiB 1.4x of the workers alone; README.md).
 */
#define TCP_DRV_MAX_SLICE (512u << 10)
#define TCP_STAGE (1u << 20) /* staging buffer per connection and direction (GPU memory) */
#define TCP_STAGED_TYPES (TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP)
#define TCP_TICK_MS 100		  /* housekeeping period: connect timeouts, stalls */
#define TCP_SHUN_NS 1000000000ull /* a lane whose requests moved away stays left alone */
/*
 * A lane the server refused for want of room (its host's last connections are kept for
 * other engines' first lanes) stays left alone for option room_retry_ms, doubled for each
 * such refusal in a row, up to this many times as long.
 */
#define TCP_ROOM_BACKOFF_MAX 32u
/* The serving side warns of refusals for want of room at most once per this, with a count. */
#define TCP_ROOM_WARN_NS 60000000000ull
#define TCP_STALL_TICKS 3u /* ticks without progress that break a lane with cancels */
#define TCP_EVENTS 64

#define TCP_ACCESS_ALL (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)
#define TCP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TCP_MAX(a, b) ((a) > (b) ? (a) : (b))

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

struct tcp_rkey {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	struct tcp_rkey *prev, *next; /* instance list, so fini can free what the core kept */
};

/*
 * Receive state of one connection. Headers (and error details) collect in buf; a payload
 * goes to dst directly, except small ones (gulp) and bytes that arrived in the same read as
 * preceding frames (bulk mode): those are copied out of buf.
 */
struct tcp_rx {
	uint8_t *buf;  /* cap bytes */
	uint32_t cap;  /* TCP_RBUF, or TCP_RBUF_BIG once bulk receiving pays */
	uint32_t gulp; /* payloads of at most this many bytes go through buf; 0: none */
	uint32_t pos, end;
	bool bulk;    /* the last frame carried no payload: read ahead */
	bool payload; /* a payload is being received */
	bool small;   /* ... of at most gulp bytes: read through buf (tcp_rx_through) */
	uint8_t *dst; /* where it goes; NULL: discarded */
	uint64_t left;
	uint64_t room; /* > 0: at most this many bytes reach dst per read (a staging buffer) */
	/*
	 * The lane's own buffer while buf holds what a scatter read must hand back to the
	 * parser (tcp_lane_rx_scatter); buf is freed and this one restored once it is read.
	 */
	uint8_t *spare;
	uint32_t spare_cap;
	/*
	 * The worker heard a hang-up or error on this connection (set whoever owns the receive
	 * side now; relaxed): readers go on to end of stream, since the FIN behind the last
	 * bytes may signal no second event. Cleared when a lane breaks.
	 */
	atomic_bool hup;
};

/*
 * The payload in progress is small: read through buf (in bulk, then copied out), not into
 * dst. Decided per frame, so the tail of a large payload never drags the next frames
 * through the buffer.
 */
static inline bool tcp_rx_through(const struct tcp_rx *rx)
{
	return rx->payload && rx->small && !rx->room;
}

/*
 * Whether a reader may stop after a short read (@short_read: tcp_rx_read's *drained), as if
 * told EAGAIN. Between frames, or in a small payload (read through buf): yes, the sender
 * paused. In a large payload going to its destination, the rest is usually on its way:
 * reading on until EAGAIN catches it without a wake-up (64 KiB WRITEs from 2 threads, 5
 * interleaved rounds: median 54k against 49k requests/s stopping there). After a hang-up:
 * no, on to end of stream.
 */
static inline bool tcp_rx_may_stop(const struct tcp_rx *rx, bool short_read)
{
	return short_read && (!rx->payload || tcp_rx_through(rx)) &&
	       !atomic_load_explicit(&rx->hup, memory_order_relaxed);
}

/*
 * The longest failure text a slice carries: a lane's failure wraps the server's refusal (up
 * to 200 bytes on the wire, about 110 in practice) in the peer's name and address.
 */
#define TCP_DETAIL_MAX 192

/*
 * Per-slice plugin state, in slice->priv: 72 bytes, so that with the core's slice it fills
 * four cache lines (a batch of 32768 4K READs walks 8 MiB of slices rather than 14). The
 * failure text is not kept in place: it is allocated when a slice fails (tcp_priv_detail)
 * and freed once reported (tcp_report_priv); NULL on the way to success.
 */
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
	char *detail; /* why it failed (malloc'd), or NULL: the status's own text */
};
_Static_assert(sizeof(struct tcp_spriv) <= 256, "slice_priv_size is at most 256 bytes");
_Static_assert(sizeof(struct tcp_spriv) <= 72, "tcp_spriv grew: the slice stride with it");

/* Slot flags. A slot completes once SENT and ANSWERED are both set; whoever sets the later. */
#define TCP_SLOT_USED (1u << 0)
#define TCP_SLOT_IN_IOV (1u << 1)   /* part of a sendmsg in progress: cannot be unqueued */
#define TCP_SLOT_SENT (1u << 2)	    /* the whole request left; the sender is done with it */
#define TCP_SLOT_RECV (1u << 3)	    /* its payload is being received into slice->local */
#define TCP_SLOT_ANSWERED (1u << 4) /* the response was fully processed */
#define TCP_SLOT_CANCELED (1u << 5) /* cancel asked; report TE_ERR_CANCELED */
#define TCP_SLOT_ORPHAN (1u << 6)   /* already reported; waits only for its response */
#define TCP_SLOT_WIRED (1u << 7)    /* gathered for a sendmsg: its place in the order is known */
#define TCP_SLOT_NEXT (1u << 8)	    /* next: the request sent right after it on this connection */

struct tcp_slot {
	struct te_plugin_slice *slice; /* NULL when free or orphaned */
	uint64_t length;
	uint16_t gen;
	uint16_t flags;
	uint8_t op;
	uint8_t owner; /* 1 + the index of the submitting thread's own lane (tcp_owner_add); 0: none */
	uint32_t next; /* request id (TCP_SLOT_NEXT) */
};

/* The request id of slot @id (generation and index) as on the wire. */
static inline uint32_t tcp_slot_rid(const struct tcp_slot *slot, uint32_t id)
{
	return (uint32_t)slot->gen << 16 | id;
}

/*
 * Which answer a lane expects next (the server answers a connection's requests in the
 * order they came): the first request sent on the connection, the request sent after
 * @expect, or @expect itself.
 */
enum tcp_expect {
	TCP_EXPECT_FIRST,
	TCP_EXPECT_AFTER,
	TCP_EXPECT_ID,
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
	char err_detail[TCP_DETAIL_MAX];

	struct te_plugin_slice *sq_head, *sq_tail; /* requests not completely sent */
	uint64_t sq_off;			   /* bytes of sq_head's frame already sent */
	uint8_t *txh;	  /* txh_cap headers: the sender's copies (owned while sending) */
	uint32_t txh_cap; /* TCP_TXH_FIRST, then TCP_TXH_FRAMES once a sendmsg had more */
	bool txh_short;	  /* the last sendmsg had more header-only frames than txh_cap */
	/* HELLO and AUTH bytes not yet sent (ctl, at the end); they precede every request. */
	uint32_t ctl_len, ctl_off;
	enum tcp_hs hs;
	uint64_t epoch;	  /* of the current (or last) connection; each connect takes the next */
	uint64_t base_ns; /* when its HELLO answer arrived: request deadlines count from it */
	bool refused;	  /* the last connect was refused: nobody listens at the address */
	bool peer_closed; /* the server closed or reset this connection (EOF, ECONNRESET) */
	/*
	 * errno of a send that failed (EPIPE, ECONNRESET) before the handshake was answered,
	 * and when: the server may have answered the HELLO or AUTH (a refusal for want of room)
	 * before it reset the connection, so the receive side reads that first and fails the
	 * lane with it; the tick fails it with the send's error if it is still up a tick later.
	 * Nothing is sent meanwhile. Under lock.
	 */
	int send_err;
	uint64_t send_err_ns;
	/* A WRITE waits for a fence from a connection the server did not close itself. */
	bool fence_unclosed;

	/* WRITEs of torn-down connections waiting for the server's fence (tcp_spriv.fencing). */
	struct te_plugin_slice *fence_head, *fence_tail;
	uint32_t n_fence;
	uint64_t fence_connect_ns; /* when a reconnect for the fence last started */
	/*
	 * Until then submit keeps off this lane: its last connection failed before the server
	 * accepted it (a connection limit, say) while another lane of the peer was up or
	 * connecting, and its requests moved there (tcp_lane_move; relaxed: a hint).
	 */
	_Atomic uint64_t shun_until_ns;
	bool full_noted; /* under lock: a refusal for want of the server's room was logged since
			  * the lane was last served */
	/*
	 * Under lock: the server answered this connection's HELLO (or AUTH) with TE_ERR_AGAIN, no
	 * room for the lane, so it served none of its requests (tcp_lane_break moves them all).
	 */
	bool full_refused;
	/*
	 * Under lock: such refusals in a row since the lane was last served, and how long the
	 * last one left it alone (ms; 0 once served): statistics "room_refusals_in_row",
	 * "room_wait_ms".
	 */
	uint32_t room_streak;
	uint32_t room_wait_ms;

	struct tcp_slot *slots;
	/*
	 * Free slot ids, a ring: taken at free_head, given back behind the n_free there (cap:
	 * free_cap, the ids handed out so far: 0 .. free_cap - 1, the slot table's size; both
	 * grow towards max_inflight, under the lane lock, which every slot access holds).
	 * First in, first out, so that a lane's slots are taken in id order and
	 * the answer chain of a long run of requests walks the slot table forwards, not in
	 * the scrambled order a stack of freed ids falls into (READ 4K x32768 from 2 threads:
	 * the chain walk 0.073 -> 0.042 us per answer, 1.07x the requests/s; bench/README.md).
	 * It also leaves a freed id unused for as long as possible before its generation moves.
	 */
	uint32_t *free_ids;
	uint32_t free_head;
	uint32_t free_cap;
	uint32_t n_free;
	/* Worker's tick, under lock: ticks the grown table sat idle, st_slices then. */
	uint32_t idle_ticks;
	uint64_t idle_slices;
	uint32_t n_orphan;
	uint32_t n_canceled;

	/*
	 * Held by the worker around each read into a slice's destination. cancel sets
	 * rx_redirect and then takes rx_lock once: after that no byte of the canceled READ
	 * reaches its destination (the rest is discarded).
	 */
	pthread_mutex_t rx_lock;
	atomic_bool rx_redirect;

	/*
	 * Receive side ownership (progress 'caller', under lock): the thread in the receive
	 * loop (tcp_lane_rx_run), either the lane's worker or the application thread driving
	 * progress (rx_driver). Another thread that wants to read meanwhile sets rx_missed and
	 * leaves it to the owner, which runs the loop again before it lets go.
	 */
	bool rx_busy;
	bool rx_driver; /* the owner is the driver: tcp_lane_break waits for it (kick) */
	bool rx_missed;
	bool rx_want;	       /* tcp_lane_service should read (the driver stopped at its budget) */
	bool rx_quiet;	       /* EPOLLIN off: a driver polls this lane (tcp_drive) */
	uint32_t n_drivers;    /* threads between tcp_drive 1 and 0 on it; > 0 pins the lane */
	uint64_t drive_end_ns; /* when n_drivers last dropped to 0, leaving it quiet (tcp_drive) */
	bool bulk_writes;      /* the last submit here as a thread's own: > 1 MiB of WRITEs */
	uint32_t n_big;	       /* slots in use of at least TCP_DRV_MAX_SLICE: left to the worker */
	bool out_armed;	       /* EPOLLOUT is in the socket's epoll events */
	/* Slots in use, orphans included: which lanes a driver polls (relaxed: a hint). */
	_Atomic uint32_t used;
	/*
	 * When a thread last queued a request on this lane as its own: a lane used so within
	 * TCP_HOME_RECENT_NS is not borrowed for another thread's WRITEs (relaxed: a hint).
	 */
	_Atomic uint64_t home_ns;
	/*
	 * When a thread whose own lane this is last submitted to this peer, on whatever lane
	 * (relaxed: a hint): while another thread did so within TCP_OWNER_RECENT_NS, or has
	 * requests in flight to it (tcp_owner_busy), a thread does not stripe its large slices but
	 * keeps them on its own lane.
	 */
	_Atomic uint64_t owner_ns;
	/*
	 * Requests in flight to this peer of the threads whose own lane this is
	 * (tcp_owner_add, tcp_owner_busy): on this lane (owner_home: under this lane's lock,
	 * one writer at a time), and on the peer's other lanes (owner_away: changed under each
	 * of those lanes' locks, so by atomic adds).
	 */
	_Atomic uint32_t owner_home;
	_Atomic uint32_t owner_away;

	/*
	 * Under lock: the order requests go out in (wired_last: the last one gathered, when
	 * wired_ok) and the answer expected next, for scatter reads (tcp_lane_rx_scatter).
	 * Reset per connection.
	 */
	uint32_t wired_last;
	bool wired_ok;
	enum tcp_expect expect_st;
	uint32_t expect;

	/* Owner of the receive side only (rx_busy). */
	struct tcp_rx rx;
	uint32_t rx_slot;
	bool rx_flush; /* the handshake advanced: send what waited for it */

	/* Worker only. */
	uint64_t seen_progress;
	uint32_t stall_ticks;
	/* relaxed: a progress counter compared across housekeeping ticks only */
	_Atomic uint64_t progress;

	/* Under the worker's lock. */
	bool in_todo;
	struct tcp_lane *todo_next;
	struct tcp_lane *wprev, *wnext;

	/*
	 * Statistics (tcp_stats): slices and payload bytes queued on this lane, connections
	 * opened. Written under lock (one writer at a time, so a relaxed load and store, no
	 * read-modify-write), read by tcp_stats without it (relaxed: counters).
	 */
	_Atomic uint64_t st_slices, st_bytes;
	_Atomic uint64_t st_connects;
	_Atomic uint64_t st_driven; /* slices whose answer a waiting thread read (tcp_progress) */
	_Atomic uint64_t st_scattered;	  /* answers a scatter read put in place */
	_Atomic uint64_t st_replayed;	  /* scatter reads that met an answer not foreseen */
	_Atomic uint64_t st_room_refused; /* connections the server refused for want of room */
	_Atomic uint64_t st_room_woken;	  /* a driver's sleep ended by room in a full socket */
	_Atomic uint64_t st_sends;	  /* sendmsg calls that moved request bytes */

	/* Cold: used once per connection. */
	uint8_t nonce_c[TCP_NONCE];
	uint8_t ctl[TCP_CTL];
};

/* Add @n to a statistics counter; its writers are serialized by a lock. */
static inline void tcp_stat_add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

/* Add @d to a slot count of @l. Under lock (one writer at a time). */
static inline void tcp_count_add(_Atomic uint32_t *c, int d)
{
	atomic_store_explicit(c, (uint32_t)((int)atomic_load_explicit(c, memory_order_relaxed) + d),
			      memory_order_relaxed);
}

/* Count @d slots into or out of use on @l. Under lock. */
static inline void tcp_used_add(struct tcp_lane *l, int d)
{
	tcp_count_add(&l->used, d);
}

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
	struct te_plugin_naming_peer np; /* under ti->naming */
	struct tcp_peer *prev, *next;	 /* instance list, under ti->lock */
	uint32_t n_lanes;
	struct tcp_lane lanes[];
};

/*
 * Count @d requests on @l (under its lock) into or out of flight for the threads whose own
 * lane is the peer's lane @own. On @l itself a plain update (one writer: @l's lock holder);
 * on another lane an atomic add, as every lane's lock holder may change that count at once
 * (a load and a store there lost updates: the count stayed above 0 for good,
 * /tcp/stats/owner-counts).
 */
static inline void tcp_owner_add(struct tcp_lane *l, uint32_t own, int d)
{
	struct tcp_lane *o = &l->peer->lanes[own];

	if (o == l)
		tcp_count_add(&l->owner_home, d);
	else
		atomic_fetch_add_explicit(&o->owner_away, (uint32_t)d, memory_order_relaxed);
}

/* Requests in flight of the threads whose own lane is @c (relaxed: a hint). */
static inline uint32_t tcp_owner_busy(const struct tcp_lane *c)
{
	return atomic_load_explicit(&c->owner_home, memory_order_relaxed) +
	       atomic_load_explicit(&c->owner_away, memory_order_relaxed);
}

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
	/*
	 * An error's detail, sent as its payload: TCP_DETAIL_WIRE bytes allocated when the
	 * answer becomes an error, freed once it is sent (tcp_conn_retire) or with the
	 * connection. Out of line: errors are rare, and an entry is 88 bytes instead of 280.
	 */
	char *detail;
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
	/*
	 * Request deadlines count from it: when the HELLO was read, then again right before the
	 * first byte of its answer is sent (base_at_send). Either comes before the client's
	 * base (the answer's arrival there); the second keeps a stall of this side between
	 * reading the HELLO and answering it out of every deadline of the connection.
	 */
	uint64_t base_ns;
	bool base_at_send;
	uint64_t frame_start_ns;   /* first byte of the frame being received; 0: none */
	uint64_t active_ns;	   /* last complete frame (idle timeout) */
	uint64_t frames;	   /* complete frames so far */
	uint32_t ctl_len, ctl_off; /* of ctl: handshake answers, sent before any response */
	struct tcp_rx rx;
	/*
	 * The region the last request fell in, copied from the table at region version hot_ver:
	 * the next requests usually fall in it too, and are checked against it without the
	 * region lock while the version holds (tcp_conn_lookup). hot_end 0: none.
	 */
	uint64_t hot_ver, hot_start, hot_end;
	uint32_t hot_access, hot_type;
	int32_t hot_dev;
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
	/* When a lane left quiet by tcp_drive 0 is due (tcp_worker_linger_due); 0: none */
	_Atomic uint64_t linger_due_ns;
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
	uint64_t stripe_min; /* slices this large are striped over the lanes */
	/*
	 * wait_hold_us: how long a lane stays quiet after its last driver left with nothing
	 * in flight on it (tcp_drive 0), when its last batch sent more WRITE payload than
	 * TCP_INLINE_BYTES. The thread usually submits its next batch and waits
	 * again within that, and reads the answers itself; the lane's worker, which would
	 * otherwise read them on the other CPU while that thread still sends on the same
	 * socket, takes over when it lapses (measured: README.md). 0: at once.
	 */
	uint64_t wait_hold_ns;
	uint64_t connect_timeout_ms;
	uint64_t sockbuf;    /* SO_SNDBUF/SO_RCVBUF; 0: kernel autotuning */
	char congestion[16]; /* TCP_CONGESTION (TCP_CA_NAME_MAX); "": the host's default */
	uint64_t max_conns, max_conns_per_host, max_unauth;
	uint64_t hello_timeout_ms, idle_timeout_ms, frame_timeout_ms;

	bool auth;	      /* the engine has a secret: data connections authenticate */
	atomic_uint n_conns;  /* accepted connections open */
	atomic_uint n_unauth; /* of them, not READY yet */
	/* Refused connections: one warning per second at most (accepting worker only). */
	uint64_t refuse_log_ns;
	uint32_t refused_quiet;
	/*
	 * Lanes refused for want of room: as the server, how many (statistics
	 * "room_refused"), when the last warning was and how many went unwarned since
	 * (tcp_warn_room); as the client, whether one was warned of yet (the others are
	 * logged at info: one warning per engine tells the operator what to change).
	 */
	_Atomic uint64_t st_room_refused;
	_Atomic uint64_t room_warn_ns;
	atomic_uint room_quiet;
	atomic_bool room_warned;
	uint64_t room_retry_ns; /* option room_retry_ms */

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
	struct te_plugin_regions regions; /* handles: struct tcp_mem */
	_Atomic uint64_t reg_ver; /* written under the write lock, read under the read lock */

	pthread_mutex_t lock; /* peers, rkeys, round-robin counters */
	/* A peer is named to the host (peer_event) only before its unload_peer returns. */
	struct te_plugin_naming naming;
	struct tcp_peer *peers;
	struct tcp_rkey *rkeys;
	uint32_t next_peer_worker;
	atomic_uint next_conn_worker;

	struct tcp_worker *workers;
	atomic_bool stopping;

	/*
	 * progress 'caller' (hybrid, TE_PLUGIN_CAP_HYBRID_PROGRESS and _PER_THREAD): each
	 * thread waiting in te_batch_wait reads the answers on its own lanes (tcp_progress).
	 */
	bool hybrid;
	uint32_t scatter_max; /* bytes per scatter read (option scatter); 0: none */
};

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

/* The slot ids a lane starts with (and goes back to when idle: tcp_lane_shrink_tick_locked). */
static inline uint32_t tcp_slots_first(const struct tcp_inst *ti)
{
	return TCP_MIN(ti->max_inflight, TCP_SLOTS_INITIAL);
}

/* Every one of @l's @cap slot ids free, in id order (a new lane, or one shrunk). Under lock. */
static inline void tcp_lane_ids_reset(struct tcp_lane *l, uint32_t cap)
{
	for (uint32_t k = 0; k < cap; k++)
		l->free_ids[k] = k;
	l->free_head = 0;
	l->n_free = l->free_cap = cap;
}

static inline struct tcp_spriv *tcp_priv(const struct te_plugin_slice *s)
{
	return (struct tcp_spriv *)s->priv;
}

static inline uint64_t tcp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * What a side proves with its MAC (host->auth_mac): its role, the server instance, the
 * client's lane and epoch and both fresh nonces, so a proof is good for this connection only.
 */
#define TCP_TRANSCRIPT (16 + 8 + 8 + 8 + 4 + 2 * TCP_NONCE)

/* A list of slices to report, linked through tcp_spriv.next; reported without locks held. */
struct tcp_rlist {
	struct te_plugin_slice *head, *tail;
	uint32_t n;
};

/* --- internal interfaces ---------------------------------------------------------- */

/*
 * Inline: every frame passes here, and a call makes the caller read the fields back from
 * memory the callee wrote piecewise (a store-forwarding stall in the server's request loop).
 */
static inline void tcp_hdr_decode(const uint8_t *p, struct tcp_hdr *h)
{
	h->magic = te_plugin_get_u32(p);
	h->version = p[4];
	h->op = p[5];
	h->flags = te_plugin_get_u16(p + 6);
	h->req_id = te_plugin_get_u32(p + 8);
	h->status = (int32_t)te_plugin_get_u32(p + 12);
	h->addr = te_plugin_get_u64(p + 16);
	h->length = te_plugin_get_u64(p + 24);
}

/*
 * A header with @op, @req_id, @status, @addr and @length (flags 0) into @p. Inline too: one
 * per request on both sides, where a call cost about a sixth of what the encoding does.
 */
static inline void tcp_encode(uint8_t *p, uint8_t op, uint32_t req_id, int32_t status,
			      uint64_t addr, uint64_t length)
{
	te_plugin_put_u32(p, TCP_WIRE_MAGIC);
	p[4] = TCP_WIRE_VERSION;
	p[5] = op;
	te_plugin_put_u16(p + 6, 0);
	te_plugin_put_u32(p + 8, req_id);
	te_plugin_put_u32(p + 12, (uint32_t)status);
	te_plugin_put_u64(p + 16, addr);
	te_plugin_put_u64(p + 24, length);
}

/* tcp_wire.c */
void tcp_sa_text(const struct sockaddr_storage *sa, char *buf, size_t len);
void tcp_copy_detail(char *dst, size_t cap, const uint8_t *src, size_t len);
void tcp_priv_detail(struct te_plugin_slice *s, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);
void tcp_priv_detail_peer(struct te_plugin_slice *s, const uint8_t *src, size_t len);
bool tcp_random(void *buf, size_t len);
void tcp_transcript(uint8_t out[TCP_TRANSCRIPT], bool server, uint64_t instance, uint64_t cid,
		    uint64_t epoch, uint32_t lane, const uint8_t *nonce_c, const uint8_t *nonce_s);
void tcp_sock_abort(int fd);
void tcp_sock_cc(const struct tcp_inst *ti, int fd);
void tcp_sock_tune(const struct tcp_inst *ti, int fd);
/* Whether a non-blocking connect on @fd has completed: no pending error and a peer. */
bool tcp_sock_connected(int fd);
ssize_t tcp_rx_read(int fd, struct tcp_rx *rx, uint8_t *scratch, size_t scratch_len, size_t need,
		    bool *drained);
void tcp_rx_prefix(struct tcp_rx *rx);
void tcp_rx_restore(struct tcp_rx *rx);

/* tcp_server.c */
void tcp_conn_free(struct tcp_conn *c);
bool tcp_fence(struct tcp_inst *ti, struct tcp_conn *c, uint64_t *newest_out);
bool tcp_conn_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c);
void tcp_conn_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c, uint32_t events);
void tcp_accept(struct tcp_inst *ti, struct tcp_worker *w0);
void tcp_conns_tick(struct tcp_inst *ti, struct tcp_worker *w, uint64_t now);

/* tcp_worker.c */
void tcp_worker_wake_locked(struct tcp_worker *w);
void tcp_kick_lane(struct tcp_lane *l);
void tcp_defer_fail(struct tcp_worker *w, struct te_plugin_slice *s, enum te_status st,
		    const char *detail);
void tcp_again_add(struct tcp_worker *w, struct tcp_ep *ep);
void tcp_again_remove(struct tcp_worker *w, struct tcp_ep *ep);
void tcp_warn_limited(struct tcp_inst *ti, struct tcp_worker *w, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
void *tcp_worker_main(void *arg);

/* tcp_client.c */
void tcp_report_priv(struct tcp_inst *ti, struct te_plugin_slice *s);
void tcp_lane_fail_locked(struct tcp_lane *l, enum te_status st, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
/* Fail @l for a send that failed with errno @err ("send to ... failed: ..."). */
void tcp_lane_send_failed_locked(struct tcp_lane *l, int err);
uint32_t tcp_rlist_report(struct tcp_inst *ti, struct tcp_rlist *r);
void tcp_fence_take_locked(struct tcp_lane *l, bool all, uint64_t now, struct tcp_rlist *out);
void tcp_lane_break(struct tcp_inst *ti, struct tcp_lane *l, enum te_status st, const char *detail);
void tcp_lane_shrink_tick_locked(const struct tcp_inst *ti, struct tcp_lane *l);
void tcp_lane_connect_locked(struct tcp_inst *ti, struct tcp_lane *l);
void tcp_lane_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l);
void tcp_lane_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l, uint32_t events);
void tcp_worker_linger_due(struct tcp_inst *ti, struct tcp_worker *w);
void tcp_worker_linger(struct tcp_worker *w, uint64_t due);
void tcp_peer_free(struct tcp_inst *ti, struct tcp_peer *peer);
void tcp_lane_service(struct tcp_inst *ti, struct tcp_lane *l);
enum te_status tcp_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices, uint32_t n,
			  uint32_t *accepted_out);
enum te_status tcp_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s);
enum te_status tcp_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s);
uint32_t tcp_progress(struct te_plugin_inst *inst, uint32_t budget);
enum te_status tcp_wait(struct te_plugin_inst *inst, uint64_t timeout_ns);
void tcp_drive(struct te_plugin_inst *inst, uint32_t driving);

#endif /* TE_PLUGINS_TCP_H */
