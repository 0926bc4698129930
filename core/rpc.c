/* SPDX-License-Identifier: Apache-2.0 */
/* rpc.c: the control plane's epoll listener with its handler pool, and the client. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, POLLRDHUP; meson sets it, fuzz/run-libfuzzer.sh does not */
#endif
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include <te/te.h>

#include "core/log.h"
#include "core/rpc.h"

/* Largest body accepted before authentication: the AUTH frame's. */
#define RPC_AUTH_BODY (RPC_NONCE_SIZE + RPC_MAC_SIZE)
/* Bytes asked of recv() at a time; also the size above which buffers are not kept. */
#define RPC_READ_CHUNK (64u << 10)
/* "[" IPv6 text with a scope id "]:" port, NUL. */
#define RPC_PEER_MAX 96
/* Server: accept() results per wakeup, epoll events per wait. */
#define RPC_ACCEPT_BATCH 64
#define RPC_EPOLL_EVENTS 64
/* Server: how long the listener rests after accept() ran out of descriptors. */
#define RPC_LISTEN_PAUSE_US (100 * 1000)
/* Hard ceiling on a configured max_body (every size has a limit). */
#define RPC_MAX_BODY_LIMIT (1u << 30)
/* Client: idle connections kept (all addresses together) and for how long. */
#define RPC_CLIENT_MAX_IDLE 16u
#define RPC_CLIENT_IDLE_US (2 * G_USEC_PER_SEC)
/* Client: bytes of a peer's error text quoted in err_out. */
#define RPC_ERROR_TEXT_MAX 200u
/* Client: a greeting, an AUTH_OK or an RPC_ERROR frame is never bigger than this. */
#define RPC_GREETING_MAX_BODY 4096u

static const char rpc_label_client[] = "te-rpc-v1 client";
static const char rpc_label_server[] = "te-rpc-v1 server";

/* --- shared helpers -------------------------------------------------------------------- */

static int64_t rpc_now_us(void)
{
	return g_get_monotonic_time();
}

/* HMAC-SHA256(secret, label || server nonce || client nonce). */
static void rpc_mac(const char *secret, size_t secret_len, const char *label,
		    const uint8_t *server_nonce, const uint8_t *client_nonce,
		    uint8_t out[RPC_MAC_SIZE])
{
	GHmac *h = g_hmac_new(G_CHECKSUM_SHA256, (const guchar *)secret, secret_len);
	gsize n = RPC_MAC_SIZE;

	g_hmac_update(h, (const guchar *)label, (gssize)strlen(label));
	g_hmac_update(h, server_nonce, RPC_NONCE_SIZE);
	g_hmac_update(h, client_nonce, RPC_NONCE_SIZE);
	g_hmac_get_digest(h, out, &n);
	assert(n == RPC_MAC_SIZE);
	g_hmac_unref(h);
}

/* Constant-time comparison: a timing side channel must not reveal a MAC prefix. */
static bool rpc_mac_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t diff = 0;

	for (size_t i = 0; i < RPC_MAC_SIZE; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

static bool rpc_random(uint8_t *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = getrandom(buf + done, len - done, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		done += (size_t)n;
	}
	return true;
}

/* A copy of a secret (any bytes), wiped by rpc_secret_free. */
static char *rpc_secret_dup(const void *secret, size_t len)
{
	char *copy = g_malloc(len);

	memcpy(copy, secret, len);
	return copy;
}

static void rpc_secret_free(char *secret, size_t len)
{
	if (!secret)
		return;
	explicit_bzero(secret, len);
	g_free(secret);
}

bool rpc_ratelimit_pass(struct rpc_ratelimit *rl, uint32_t burst, int64_t now_us,
			uint32_t *demoted_out)
{
	if (now_us - rl->window_us >= G_USEC_PER_SEC || rl->window_us == 0) {
		rl->window_us = now_us;
		rl->passed = 0;
	}
	if (rl->passed >= burst) {
		rl->demoted++;
		return false;
	}
	rl->passed++;
	*demoted_out = rl->demoted;
	rl->demoted = 0;
	return true;
}

/*
 * Split "host:port" or "[v6]:port" into newly allocated parts. NULL with *why
 * (static text) when malformed.
 */
static bool rpc_addr_split(const char *addr, char **host_out, char **port_out, const char **why)
{
	const char *colon, *port;
	char *host;

	if (addr[0] == '[') {
		const char *close = strchr(addr, ']');

		if (!close || close == addr + 1 || close[1] != ':') {
			*why = "expected [IPv6]:port";
			return false;
		}
		host = g_strndup(addr + 1, (gsize)(close - addr - 1));
		port = close + 2;
	} else {
		colon = strrchr(addr, ':');
		if (!colon || colon == addr) {
			*why = "expected host:port";
			return false;
		}
		if (memchr(addr, ':', (size_t)(colon - addr))) {
			*why = "an IPv6 host needs brackets: [host]:port";
			return false;
		}
		host = g_strndup(addr, (gsize)(colon - addr));
		port = colon + 1;
	}
	if (port[0] == '\0' || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port) ||
	    atoi(port) > 65535) {
		g_free(host);
		*why = "port must be a number 0..65535";
		return false;
	}
	*host_out = host;
	*port_out = g_strdup(port);
	return true;
}

/*
 * "a.b.c.d:port" or "[v6]:port" of a socket address into @out, and the address alone
 * ("a.b.c.d", "v6") into @host_out when not NULL; "?" when it has no numeric form.
 */
static void rpc_sockaddr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t size,
			     char *host_out, size_t host_size)
{
	char host[NI_MAXHOST], port[NI_MAXSERV];

	if (getnameinfo(sa, len, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		snprintf(out, size, "?");
		if (host_out)
			snprintf(host_out, host_size, "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(out, size, "[%s]:%s", host, port);
	else
		snprintf(out, size, "%s:%s", host, port);
	if (host_out)
		snprintf(host_out, host_size, "%s", host);
}

static bool rpc_sockaddr_is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;

		return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
		       (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
	}
	return false;
}

static void rpc_set_nodelay(int fd)
{
	int one = 1;

	/* Best effort: without it small frames only wait for the delayed ACK. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* --- server ---------------------------------------------------------------------------- */

/* Server: warnings per second that a flood could repeat (refusals, faults); rest: debug. */
#define RPC_WARN_REFUSED_PER_S 1u
#define RPC_WARN_FAULT_PER_S 20u

/* Why a connection's deadline passed (rpc_conn_deadline). */
enum rpc_expiry {
	RPC_EXPIRE_NONE,  /* a handler holds it: no deadline */
	RPC_EXPIRE_DRAIN, /* closing after an error; the client did not hang up */
	RPC_EXPIRE_AUTH,  /* not established within auth_timeout_ms of accept */
	RPC_EXPIRE_SEND,  /* output not taken within frame_timeout_ms */
	RPC_EXPIRE_FRAME, /* a frame not complete within frame_timeout_ms of its first byte */
	RPC_EXPIRE_IDLE,  /* nothing in flight for idle_timeout_ms */
};

struct rpc_conn {
	int fd;		  /* -1 once closed */
	bool authed;	  /* may send requests: true from the start without a secret */
	bool established; /* authenticated, or (no secret) sent a complete request */
	bool busy;	  /* a handler holds a job of this connection */
	bool closing;	  /* after an error: send what is queued, then drain and close */
	bool draining;	  /* closing, write side shut: discard input until EOF */
	uint32_t events;  /* epoll interest now */
	/*
	 * Deadlines (monotonic µs) follow from these; no single byte moves any of them,
	 * so a client trickling bytes cannot hold the connection (rpc_conn_deadline).
	 */
	int64_t accepted_us;	/* auth_timeout_ms counts from here */
	int64_t idle_since_us;	/* last complete frame in or reply out */
	int64_t frame_since_us; /* first byte of the frame being received */
	int64_t send_since_us;	/* when the output now queued started */
	int64_t drain_until_us;
	/*
	 * Input, one frame at a time: the header gathers in @head; once it is valid the
	 * whole frame is allocated at its exact size, its body reserved in srv->buffered,
	 * and nothing beyond it is read until it is consumed.
	 */
	uint8_t head[RPC_HEADER_SIZE];
	size_t head_len;
	uint8_t *frame;		     /* header and body, or NULL */
	struct rpc_frame_header hdr; /* of @frame */
	size_t frame_got;	     /* bytes of @frame in, header included */
	GByteArray *wbuf;	     /* queued for sending from woff */
	size_t woff;
	size_t wreserved; /* bytes of srv->buffered the reply in wbuf holds */
	uint8_t nonce[RPC_NONCE_SIZE];
	char peer[RPC_PEER_MAX];
	char host[RPC_PEER_MAX]; /* the peer's address without the port: the per-host key */
};

struct rpc_job {
	struct rpc_conn *conn; /* alive until the job comes back (busy) */
	struct rpc_request req;
	uint8_t *frame;	 /* header and body; req.body points into it */
	size_t reserved; /* bytes of srv->buffered, released when the job comes back */
	GByteArray *reply;
	enum te_status status;
};

struct rpc_server {
	char *secret; /* NULL: no authentication */
	size_t secret_len;
	rpc_handle_fn handle;
	void *user;
	struct log_sink *log;
	uint32_t max_body;
	size_t max_buffered;
	uint32_t idle_timeout_ms;
	uint32_t frame_timeout_ms;
	uint32_t auth_timeout_ms;
	uint32_t max_connections;
	uint32_t max_per_host;
	uint32_t max_unauthenticated;
	char address[RPC_PEER_MAX];

	int listen_fd;
	int epoll_fd;
	int wake_fd; /* eventfd: finished jobs and stop */
	bool listen_paused;
	int64_t listen_resume_us;
	int64_t next_sweep_us; /* no deadline falls before this; INT64_MAX: none */
	GThread *thread;
	GThreadPool *pool;
	atomic_bool stop;

	/* Only the I/O thread touches these. */
	GPtrArray *conns;	/* every struct rpc_conn not yet freed, closed-but-busy included */
	GPtrArray *graveyard;	/* closed, freed after the current batch of events */
	GHashTable *per_host;	/* host -> connections in conns from it (GUINT_TO_POINTER) */
	uint32_t unestablished; /* open connections not yet established */
	size_t buffered;	/* body bytes reserved, <= max_buffered */
	struct rpc_ratelimit warn_refused;
	struct rpc_ratelimit warn_fault;

	GMutex done_lock;
	GQueue done; /* struct rpc_job handed back by handler threads */

	/* epoll tags of the two descriptors that are not connections */
	char listen_tag;
	char wake_tag;
};

static void rpc_server_log(struct rpc_server *srv, struct rpc_ratelimit *rl, uint32_t burst,
			   const char *fmt, ...) G_GNUC_PRINTF(4, 5);

/* A warning a flood could repeat: rate-limited, the excess at debug level and counted. */
static void rpc_server_log(struct rpc_server *srv, struct rpc_ratelimit *rl, uint32_t burst,
			   const char *fmt, ...)
{
	g_autofree char *text = NULL;
	uint32_t demoted = 0;
	bool pass = rpc_ratelimit_pass(rl, burst, rpc_now_us(), &demoted);
	va_list ap;

	if (!log_enabled(srv->log, pass ? TE_LOG_WARN : TE_LOG_DEBUG))
		return;
	va_start(ap, fmt);
	text = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	if (!pass)
		log_msg(srv->log, TE_LOG_DEBUG, "%s", text);
	else if (demoted)
		log_msg(srv->log, TE_LOG_WARN,
			"%s (and %" PRIu32 " more like it since the last warning, logged at debug "
			"level)",
			text, demoted);
	else
		log_msg(srv->log, TE_LOG_WARN, "%s", text);
}

static void rpc_job_free(struct rpc_job *job)
{
	g_free(job->frame);
	g_byte_array_unref(job->reply);
	g_free(job);
}

static void rpc_conn_free(struct rpc_conn *conn)
{
	assert(conn->fd < 0);
	g_free(conn->frame);
	g_byte_array_unref(conn->wbuf);
	g_free(conn);
}

static bool rpc_conn_frame_ready(const struct rpc_conn *conn)
{
	return conn->frame && conn->frame_got == RPC_HEADER_SIZE + (size_t)conn->hdr.body_len;
}

static bool rpc_conn_sending(const struct rpc_conn *conn)
{
	return conn->woff < conn->wbuf->len;
}

/*
 * When @conn is closed, or acted upon, if nothing happens first, and why. No single
 * byte moves a deadline: idle time counts from the last complete frame or reply, a
 * frame's time from its first byte, and authentication's from accept.
 */
static int64_t rpc_conn_deadline(const struct rpc_server *srv, const struct rpc_conn *conn,
				 enum rpc_expiry *why_out)
{
	int64_t at;

	if (conn->draining) {
		*why_out = RPC_EXPIRE_DRAIN;
		return conn->drain_until_us;
	}
	if (conn->busy) {
		*why_out = RPC_EXPIRE_NONE;
		return INT64_MAX;
	}
	if (rpc_conn_sending(conn)) {
		*why_out = RPC_EXPIRE_SEND;
		at = conn->send_since_us + (int64_t)srv->frame_timeout_ms * 1000;
	} else if (conn->head_len || conn->frame) {
		*why_out = RPC_EXPIRE_FRAME;
		at = conn->frame_since_us + (int64_t)srv->frame_timeout_ms * 1000;
	} else {
		*why_out = RPC_EXPIRE_IDLE;
		at = conn->idle_since_us + (int64_t)srv->idle_timeout_ms * 1000;
	}
	if (!conn->established && conn->accepted_us + (int64_t)srv->auth_timeout_ms * 1000 <= at) {
		*why_out = RPC_EXPIRE_AUTH;
		at = conn->accepted_us + (int64_t)srv->auth_timeout_ms * 1000;
	}
	return at;
}

/* The sweep must not sleep past @conn's deadline. */
static void rpc_conn_arm(struct rpc_server *srv, const struct rpc_conn *conn)
{
	enum rpc_expiry why;

	srv->next_sweep_us = MIN(srv->next_sweep_us, rpc_conn_deadline(srv, conn, &why));
}

static void rpc_conn_establish(struct rpc_server *srv, struct rpc_conn *conn)
{
	if (conn->established)
		return;
	conn->established = true;
	assert(srv->unestablished > 0);
	srv->unestablished--;
}

/* Drop a partly or wholly received frame and its reservation. */
static void rpc_conn_drop_input(struct rpc_server *srv, struct rpc_conn *conn)
{
	if (conn->frame) {
		assert(srv->buffered >= conn->hdr.body_len);
		srv->buffered -= conn->hdr.body_len;
		g_clear_pointer(&conn->frame, g_free);
	}
	conn->frame_got = 0;
	conn->head_len = 0;
}

static void rpc_conn_release_output(struct rpc_server *srv, struct rpc_conn *conn)
{
	assert(srv->buffered >= conn->wreserved);
	srv->buffered -= conn->wreserved;
	conn->wreserved = 0;
}

/* Output is about to be queued: its send time counts from now unless some is pending. */
static void rpc_conn_out_begin(struct rpc_conn *conn)
{
	if (!rpc_conn_sending(conn))
		conn->send_since_us = rpc_now_us();
}

/* Forget @conn; it is freed after the current batch of events (one may still name it). */
static void rpc_conn_bury(struct rpc_server *srv, struct rpc_conn *conn)
{
	guint n = GPOINTER_TO_UINT(g_hash_table_lookup(srv->per_host, conn->host));

	assert(n > 0);
	if (n <= 1)
		g_hash_table_remove(srv->per_host, conn->host);
	else
		g_hash_table_insert(srv->per_host, g_strdup(conn->host), GUINT_TO_POINTER(n - 1));
	g_ptr_array_remove_fast(srv->conns, conn);
	g_ptr_array_add(srv->graveyard, conn);
}

static void rpc_conn_close(struct rpc_server *srv, struct rpc_conn *conn, enum te_log_level level,
			   const char *fmt, ...) G_GNUC_PRINTF(4, 5);

/* Close @conn, logging why: faults (warn) through the rate limit, the rest at @level. */
static void rpc_conn_close(struct rpc_server *srv, struct rpc_conn *conn, enum te_log_level level,
			   const char *fmt, ...)
{
	va_list ap;

	if (log_enabled(srv->log, level) || level == TE_LOG_WARN) {
		g_autofree char *why = NULL;

		va_start(ap, fmt);
		why = g_strdup_vprintf(fmt, ap);
		va_end(ap);
		if (level == TE_LOG_WARN)
			rpc_server_log(srv, &srv->warn_fault, RPC_WARN_FAULT_PER_S,
				       "rpc: %s: %s; connection closed", conn->peer, why);
		else
			log_msg(srv->log, level, "rpc: %s: %s; connection closed", conn->peer, why);
	}
	(void)epoll_ctl(srv->epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
	close(conn->fd);
	conn->fd = -1;
	rpc_conn_establish(srv, conn); /* no longer counts as waiting to authenticate */
	rpc_conn_drop_input(srv, conn);
	rpc_conn_release_output(srv, conn);
	/* A handler still holds the connection: the job's return buries it. */
	if (!conn->busy)
		rpc_conn_bury(srv, conn);
}

/* Interest follows the state: one thing at a time keeps every buffer bounded. */
static void rpc_conn_update(struct rpc_server *srv, struct rpc_conn *conn)
{
	uint32_t want = 0;
	struct epoll_event ev;

	if (conn->fd < 0)
		return;
	rpc_conn_arm(srv, conn);
	if (rpc_conn_sending(conn))
		want = EPOLLOUT;
	else if (!conn->busy && !rpc_conn_frame_ready(conn))
		want = EPOLLIN;
	if (want == conn->events)
		return;
	ev.events = want;
	ev.data.ptr = conn;
	if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, conn->fd, &ev) < 0) {
		rpc_conn_close(srv, conn, TE_LOG_WARN, "epoll_ctl: %s", g_strerror(errno));
		return;
	}
	conn->events = want;
}

static void rpc_conn_flush(struct rpc_server *srv, struct rpc_conn *conn)
{
	while (rpc_conn_sending(conn)) {
		ssize_t n = send(conn->fd, conn->wbuf->data + conn->woff,
				 conn->wbuf->len - conn->woff, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n < 0) {
			rpc_conn_close(srv, conn, TE_LOG_DEBUG, "send: %s", g_strerror(errno));
			return;
		}
		conn->woff += (size_t)n;
	}
	/* Do not keep a big reply's allocation for the connection's lifetime. */
	if (conn->wbuf->len > RPC_READ_CHUNK) {
		g_byte_array_unref(conn->wbuf);
		conn->wbuf = g_byte_array_new();
	} else {
		g_byte_array_set_size(conn->wbuf, 0);
	}
	conn->woff = 0;
	rpc_conn_release_output(srv, conn);
	conn->idle_since_us = rpc_now_us();
	if (conn->closing && !conn->draining) {
		/*
		 * Close gracefully: a close() with unread input sends a reset that may
		 * destroy the RPC_ERROR in flight, so shut the write side and discard
		 * input until the peer closes or the idle timeout (not extended) ends it.
		 */
		conn->draining = true;
		(void)shutdown(conn->fd, SHUT_WR);
		conn->drain_until_us = rpc_now_us() + (int64_t)srv->idle_timeout_ms * 1000;
	}
}

static void rpc_conn_fail(struct rpc_server *srv, struct rpc_conn *conn, enum te_status status,
			  const char *fmt, ...) G_GNUC_PRINTF(4, 5);

/* Refuse @conn: log the reason, send it as RPC_ERROR, close once that is out. */
static void rpc_conn_fail(struct rpc_server *srv, struct rpc_conn *conn, enum te_status status,
			  const char *fmt, ...)
{
	g_autofree char *why = NULL;
	va_list ap;

	va_start(ap, fmt);
	why = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	rpc_server_log(srv, &srv->warn_fault, RPC_WARN_FAULT_PER_S,
		       "rpc: %s: %s; closing the connection", conn->peer, why);
	rpc_conn_drop_input(srv, conn);
	rpc_conn_out_begin(conn);
	rpc_frame_append(conn->wbuf, RPC_ERROR, 0, status, why, strlen(why));
	conn->closing = true;
	rpc_conn_flush(srv, conn);
}

static void rpc_conn_auth(struct rpc_server *srv, struct rpc_conn *conn,
			  const struct rpc_frame_header *hdr, const uint8_t *body)
{
	uint8_t mac[RPC_MAC_SIZE];

	if (hdr->type != RPC_AUTH) {
		rpc_conn_fail(srv, conn, TE_ERR_AUTH, "%s before authentication",
			      rpc_type_str(hdr->type));
		return;
	}
	if (hdr->body_len != RPC_AUTH_BODY) {
		rpc_conn_fail(srv, conn, TE_ERR_PROTOCOL, "AUTH body of %" PRIu32 " bytes, not %u",
			      hdr->body_len, RPC_AUTH_BODY);
		return;
	}
	rpc_mac(srv->secret, srv->secret_len, rpc_label_client, conn->nonce, body, mac);
	if (!rpc_mac_equal(mac, body + RPC_NONCE_SIZE)) {
		rpc_conn_fail(srv, conn, TE_ERR_AUTH, "authentication failed (wrong secret)");
		return;
	}
	conn->authed = true;
	rpc_conn_establish(srv, conn);
	rpc_mac(srv->secret, srv->secret_len, rpc_label_server, conn->nonce, body, mac);
	rpc_conn_out_begin(conn);
	rpc_frame_append(conn->wbuf, RPC_AUTH_OK, hdr->request_id, TE_OK, mac, sizeof(mac));
	log_msg(srv->log, TE_LOG_DEBUG, "rpc: %s: authenticated", conn->peer);
	rpc_conn_flush(srv, conn);
}

/*
 * Hand a request to the handler pool; the connection waits (busy) until it returns.
 * The job takes @frame and its reservation of hdr->body_len bytes.
 */
static void rpc_conn_submit(struct rpc_server *srv, struct rpc_conn *conn,
			    const struct rpc_frame_header *hdr, uint8_t *frame)
{
	g_autofree char *why = NULL;
	g_autoptr(GError) gerr = NULL;
	struct rpc_job *job;
	struct rpc_request *req;

	job = g_new0(struct rpc_job, 1);
	job->conn = conn;
	job->frame = frame;
	job->reserved = hdr->body_len;
	job->reply = g_byte_array_new();
	req = &job->req;
	req->type = hdr->type;
	req->id = hdr->request_id;
	req->peer = conn->peer;
	req->host = conn->host;
	req->body = hdr->body_len ? frame + RPC_HEADER_SIZE : NULL;
	req->len = hdr->body_len;
	req->payload = req->body;
	req->payload_len = hdr->body_len;
	if ((hdr->type == RPC_HANDSHAKE || hdr->type == RPC_NOTIFY) &&
	    rpc_body_unpack(req->body, hdr->body_len, &req->name, &req->payload, &req->payload_len,
			    &why) != TE_OK) {
		srv->buffered -= job->reserved;
		rpc_job_free(job);
		rpc_conn_fail(srv, conn, TE_ERR_PROTOCOL, "%s body: %s", rpc_type_str(hdr->type),
			      why);
		return;
	}
	conn->busy = true;
	if (!g_thread_pool_push(srv->pool, job, &gerr)) {
		conn->busy = false;
		srv->buffered -= job->reserved;
		rpc_job_free(job);
		rpc_conn_fail(srv, conn, TE_ERR_SYSTEM, "cannot queue the request: %s",
			      gerr ? gerr->message : "?");
	}
}

/* Act on the complete frame received, once the connection is free to. */
static void rpc_conn_process(struct rpc_server *srv, struct rpc_conn *conn)
{
	struct rpc_frame_header hdr;
	uint8_t *frame;

	if (conn->fd < 0 || conn->busy || conn->closing || rpc_conn_sending(conn) ||
	    !rpc_conn_frame_ready(conn))
		return;
	hdr = conn->hdr;
	frame = g_steal_pointer(&conn->frame);
	conn->frame_got = 0;
	conn->idle_since_us = rpc_now_us();
	if (conn->authed && rpc_type_is_request(hdr.type)) {
		rpc_conn_establish(srv, conn);
		rpc_conn_submit(srv, conn, &hdr, frame);
		return;
	}
	if (!conn->authed)
		rpc_conn_auth(srv, conn, &hdr, frame + RPC_HEADER_SIZE);
	else
		rpc_conn_fail(srv, conn, TE_ERR_PROTOCOL, "unexpected %s frame from a client",
			      rpc_type_str(hdr.type));
	srv->buffered -= hdr.body_len;
	g_free(frame);
}

/* The header in conn->head is complete or refused: reserve and allocate the frame. */
static void rpc_conn_take_header(struct rpc_server *srv, struct rpc_conn *conn)
{
	/* Before authentication nothing bigger than an AUTH frame is accepted. */
	size_t limit = conn->authed ? srv->max_body : RPC_AUTH_BODY;
	g_autofree char *why = NULL;
	struct rpc_frame_header hdr;
	enum te_status st;

	st = rpc_header_decode(conn->head, conn->head_len, limit, &hdr, &why);
	if (st == TE_INPROGRESS)
		return;
	if (st != TE_OK) {
		rpc_conn_fail(srv, conn, TE_ERR_PROTOCOL, "%s", why);
		return;
	}
	if (hdr.body_len > srv->max_buffered - srv->buffered) {
		rpc_conn_fail(
			srv, conn, TE_ERR_BUSY,
			"server busy: a %" PRIu32 "-byte %s body does not fit in the memory "
			"for frames (%zu of %zu bytes in use, control.max_buffered); try again",
			hdr.body_len, rpc_type_str(hdr.type), srv->buffered, srv->max_buffered);
		return;
	}
	srv->buffered += hdr.body_len;
	log_msg(srv->log, TE_LOG_TRACE,
		"rpc: %s: %s frame, %" PRIu32 "-byte body reserved (%zu of %zu bytes in use)",
		conn->peer, rpc_type_str(hdr.type), hdr.body_len, srv->buffered, srv->max_buffered);
	conn->frame = g_malloc(RPC_HEADER_SIZE + (size_t)hdr.body_len);
	memcpy(conn->frame, conn->head, RPC_HEADER_SIZE);
	conn->frame_got = RPC_HEADER_SIZE;
	conn->hdr = hdr;
	conn->head_len = 0;
}

static void rpc_conn_read(struct rpc_server *srv, struct rpc_conn *conn)
{
	size_t budget = RPC_READ_CHUNK; /* per wakeup: one big frame must not starve others */

	if (conn->draining) {
		uint8_t sink[4096];
		ssize_t n = recv(conn->fd, sink, sizeof(sink), MSG_DONTWAIT);

		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			rpc_conn_close(srv, conn, TE_LOG_DEBUG, "closed after an error");
		return;
	}
	while (budget > 0 && conn->fd >= 0 && !conn->closing && !rpc_conn_frame_ready(conn)) {
		size_t have = conn->frame ? conn->frame_got : conn->head_len, want;
		uint8_t *dst;
		ssize_t n;

		if (conn->frame) {
			dst = conn->frame + conn->frame_got;
			want = MIN(RPC_HEADER_SIZE + (size_t)conn->hdr.body_len - conn->frame_got,
				   budget);
		} else {
			dst = conn->head + conn->head_len;
			want = RPC_HEADER_SIZE - conn->head_len;
		}
		n = recv(conn->fd, dst, want, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				rpc_conn_close(srv, conn, TE_LOG_DEBUG, "recv: %s",
					       g_strerror(errno));
			return;
		}
		if (n == 0) {
			if (have)
				rpc_conn_close(srv, conn, TE_LOG_WARN,
					       "peer closed mid-frame, %zu bytes into it", have);
			else
				rpc_conn_close(srv, conn, TE_LOG_DEBUG, "peer closed");
			return;
		}
		budget -= MIN((size_t)n, budget);
		if (!have)
			conn->frame_since_us = rpc_now_us();
		if (conn->frame) {
			conn->frame_got += (size_t)n;
		} else {
			conn->head_len += (size_t)n;
			rpc_conn_take_header(srv, conn);
		}
	}
}

static void rpc_conn_event(struct rpc_server *srv, struct rpc_conn *conn, uint32_t events)
{
	if (conn->fd < 0)
		return;
	if (events & EPOLLOUT)
		rpc_conn_flush(srv, conn);
	if (conn->fd >= 0 && (events & EPOLLIN))
		rpc_conn_read(srv, conn);
	else if (conn->fd >= 0 && (events & (EPOLLERR | EPOLLHUP)))
		rpc_conn_close(srv, conn, TE_LOG_DEBUG, "connection reset");
	rpc_conn_process(srv, conn);
	rpc_conn_update(srv, conn);
}

/* Queue a finished job's reply, if the memory budget takes it. */
static void rpc_conn_reply(struct rpc_server *srv, struct rpc_conn *conn, struct rpc_job *job)
{
	enum te_status st = job->status;
	GByteArray *body = job->reply;
	g_autofree char *text = NULL;
	const void *out;
	size_t len;

	if (body->len > srv->max_body) {
		log_msg(srv->log, TE_LOG_WARN, "rpc: %s: %s reply of %u bytes over limit %" PRIu32,
			conn->peer, rpc_type_str(job->req.type), body->len, srv->max_body);
		text = g_strdup_printf("reply of %u bytes over limit %" PRIu32, body->len,
				       srv->max_body);
		st = TE_ERR_TOO_LARGE;
	} else if (body->len > srv->max_buffered - srv->buffered) {
		text = g_strdup_printf(
			"server busy: a %u-byte reply does not fit in the memory for "
			"frames (%zu of %zu bytes in use, control.max_buffered); "
			"try again",
			body->len, srv->buffered, srv->max_buffered);
		rpc_server_log(srv, &srv->warn_fault, RPC_WARN_FAULT_PER_S, "rpc: %s: %s %s",
			       conn->peer, rpc_type_str(job->req.type), text);
		st = TE_ERR_BUSY;
	} else if (st != TE_OK && body->len == 0) {
		text = g_strdup(te_status_str(st));
	}
	out = text ? (const void *)text : (const void *)body->data;
	len = text ? strlen(text) : body->len;
	/* A short text always fits: the budget is at least max_body, and texts are small. */
	conn->wreserved = MIN(len, srv->max_buffered - srv->buffered);
	srv->buffered += conn->wreserved;
	rpc_conn_out_begin(conn);
	rpc_frame_append(conn->wbuf, (uint8_t)(job->req.type + 1), job->req.id, st, out, len);
}

/* Runs on a handler thread. */
static void rpc_server_work(gpointer data, gpointer user)
{
	struct rpc_job *job = data;
	struct rpc_server *srv = user;
	uint64_t one = 1;

	job->status = srv->handle(srv->user, &job->req, job->reply);
	g_mutex_lock(&srv->done_lock);
	g_queue_push_tail(&srv->done, job);
	g_mutex_unlock(&srv->done_lock);
	/* Fails only when the counter is saturated, and then the loop is awake anyway. */
	if (write(srv->wake_fd, &one, sizeof(one)) < 0)
		assert(errno == EAGAIN);
}

static void rpc_server_complete(struct rpc_server *srv)
{
	GQueue done = G_QUEUE_INIT;
	struct rpc_job *job;
	uint64_t count;

	if (read(srv->wake_fd, &count, sizeof(count)) < 0)
		assert(errno == EAGAIN);
	g_mutex_lock(&srv->done_lock);
	done = srv->done;
	g_queue_init(&srv->done);
	g_mutex_unlock(&srv->done_lock);
	while ((job = g_queue_pop_head(&done))) {
		struct rpc_conn *conn = job->conn;

		/* The request's memory is free before the reply's is taken. */
		assert(srv->buffered >= job->reserved);
		srv->buffered -= job->reserved;
		conn->busy = false;
		if (conn->fd < 0) {
			rpc_conn_bury(srv, conn);
		} else {
			rpc_conn_reply(srv, conn, job);
			rpc_conn_flush(srv, conn);
			rpc_conn_process(srv, conn);
			rpc_conn_update(srv, conn);
		}
		rpc_job_free(job);
	}
}

static void rpc_server_listen_enable(struct rpc_server *srv, bool on)
{
	struct epoll_event ev = { .events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_tag };

	if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, srv->listen_fd, &ev) < 0)
		log_msg(srv->log, TE_LOG_ERROR, "rpc: %s: epoll_ctl on the listener: %s",
			srv->address, g_strerror(errno));
	srv->listen_paused = !on;
}

/*
 * Why a new connection from @host is refused (a text naming the limit and its key),
 * or NULL when it may be served.
 */
static char *rpc_server_over_limit(struct rpc_server *srv, const char *host)
{
	guint from_host = GPOINTER_TO_UINT(g_hash_table_lookup(srv->per_host, host));

	if (srv->conns->len >= srv->max_connections)
		return g_strdup_printf("connection limit %" PRIu32
				       " reached (control.max_connections)",
				       srv->max_connections);
	if (from_host >= srv->max_per_host)
		return g_strdup_printf(
			"connection limit %" PRIu32
			" per host reached for %s (control.max_connections_per_host)",
			srv->max_per_host, host);
	if (srv->unestablished >= srv->max_unauthenticated)
		return g_strdup_printf("limit of %" PRIu32 " connections %s reached "
				       "(control.max_unauthenticated)",
				       srv->max_unauthenticated,
				       srv->secret ? "not yet authenticated"
						   : "without a first request yet");
	return NULL;
}

/* Refuse a connection over a limit, telling the client why if its buffer takes it. */
static void rpc_server_refuse(struct rpc_server *srv, int fd, const char *peer, const char *why)
{
	g_autoptr(GByteArray) frame = g_byte_array_new();

	rpc_server_log(srv, &srv->warn_refused, RPC_WARN_REFUSED_PER_S,
		       "rpc: %s: %s; connection refused", peer, why);
	rpc_frame_append(frame, RPC_ERROR, 0, TE_ERR_AGAIN, why, strlen(why));
	(void)!send(fd, frame->data, frame->len, MSG_NOSIGNAL | MSG_DONTWAIT);
	close(fd);
}

static void rpc_server_add(struct rpc_server *srv, int fd, const char *peer, const char *host)
{
	struct rpc_conn *conn;
	struct epoll_event ev;
	guint from_host;

	conn = g_new0(struct rpc_conn, 1);
	conn->fd = fd;
	conn->wbuf = g_byte_array_new();
	g_strlcpy(conn->peer, peer, sizeof(conn->peer));
	g_strlcpy(conn->host, host, sizeof(conn->host));
	conn->authed = srv->secret == NULL;
	if (!conn->authed && !rpc_random(conn->nonce, sizeof(conn->nonce))) {
		log_msg(srv->log, TE_LOG_ERROR, "rpc: %s: getrandom: %s; connection closed", peer,
			g_strerror(errno));
		close(fd);
		conn->fd = -1;
		rpc_conn_free(conn);
		return;
	}
	ev.events = 0;
	ev.data.ptr = conn;
	if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		log_msg(srv->log, TE_LOG_ERROR, "rpc: %s: epoll_ctl: %s; connection closed", peer,
			g_strerror(errno));
		close(fd);
		conn->fd = -1;
		rpc_conn_free(conn);
		return;
	}
	g_ptr_array_add(srv->conns, conn);
	from_host = GPOINTER_TO_UINT(g_hash_table_lookup(srv->per_host, host));
	g_hash_table_insert(srv->per_host, g_strdup(host), GUINT_TO_POINTER(from_host + 1));
	srv->unestablished++;
	rpc_set_nodelay(fd);
	log_msg(srv->log, TE_LOG_DEBUG, "rpc: %s: connected", peer);
	conn->accepted_us = conn->idle_since_us = rpc_now_us();
	rpc_conn_out_begin(conn);
	rpc_frame_append(conn->wbuf, RPC_HELLO, 0, TE_OK, conn->authed ? NULL : conn->nonce,
			 conn->authed ? 0 : RPC_NONCE_SIZE);
	rpc_conn_flush(srv, conn);
	rpc_conn_update(srv, conn);
}

static void rpc_server_accept(struct rpc_server *srv)
{
	for (int i = 0; i < RPC_ACCEPT_BATCH; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		char peer[RPC_PEER_MAX], host[RPC_PEER_MAX];
		g_autofree char *refused = NULL;
		int fd;

		fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			/* Out of descriptors or memory: rest rather than spin on the listener. */
			log_msg(srv->log, TE_LOG_WARN, "rpc: %s: accept: %s; pausing the listener",
				srv->address, g_strerror(errno));
			rpc_server_listen_enable(srv, false);
			srv->listen_resume_us = rpc_now_us() + RPC_LISTEN_PAUSE_US;
			srv->next_sweep_us = MIN(srv->next_sweep_us, srv->listen_resume_us);
			return;
		}
		rpc_sockaddr_str((struct sockaddr *)&ss, sl, peer, sizeof(peer), host,
				 sizeof(host));
		refused = rpc_server_over_limit(srv, host);
		if (refused)
			rpc_server_refuse(srv, fd, peer, refused);
		else
			rpc_server_add(srv, fd, peer, host);
	}
}

/* Close @conn, whose deadline passed for @why, saying which limit it ran into. */
static void rpc_conn_expire(struct rpc_server *srv, struct rpc_conn *conn, enum rpc_expiry why)
{
	size_t partial = conn->frame ? conn->frame_got : conn->head_len;
	g_autofree char *mid =
		partial ? g_strdup_printf("stalled mid-frame (%zu bytes of it): ", partial)
			: g_strdup("");

	switch (why) {
	case RPC_EXPIRE_DRAIN:
		rpc_conn_close(srv, conn, TE_LOG_DEBUG, "closed after an error");
		break;
	case RPC_EXPIRE_AUTH:
		if (srv->secret)
			rpc_conn_close(srv, conn, TE_LOG_WARN,
				       "%sdid not authenticate within %" PRIu32
				       " ms of connecting (control.auth_timeout_ms)",
				       mid, srv->auth_timeout_ms);
		else
			rpc_conn_close(srv, conn, TE_LOG_WARN,
				       "%ssent no complete request within %" PRIu32
				       " ms of connecting (control.auth_timeout_ms)",
				       mid, srv->auth_timeout_ms);
		break;
	case RPC_EXPIRE_SEND:
		rpc_conn_close(srv, conn, TE_LOG_WARN,
			       "not reading its reply (%zu bytes unsent) %" PRIu32
			       " ms after it was queued (control.frame_timeout_ms)",
			       conn->wbuf->len - conn->woff, srv->frame_timeout_ms);
		break;
	case RPC_EXPIRE_FRAME:
		rpc_conn_close(srv, conn, TE_LOG_WARN,
			       "%snot complete %" PRIu32
			       " ms after its first byte (control.frame_timeout_ms)",
			       mid, srv->frame_timeout_ms);
		break;
	case RPC_EXPIRE_IDLE:
		rpc_conn_close(srv, conn, TE_LOG_DEBUG, "idle for %" PRIu32 " ms",
			       srv->idle_timeout_ms);
		break;
	case RPC_EXPIRE_NONE:
		break;
	}
}

/* Close connections past their deadline; find the next deadline. */
static void rpc_server_sweep(struct rpc_server *srv)
{
	int64_t now = rpc_now_us(), next = INT64_MAX;

	if (srv->listen_paused) {
		if (now >= srv->listen_resume_us)
			rpc_server_listen_enable(srv, true);
		else
			next = srv->listen_resume_us;
	}
	/* Backwards: closing swaps the last element into the current slot. */
	for (guint i = srv->conns->len; i-- > 0;) {
		struct rpc_conn *conn = srv->conns->pdata[i];
		enum rpc_expiry why;
		int64_t at;

		if (conn->fd < 0)
			continue;
		at = rpc_conn_deadline(srv, conn, &why);
		if (now < at)
			next = MIN(next, at);
		else
			rpc_conn_expire(srv, conn, why);
	}
	srv->next_sweep_us = next;
}

static int rpc_server_wait_ms(const struct rpc_server *srv)
{
	int64_t left;

	if (srv->next_sweep_us == INT64_MAX)
		return -1;
	left = srv->next_sweep_us - rpc_now_us();
	if (left <= 0)
		return 0;
	return (int)MIN((left + 999) / 1000, (int64_t)INT_MAX);
}

static gpointer rpc_server_loop(gpointer data)
{
	struct rpc_server *srv = data;
	struct epoll_event evs[RPC_EPOLL_EVENTS];

	while (!atomic_load_explicit(&srv->stop, memory_order_acquire)) {
		int n = epoll_wait(srv->epoll_fd, evs, RPC_EPOLL_EVENTS, rpc_server_wait_ms(srv));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			/* Only a bug (bad descriptor, bad argument) gets here. */
			log_msg(srv->log, TE_LOG_ERROR, "rpc: %s: epoll_wait: %s; not serving",
				srv->address, g_strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++) {
			void *tag = evs[i].data.ptr;

			if (tag == &srv->listen_tag)
				rpc_server_accept(srv);
			else if (tag == &srv->wake_tag)
				rpc_server_complete(srv);
			else
				rpc_conn_event(srv, tag, evs[i].events);
		}
		if (rpc_now_us() >= srv->next_sweep_us)
			rpc_server_sweep(srv);
		g_ptr_array_remove_range(srv->graveyard, 0, srv->graveyard->len);
	}
	return NULL;
}

static enum te_status rpc_server_bind(struct rpc_server *srv, const char *addr, char **err_out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	g_autofree char *host = NULL, *port = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct addrinfo *res, *ai;
	const char *why;
	int rc, err = 0, one = 1;

	if (!rpc_addr_split(addr, &host, &port, &why))
		return rpc_fail(TE_ERR_CONFIG, err_out, "rpc: listen address '%s': %s", addr, why);
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
		return rpc_fail(TE_ERR_CONFIG, err_out, "rpc: listen address '%s': %s", addr,
				gai_strerror(rc));
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
				ai->ai_protocol);

		if (fd < 0) {
			err = errno;
			continue;
		}
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
			srv->listen_fd = fd;
			break;
		}
		err = errno;
		close(fd);
	}
	freeaddrinfo(res);
	if (srv->listen_fd < 0)
		return rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: listen on %s: %s", addr,
				g_strerror(err));
	if (getsockname(srv->listen_fd, (struct sockaddr *)&ss, &sl) < 0)
		return rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: getsockname: %s", g_strerror(errno));
	rpc_sockaddr_str((struct sockaddr *)&ss, sl, srv->address, sizeof(srv->address), NULL, 0);
	if (!srv->secret && !rpc_sockaddr_is_loopback(&ss))
		log_msg(srv->log, TE_LOG_WARN,
			"rpc: listening on %s without authentication: any host that reaches it "
			"may fetch the descriptor and send handshakes",
			srv->address);
	return TE_OK;
}

static void rpc_server_free(struct rpc_server *srv)
{
	struct rpc_job *job;

	while ((job = g_queue_pop_head(&srv->done)))
		rpc_job_free(job);
	for (guint i = 0; i < srv->conns->len; i++) {
		struct rpc_conn *conn = srv->conns->pdata[i];

		if (conn->fd >= 0)
			close(conn->fd);
		conn->fd = -1;
		rpc_conn_free(conn);
	}
	g_ptr_array_unref(srv->conns);
	g_ptr_array_unref(srv->graveyard);
	g_hash_table_destroy(srv->per_host);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	if (srv->epoll_fd >= 0)
		close(srv->epoll_fd);
	if (srv->wake_fd >= 0)
		close(srv->wake_fd);
	g_mutex_clear(&srv->done_lock);
	rpc_secret_free(srv->secret, srv->secret_len);
	g_free(srv);
}

/* A zero field's default. */
static uint32_t rpc_or(uint32_t v, uint32_t dflt)
{
	return v ? v : dflt;
}

enum te_status rpc_server_start(const struct rpc_server_config *cfg, struct rpc_server **srv_out,
				char **err_out)
{
	g_autoptr(GError) gerr = NULL;
	struct rpc_server *srv;
	enum te_status st;
	struct epoll_event ev;
	uint32_t max_body;
	uint64_t max_buffered;

	if (!cfg || !cfg->handle || !srv_out ||
	    (cfg->secret && (!cfg->secret_len || cfg->secret_len > RPC_MAX_SECRET)))
		return rpc_fail(TE_ERR_INVALID_ARG, err_out,
				"rpc: server needs a handler (and a secret of 1..%u bytes or none)",
				RPC_MAX_SECRET);
	if (cfg->max_body > RPC_MAX_BODY_LIMIT || cfg->handler_threads > RPC_MAX_HANDLER_THREADS)
		return rpc_fail(TE_ERR_CONFIG, err_out,
				"rpc: max_body over %u or handler_threads over %u",
				RPC_MAX_BODY_LIMIT, RPC_MAX_HANDLER_THREADS);
	max_body = rpc_or(cfg->max_body, RPC_DEFAULT_MAX_BODY);
	max_buffered = cfg->max_buffered ? cfg->max_buffered
					 : MAX((uint64_t)RPC_DEFAULT_MAX_BUFFERED, max_body);
	if (max_buffered < max_body || max_buffered > SIZE_MAX / 2)
		return rpc_fail(TE_ERR_CONFIG, err_out,
				"rpc: max_buffered %" PRIu64 " is below max_body %" PRIu32
				" (a largest frame must fit) or too large",
				max_buffered, max_body);
	srv = g_new0(struct rpc_server, 1);
	srv->listen_fd = srv->epoll_fd = srv->wake_fd = -1;
	if (cfg->secret) {
		srv->secret = rpc_secret_dup(cfg->secret, cfg->secret_len);
		srv->secret_len = cfg->secret_len;
	}
	srv->handle = cfg->handle;
	srv->user = cfg->user;
	srv->log = cfg->log;
	srv->max_body = max_body;
	srv->max_buffered = (size_t)max_buffered;
	srv->idle_timeout_ms = rpc_or(cfg->idle_timeout_ms, RPC_DEFAULT_IDLE_TIMEOUT_MS);
	srv->frame_timeout_ms = rpc_or(cfg->frame_timeout_ms, RPC_DEFAULT_FRAME_TIMEOUT_MS);
	srv->auth_timeout_ms = rpc_or(cfg->auth_timeout_ms, RPC_DEFAULT_AUTH_TIMEOUT_MS);
	srv->max_connections = rpc_or(cfg->max_connections, RPC_DEFAULT_MAX_CONNECTIONS);
	srv->max_per_host = rpc_or(cfg->max_connections_per_host, RPC_DEFAULT_MAX_PER_HOST);
	srv->max_unauthenticated =
		rpc_or(cfg->max_unauthenticated, RPC_DEFAULT_MAX_UNAUTHENTICATED);
	srv->next_sweep_us = INT64_MAX;
	/* conns owns its elements until burying moves one to the graveyard. */
	srv->conns = g_ptr_array_new();
	srv->graveyard = g_ptr_array_new_with_free_func((GDestroyNotify)rpc_conn_free);
	srv->per_host = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	g_mutex_init(&srv->done_lock);
	g_queue_init(&srv->done);
	atomic_init(&srv->stop, false);

	st = rpc_server_bind(srv, cfg->listen_addr ? cfg->listen_addr : "127.0.0.1:0", err_out);
	if (st != TE_OK)
		goto err_free;
	srv->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (srv->epoll_fd < 0 || srv->wake_fd < 0) {
		st = rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: epoll/eventfd: %s", g_strerror(errno));
		goto err_free;
	}
	ev.events = EPOLLIN;
	ev.data.ptr = &srv->listen_tag;
	if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->listen_fd, &ev) < 0) {
		st = rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: epoll_ctl: %s", g_strerror(errno));
		goto err_free;
	}
	ev.data.ptr = &srv->wake_tag;
	if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->wake_fd, &ev) < 0) {
		st = rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: epoll_ctl: %s", g_strerror(errno));
		goto err_free;
	}
	srv->pool = g_thread_pool_new(rpc_server_work, srv,
				      cfg->handler_threads ? (gint)cfg->handler_threads
							   : (gint)RPC_DEFAULT_HANDLER_THREADS,
				      TRUE, &gerr);
	if (!srv->pool) {
		st = rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: handler threads: %s", gerr->message);
		goto err_free;
	}
	srv->thread = g_thread_try_new("te-rpc", rpc_server_loop, srv, &gerr);
	if (!srv->thread) {
		st = rpc_fail(TE_ERR_SYSTEM, err_out, "rpc: listener thread: %s", gerr->message);
		goto err_free_pool;
	}
	log_msg(srv->log, TE_LOG_INFO, "rpc: listening on %s%s", srv->address,
		srv->secret ? " (authenticated)" : "");
	*srv_out = srv;
	return TE_OK;

err_free_pool:
	g_thread_pool_free(srv->pool, FALSE, TRUE);
err_free:
	rpc_server_free(srv);
	return st;
}

const char *rpc_server_address(const struct rpc_server *srv)
{
	return srv->address;
}

void rpc_server_stop(struct rpc_server *srv)
{
	uint64_t one = 1;

	if (!srv)
		return;
	atomic_store_explicit(&srv->stop, true, memory_order_release);
	if (write(srv->wake_fd, &one, sizeof(one)) < 0)
		assert(errno == EAGAIN);
	g_thread_join(srv->thread);
	/* Running and queued handlers finish; their jobs land in srv->done. */
	g_thread_pool_free(srv->pool, FALSE, TRUE);
	log_msg(srv->log, TE_LOG_INFO, "rpc: %s: stopped", srv->address);
	rpc_server_free(srv);
}

/* --- client ---------------------------------------------------------------------------- */

struct rpc_idle {
	char *addr;
	int fd;
	int64_t since_us;
};

struct rpc_client {
	char *secret;
	size_t secret_len;
	struct log_sink *log;
	GMutex lock;
	GPtrArray *idle; /* struct rpc_idle, oldest first */
	_Atomic uint64_t next_id;
};

/* One call's connection and deadline; error texts name the address. */
struct rpc_call {
	struct rpc_client *client;
	const char *addr;
	int64_t deadline_us;
	uint32_t timeout_ms;
	int fd;
	size_t received; /* bytes read on this connection during this call */
};

static void rpc_idle_free(struct rpc_idle *idle)
{
	if (idle->fd >= 0)
		close(idle->fd);
	g_free(idle->addr);
	g_free(idle);
}

enum te_status rpc_client_new(const void *secret, size_t secret_len, struct log_sink *log,
			      struct rpc_client **client_out)
{
	struct rpc_client *client;

	if (!client_out || (secret && (!secret_len || secret_len > RPC_MAX_SECRET)))
		return TE_ERR_INVALID_ARG;
	client = g_new0(struct rpc_client, 1);
	if (secret) {
		client->secret = rpc_secret_dup(secret, secret_len);
		client->secret_len = secret_len;
	}
	client->log = log;
	g_mutex_init(&client->lock);
	client->idle = g_ptr_array_new_with_free_func((GDestroyNotify)rpc_idle_free);
	atomic_init(&client->next_id, 1);
	*client_out = client;
	return TE_OK;
}

void rpc_client_free(struct rpc_client *client)
{
	if (!client)
		return;
	g_ptr_array_unref(client->idle);
	g_mutex_clear(&client->lock);
	rpc_secret_free(client->secret, client->secret_len);
	g_free(client);
}

/* A cached connection to @addr that the peer has not closed meanwhile, or -1. */
static int rpc_client_take(struct rpc_client *client, const char *addr)
{
	int64_t now = rpc_now_us();
	struct pollfd p;
	int fd = -1;

	g_mutex_lock(&client->lock);
	for (guint i = client->idle->len; i-- > 0;) {
		struct rpc_idle *idle = client->idle->pdata[i];

		if (now - idle->since_us >= RPC_CLIENT_IDLE_US) {
			g_ptr_array_remove_index(client->idle, i);
		} else if (fd < 0 && strcmp(idle->addr, addr) == 0) {
			fd = idle->fd;
			idle->fd = -1;
			g_ptr_array_remove_index(client->idle, i);
		}
	}
	g_mutex_unlock(&client->lock);
	if (fd < 0)
		return -1;
	/* Between calls the server sends nothing: readable means closed (EOF or reset). */
	p = (struct pollfd){ .fd = fd, .events = POLLIN | POLLRDHUP };
	if (poll(&p, 1, 0) != 0) {
		log_msg(client->log, TE_LOG_DEBUG, "rpc: %s: cached connection closed by the peer",
			addr);
		close(fd);
		return -1;
	}
	return fd;
}

static void rpc_client_put(struct rpc_client *client, const char *addr, int fd)
{
	struct rpc_idle *idle = g_new0(struct rpc_idle, 1);

	idle->addr = g_strdup(addr);
	idle->fd = fd;
	idle->since_us = rpc_now_us();
	g_mutex_lock(&client->lock);
	if (client->idle->len >= RPC_CLIENT_MAX_IDLE)
		g_ptr_array_remove_index(client->idle, 0);
	g_ptr_array_add(client->idle, idle);
	g_mutex_unlock(&client->lock);
}

static enum te_status rpc_call_fail(struct rpc_call *call, enum te_status status, char **err_out,
				    const char *fmt, ...) G_GNUC_PRINTF(4, 5);

/* Every client error: logged at debug, returned with "rpc: <addr>: " in front. */
static enum te_status rpc_call_fail(struct rpc_call *call, enum te_status status, char **err_out,
				    const char *fmt, ...)
{
	g_autofree char *why = NULL;
	va_list ap;

	va_start(ap, fmt);
	why = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	log_msg(call->client->log, TE_LOG_DEBUG, "rpc: %s: %s", call->addr, why);
	if (err_out)
		*err_out = g_strdup_printf("rpc: %s: %s", call->addr, why);
	return status;
}

/* Wait for @events until the call's deadline: TE_OK, or TE_ERR_TIMEOUT. */
static enum te_status rpc_call_wait(struct rpc_call *call, short events)
{
	for (;;) {
		int64_t left = call->deadline_us - rpc_now_us();
		struct pollfd p = { .fd = call->fd, .events = events };
		int r;

		if (left <= 0)
			return TE_ERR_TIMEOUT;
		r = poll(&p, 1, (int)MIN((left + 999) / 1000, (int64_t)INT_MAX));
		/* Errors and hang-ups count as ready: the next send or recv reports them. */
		if (r > 0 || (r < 0 && errno != EINTR))
			return TE_OK;
	}
}

static enum te_status rpc_call_send(struct rpc_call *call, const uint8_t *buf, size_t len,
				    char **err_out)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = send(call->fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n >= 0) {
			done += (size_t)n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return rpc_call_fail(call, TE_ERR_CONN_RESET, err_out, "send: %s",
					     g_strerror(errno));
		if (rpc_call_wait(call, POLLOUT) != TE_OK)
			return rpc_call_fail(call, TE_ERR_TIMEOUT, err_out,
					     "cannot send within %" PRIu32 " ms", call->timeout_ms);
	}
	return TE_OK;
}

static enum te_status rpc_call_recv(struct rpc_call *call, uint8_t *buf, size_t len, char **err_out)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = recv(call->fd, buf + done, len - done, MSG_DONTWAIT);

		if (n > 0) {
			done += (size_t)n;
			call->received += (size_t)n;
			continue;
		}
		if (n == 0)
			return rpc_call_fail(call, TE_ERR_CONN_RESET, err_out,
					     "connection closed by the peer");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return rpc_call_fail(call, TE_ERR_CONN_RESET, err_out, "recv: %s",
					     g_strerror(errno));
		if (rpc_call_wait(call, POLLIN) != TE_OK)
			return rpc_call_fail(call, TE_ERR_TIMEOUT, err_out,
					     "no reply within %" PRIu32 " ms", call->timeout_ms);
	}
	return TE_OK;
}

/* Read one frame of at most @max_body; *body_out is NULL-safe to unref. */
static enum te_status rpc_call_read_frame(struct rpc_call *call, size_t max_body,
					  struct rpc_frame_header *hdr_out, GBytes **body_out,
					  char **err_out)
{
	uint8_t raw[RPC_HEADER_SIZE];
	g_autofree char *why = NULL;
	struct rpc_frame_header hdr;
	enum te_status st;
	uint8_t *body;

	st = rpc_call_recv(call, raw, sizeof(raw), err_out);
	if (st != TE_OK)
		return st;
	if (rpc_header_decode(raw, sizeof(raw), max_body, &hdr, &why) != TE_OK)
		return rpc_call_fail(call, TE_ERR_PROTOCOL, err_out, "reply: %s", why);
	body = g_malloc(MAX(hdr.body_len, 1u));
	st = rpc_call_recv(call, body, hdr.body_len, err_out);
	if (st != TE_OK) {
		g_free(body);
		return st;
	}
	*hdr_out = hdr;
	*body_out = g_bytes_new_take(body, hdr.body_len);
	return TE_OK;
}

/* An RPC_ERROR frame: its status (when a known error) and its text, quoted safely. */
static enum te_status rpc_call_peer_error(struct rpc_call *call, const struct rpc_frame_header *hdr,
					  GBytes *body, char **err_out)
{
	gsize len;
	const uint8_t *text = g_bytes_get_data(body, &len);
	char quoted[RPC_ERROR_TEXT_MAX + 1];
	enum te_status st = (enum te_status)hdr->status;
	size_t n = MIN(len, (gsize)RPC_ERROR_TEXT_MAX);

	for (size_t i = 0; i < n; i++)
		quoted[i] = rpc_name_byte_ok(text[i]) ? (char)text[i] : '?';
	quoted[n] = '\0';
	if (hdr->status >= 0 || strcmp(te_status_str(hdr->status), "unknown status") == 0)
		st = TE_ERR_PROTOCOL;
	return rpc_call_fail(call, st, err_out, "peer refused (%s): %s", te_status_str(hdr->status),
			     quoted);
}

/* Read HELLO and, when either side has a secret, authenticate both ways. */
static enum te_status rpc_call_greet(struct rpc_call *call, char **err_out)
{
	struct rpc_client *client = call->client;
	uint8_t auth[RPC_AUTH_BODY], mac[RPC_MAC_SIZE];
	g_autoptr(GByteArray) frame = NULL;
	g_autoptr(GBytes) body = NULL;
	g_autoptr(GBytes) proof = NULL;
	struct rpc_frame_header hdr;
	const uint8_t *nonce;
	enum te_status st;
	gsize len;

	st = rpc_call_read_frame(call, RPC_GREETING_MAX_BODY, &hdr, &body, err_out);
	if (st != TE_OK)
		return st;
	if (hdr.type == RPC_ERROR)
		return rpc_call_peer_error(call, &hdr, body, err_out);
	nonce = g_bytes_get_data(body, &len);
	if (hdr.type != RPC_HELLO || (len != 0 && len != RPC_NONCE_SIZE))
		return rpc_call_fail(call, TE_ERR_PROTOCOL, err_out,
				     "expected HELLO, got %s with %zu bytes",
				     rpc_type_str(hdr.type), (size_t)len);
	if (len == 0 && !client->secret)
		return TE_OK;
	if (len == 0)
		return rpc_call_fail(call, TE_ERR_AUTH, err_out,
				     "peer does not authenticate, but this side has a secret");
	if (!client->secret)
		return rpc_call_fail(call, TE_ERR_AUTH, err_out,
				     "peer requires authentication; no secret configured");
	if (!rpc_random(auth, RPC_NONCE_SIZE))
		return rpc_call_fail(call, TE_ERR_SYSTEM, err_out, "getrandom: %s",
				     g_strerror(errno));
	rpc_mac(client->secret, client->secret_len, rpc_label_client, nonce, auth,
		auth + RPC_NONCE_SIZE);
	frame = g_byte_array_new();
	rpc_frame_append(frame, RPC_AUTH, 0, TE_OK, auth, sizeof(auth));
	st = rpc_call_send(call, frame->data, frame->len, err_out);
	if (st != TE_OK)
		return st;
	st = rpc_call_read_frame(call, RPC_GREETING_MAX_BODY, &hdr, &proof, err_out);
	if (st != TE_OK)
		return st;
	if (hdr.type == RPC_ERROR)
		return rpc_call_peer_error(call, &hdr, proof, err_out);
	if (hdr.type != RPC_AUTH_OK || g_bytes_get_size(proof) != RPC_MAC_SIZE)
		return rpc_call_fail(call, TE_ERR_PROTOCOL, err_out,
				     "expected AUTH_OK, got %s with %zu bytes",
				     rpc_type_str(hdr.type), g_bytes_get_size(proof));
	rpc_mac(client->secret, client->secret_len, rpc_label_server, nonce, auth, mac);
	if (!rpc_mac_equal(mac, g_bytes_get_data(proof, NULL)))
		return rpc_call_fail(call, TE_ERR_AUTH, err_out,
				     "peer failed to prove it knows the secret");
	return TE_OK;
}

/* Connect within the deadline, trying each resolved address, then greet. */
static enum te_status rpc_call_connect(struct rpc_call *call, char **err_out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV };
	g_autofree char *host = NULL, *port = NULL;
	struct addrinfo *res, *ai;
	enum te_status st;
	const char *why;
	int rc, err = ECONNREFUSED;

	if (!rpc_addr_split(call->addr, &host, &port, &why))
		return rpc_call_fail(call, TE_ERR_INVALID_ARG, err_out, "bad address: %s", why);
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
		return rpc_call_fail(call, TE_ERR_PEER_UNREACHABLE, err_out, "resolve: %s",
				     gai_strerror(rc));
	for (ai = res; ai && call->fd < 0; ai = ai->ai_next) {
		int so_err = 0;
		socklen_t sl = sizeof(so_err);

		call->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
				  ai->ai_protocol);
		if (call->fd < 0) {
			err = errno;
			continue;
		}
		if (connect(call->fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		if (errno != EINPROGRESS) {
			so_err = errno;
		} else if (rpc_call_wait(call, POLLOUT) != TE_OK) {
			so_err = ETIMEDOUT;
		} else if (getsockopt(call->fd, SOL_SOCKET, SO_ERROR, &so_err, &sl) < 0) {
			so_err = errno;
		}
		if (so_err == 0)
			break;
		err = so_err;
		close(call->fd);
		call->fd = -1;
		if (err == ETIMEDOUT)
			break;
	}
	freeaddrinfo(res);
	if (call->fd < 0) {
		if (err == ETIMEDOUT)
			return rpc_call_fail(call, TE_ERR_PEER_UNREACHABLE, err_out,
					     "connect: timed out after %" PRIu32 " ms",
					     call->timeout_ms);
		return rpc_call_fail(call, TE_ERR_PEER_UNREACHABLE, err_out, "connect: %s",
				     g_strerror(err));
	}
	rpc_set_nodelay(call->fd);
	st = rpc_call_greet(call, err_out);
	if (st != TE_OK) {
		close(call->fd);
		call->fd = -1;
	}
	return st;
}

/* Send @frame and read the matching reply on the call's connection. */
static enum te_status rpc_call_exchange(struct rpc_call *call, const GByteArray *frame,
					uint8_t type, uint64_t id, struct rpc_frame_header *hdr_out,
					GBytes **body_out, char **err_out)
{
	g_autoptr(GBytes) body = NULL;
	struct rpc_frame_header hdr;
	enum te_status st;

	call->received = 0;
	st = rpc_call_send(call, frame->data, frame->len, err_out);
	if (st != TE_OK)
		return st;
	st = rpc_call_read_frame(call, RPC_DEFAULT_MAX_BODY, &hdr, &body, err_out);
	if (st != TE_OK)
		return st;
	if (hdr.type == RPC_ERROR)
		return rpc_call_peer_error(call, &hdr, body, err_out);
	if (hdr.type != type + 1 || hdr.request_id != id)
		return rpc_call_fail(
			call, TE_ERR_PROTOCOL, err_out,
			"%s reply (request id %" PRIu64 ") to %s (request id %" PRIu64 ")",
			rpc_type_str(hdr.type), hdr.request_id, rpc_type_str(type), id);
	*hdr_out = hdr;
	*body_out = g_steal_pointer(&body);
	return TE_OK;
}

enum te_status rpc_client_call(struct rpc_client *client, const char *addr, uint8_t type,
			       const void *body, size_t len, uint32_t timeout_ms,
			       GBytes **reply_out, int32_t *status_out, char **err_out)
{
	struct rpc_call call = {
		.client = client, .addr = addr, .timeout_ms = timeout_ms, .fd = -1
	};
	g_autoptr(GByteArray) frame = NULL;
	struct rpc_frame_header hdr = { 0 };
	GBytes *reply = NULL;
	enum te_status st = TE_OK;
	uint64_t id;

	if (!client || !addr || !rpc_type_is_request(type) || (!body && len) || !timeout_ms ||
	    !reply_out || !status_out)
		return rpc_fail(TE_ERR_INVALID_ARG, err_out, "rpc: invalid call arguments");
	if (len > RPC_DEFAULT_MAX_BODY)
		return rpc_fail(TE_ERR_TOO_LARGE, err_out,
				"rpc: %s: request of %zu bytes over limit %u", addr, len,
				RPC_DEFAULT_MAX_BODY);
	call.deadline_us = rpc_now_us() + (int64_t)timeout_ms * 1000;
	/* Relaxed: ids only need to differ, not to order anything. */
	id = atomic_fetch_add_explicit(&client->next_id, 1, memory_order_relaxed);
	frame = g_byte_array_sized_new((guint)(RPC_HEADER_SIZE + len));
	rpc_frame_append(frame, type, id, TE_OK, body, len);

	/*
	 * A cached connection that the peer closed before reading the request (its
	 * idle timeout) is replaced, once, by a fresh one. Nothing was received on it,
	 * so the request was not answered; it was not handled either unless the peer
	 * died in between, which the fresh connection then reports.
	 */
	for (int attempt = 0; attempt < 2; attempt++) {
		g_autofree char *why = NULL;
		bool reused;

		call.fd = attempt == 0 ? rpc_client_take(client, addr) : -1;
		reused = call.fd >= 0;
		if (!reused) {
			st = rpc_call_connect(&call, err_out);
			if (st != TE_OK)
				return st;
		}
		st = rpc_call_exchange(&call, frame, type, id, &hdr, &reply, &why);
		if (st == TE_OK) {
			rpc_client_put(client, addr, call.fd);
			*status_out = hdr.status;
			*reply_out = reply;
			return TE_OK;
		}
		close(call.fd);
		call.fd = -1;
		if (!reused || st != TE_ERR_CONN_RESET || call.received) {
			if (err_out)
				*err_out = g_steal_pointer(&why);
			return st;
		}
	}
	return st;
}
