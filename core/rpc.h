/* SPDX-License-Identifier: Apache-2.0 */
/* rpc.h: the control plane: a listener serving peers and a caching client (frames: rpc_codec.h). */
#ifndef TE_CORE_RPC_H
#define TE_CORE_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

#include "core/rpc_codec.h"

struct log_sink;

/* Server defaults for zero fields of struct rpc_server_config (docs/config.md, control:). */
#define RPC_DEFAULT_MAX_BUFFERED (64u << 20)
#define RPC_DEFAULT_IDLE_TIMEOUT_MS 10000u
#define RPC_DEFAULT_AUTH_TIMEOUT_MS 5000u
#define RPC_DEFAULT_FRAME_TIMEOUT_MS 10000u
#define RPC_DEFAULT_MAX_CONNECTIONS 1024u
#define RPC_DEFAULT_MAX_PER_HOST 128u
#define RPC_DEFAULT_MAX_UNAUTHENTICATED 256u
#define RPC_DEFAULT_HANDLER_THREADS 4u
#define RPC_MAX_HANDLER_THREADS 256u
/* Longest shared secret, in bytes (the same cap as a YAML string). */
#define RPC_MAX_SECRET 4096u

/* --- server -------------------------------------------------------------------------- */

/* One request as the handler sees it. Every pointer is valid only during the call. */
struct rpc_request {
	uint8_t type;	  /* RPC_DESC_FETCH, RPC_HANDSHAKE, RPC_NOTIFY or RPC_PROBE */
	uint64_t id;	  /* the client's request id */
	const char *peer; /* the client's "host:port", for logs */
	/* The client's address without the port ("10.0.0.7", "fe80::1%eth0"): the only
	 * part of a request the client cannot choose, so the key of per-source quotas. */
	const char *host;
	const uint8_t *body;
	size_t len;
	/* RPC_HANDSHAKE: plugin name; RPC_NOTIFY: sender name (checked); else NULL. */
	const char *name;
	const uint8_t *payload; /* the bytes after the name, or the whole body */
	size_t payload_len;
};

/*
 * Answer one request: append the reply body to @reply and return TE_OK, or return
 * an error status, optionally with a text in @reply that the client receives as
 * the body (te_status_str(status) when left empty). A reply over the server's
 * max_body is replaced by TE_ERR_TOO_LARGE. Runs on a handler thread, concurrently
 * with other calls (one at a time per connection); it may block briefly (a plugin
 * handshake) but delays rpc_server_stop, which waits for it.
 */
typedef enum te_status (*rpc_handle_fn)(void *user, const struct rpc_request *req,
					GByteArray *reply);

/*
 * Zero-initialise; zero or NULL fields take the defaults. Every limit bounds what an
 * unauthenticated or hostile client can hold (docs/config.md, "Limits on a public
 * network"); the texts sent to refused clients name the control.* key of each.
 */
struct rpc_server_config {
	/* "host:port", "[v6]:port"; port 0 picks one. NULL: "127.0.0.1:0". */
	const char *listen_addr;
	/* Shared secret: secret_len bytes, any byte (NUL included), 1..RPC_MAX_SECRET.
	 * NULL: no authentication. Copied; the copy is wiped when the server stops. */
	const void *secret;
	size_t secret_len;
	rpc_handle_fn handle; /* required */
	void *user;
	struct log_sink *log; /* NULL: stderr; must outlive the server */
	/* Largest body received or sent, at most 1 GiB; 0: RPC_DEFAULT_MAX_BODY. */
	uint32_t max_body;
	/*
	 * Body bytes held for all connections together: frames being received (reserved
	 * when the header announces the body), requests queued for or in a handler, and
	 * replies not yet sent. A frame that does not fit gets RPC_ERROR TE_ERR_BUSY and
	 * its connection is closed; a reply that does not fit is replaced by TE_ERR_BUSY.
	 * At least max_body; 0: MAX(RPC_DEFAULT_MAX_BUFFERED, max_body).
	 */
	uint64_t max_buffered;
	/* A connection with nothing in flight for this long is closed; 0: the default. */
	uint32_t idle_timeout_ms;
	/* A frame must be received, and a reply sent, within this long of its first
	 * byte, however the bytes trickle in; 0: the default. */
	uint32_t frame_timeout_ms;
	/* From accept, absolute: authenticate (or, without a secret, complete a first
	 * request) within this long; 0: the default. */
	uint32_t auth_timeout_ms;
	/* Connections beyond these get RPC_ERROR TE_ERR_AGAIN and are closed: in all,
	 * from one address, and not yet authenticated (or, without a secret, without a
	 * complete first request); 0: the defaults. */
	uint32_t max_connections;
	uint32_t max_connections_per_host;
	uint32_t max_unauthenticated;
	/* Handlers running at once, <= RPC_MAX_HANDLER_THREADS; 0: the default. */
	uint32_t handler_threads;
};

struct rpc_server;

/*
 * rpc_server_start - bind, listen and serve until rpc_server_stop: one epoll
 * thread does all socket I/O (so a slow or stalled client delays nobody) and a
 * pool of handler_threads runs @cfg->handle. @cfg and its strings are copied.
 * Without a secret on a non-loopback address it logs a warning. A connection
 * receives one frame at a time, allocated when its header is in (before
 * authentication only an AUTH frame); bodies in memory are bounded by max_buffered
 * in all. Every refused or timed-out connection is logged with the reason (warn for
 * faults, debug for ordinary closes); warnings a flood could repeat are rate-limited
 * (the excess goes to debug and the next warning counts it).
 * Returns TE_ERR_INVALID_ARG or TE_ERR_CONFIG (bad address or limits),
 * TE_ERR_SYSTEM (socket, bind, thread), with *err_out (g_free; may be NULL).
 * Thread-safe.
 */
TE_NODISCARD enum te_status rpc_server_start(const struct rpc_server_config *cfg,
					     struct rpc_server **srv_out, char **err_out);

/*
 * rpc_server_address - the bound "host:port" ("[v6]:port" for IPv6) with the port
 * resolved; owned by @srv. A wildcard host ("0.0.0.0") stays as bound: a caller
 * that advertises it must substitute a reachable address. Thread-safe.
 */
const char *rpc_server_address(const struct rpc_server *srv);

/*
 * rpc_server_stop - stop accepting, wait for running handlers, close every
 * connection and free @srv. NULL is a no-op. Call once, not from a handler.
 */
void rpc_server_stop(struct rpc_server *srv);

/* --- client -------------------------------------------------------------------------- */

struct rpc_client;

/*
 * rpc_client_new - a client that authenticates with the @secret_len bytes at @secret
 * (any byte, NUL included; copied and wiped on free; NULL: refuses servers that ask
 * for it; a client with a secret refuses servers that do not) and keeps a few idle
 * connections per address for reuse. @log (NULL: stderr) must outlive it.
 * TE_ERR_INVALID_ARG for a secret of 0 or over RPC_MAX_SECRET bytes. Thread-safe.
 */
TE_NODISCARD enum te_status rpc_client_new(const void *secret, size_t secret_len,
					   struct log_sink *log, struct rpc_client **client_out);

/* Close the idle connections and free @client; NULL is a no-op. No call may be running. */
void rpc_client_free(struct rpc_client *client);

/*
 * rpc_client_call - send one request (@type is RPC_DESC_FETCH, RPC_HANDSHAKE,
 * RPC_NOTIFY or RPC_PROBE) of @len bytes to @addr ("host:port" or "[v6]:port") and
 * wait at most @timeout_ms in all (connect, authentication, reply).
 * TE_OK: a reply came; *status_out is the handler's status and *reply_out (unref
 * with g_bytes_unref) its body, which is an error text when the status is not
 * TE_OK. A reused connection that turns out closed is replaced once.
 * Errors, with *err_out (g_free; may be NULL) naming @addr:
 *   TE_ERR_INVALID_ARG, TE_ERR_TOO_LARGE (@len over RPC_DEFAULT_MAX_BODY),
 *   TE_ERR_PEER_UNREACHABLE (resolve or connect failed or timed out; errno text),
 *   TE_ERR_TIMEOUT (connected, but no reply in time), TE_ERR_CONN_RESET (closed
 *   mid-call), TE_ERR_AUTH (either side failed authentication), TE_ERR_PROTOCOL
 *   (malformed or unexpected reply), TE_ERR_SYSTEM (no randomness), or the status
 *   of an RPC_ERROR the server sent (TE_ERR_AGAIN: one of its connection limits;
 *   TE_ERR_BUSY: its memory for frames is in use), its text quoted in *err_out.
 * Thread-safe; calls may run concurrently on one client.
 */
TE_NODISCARD enum te_status rpc_client_call(struct rpc_client *client, const char *addr,
					    uint8_t type, const void *body, size_t len,
					    uint32_t timeout_ms, GBytes **reply_out,
					    int32_t *status_out, char **err_out);

/* --- log rate limit ---------------------------------------------------------------- */

/*
 * A warning that a flood could repeat once per connection or request: at most @burst
 * lines per second pass, the rest are demoted (logged at debug) and counted, and the
 * next line that passes says how many. Zero-initialise.
 */
struct rpc_ratelimit {
	int64_t window_us; /* start of the current one-second window */
	uint32_t passed;   /* lines passed in it */
	uint32_t demoted;  /* lines demoted since the last one that passed */
};

/*
 * rpc_ratelimit_pass - whether a line at @now_us (monotonic) may go out at its level:
 * true with *demoted_out = how many were demoted since the last that passed; false
 * (counted) when it goes to debug. Not thread-safe: serialize per limiter.
 */
bool rpc_ratelimit_pass(struct rpc_ratelimit *rl, uint32_t burst, int64_t now_us,
			uint32_t *demoted_out);

#endif /* TE_CORE_RPC_H */
