/* SPDX-License-Identifier: Apache-2.0 */
/* rpc.h: the control plane: wire frames, a listener serving peers, and a caching client. */
#ifndef TE_CORE_RPC_H
#define TE_CORE_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

struct log_sink;

/*
 * Wire format. Every message is one frame: a fixed RPC_HEADER_SIZE header, all
 * integers little-endian, then body_len bytes of body.
 *
 *   off size field
 *     0    4 magic       RPC_MAGIC: the bytes "TECP"
 *     4    1 version     RPC_VERSION
 *     5    1 type        enum rpc_type
 *     6    2 flags       0 (no flags are defined; others are rejected)
 *     8    8 request id  chosen by the client, echoed in the reply
 *    16    4 status      0 in requests; enum te_status in replies and RPC_ERROR
 *    20    4 body length at most the receiver's limit
 *
 * Session: on accept the server sends RPC_HELLO. Its body is empty when the server
 * needs no authentication, or RPC_NONCE_SIZE random bytes (nonce S) when it does;
 * then the client must answer RPC_AUTH with its own nonce C and
 * HMAC-SHA256(secret, "te-rpc-v1 client" || S || C), and the server proves it
 * knows the secret too with RPC_AUTH_OK carrying HMAC-SHA256(secret,
 * "te-rpc-v1 server" || S || C). After that the client sends requests, one at a
 * time; each gets the reply type (request type + 1) with the same request id.
 * A protocol or authentication error makes the server send RPC_ERROR (status and
 * a text body) if it can, log the reason, and close that connection only.
 */
#define RPC_MAGIC 0x50434554u /* "TECP" read as a little-endian u32 */
#define RPC_VERSION 1u
#define RPC_HEADER_SIZE 24u
#define RPC_NONCE_SIZE 32u
#define RPC_MAC_SIZE 32u
#define RPC_MAX_NAME 255u /* bytes of a plugin or sender name, without the NUL */

/* Server defaults for zero fields of struct rpc_server_config (docs/config.md, control:). */
#define RPC_DEFAULT_MAX_BODY (16u << 20) /* fits DESCRIPTOR_MAX_JSON */
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

enum rpc_type {
	RPC_HELLO = 1,	 /* server -> client: empty or a nonce */
	RPC_AUTH = 2,	 /* client nonce || client MAC */
	RPC_AUTH_OK = 3, /* server MAC */
	RPC_ERROR = 4,	 /* status (negative) and a UTF-8 text body; the sender then closes */

	RPC_DESC_FETCH = 16,	  /* body: opaque to the server (empty today) */
	RPC_DESC_REPLY = 17,	  /* body: the descriptor JSON */
	RPC_HANDSHAKE = 18,	  /* body: plugin name, NUL, opaque payload (rpc_body_pack) */
	RPC_HANDSHAKE_REPLY = 19, /* body: the plugin's opaque reply */
	RPC_NOTIFY = 20,	  /* body: sender name, NUL, message (rpc_body_pack) */
	RPC_NOTIFY_ACK = 21,	  /* body: whatever the handler wrote (usually empty) */
	RPC_PROBE = 22,		  /* body: opaque */
	RPC_PROBE_REPLY = 23,	  /* body: whatever the handler wrote */
};

/* A decoded header; the body follows it in the buffer. */
struct rpc_frame_header {
	uint8_t type; /* a known enum rpc_type */
	uint64_t request_id;
	int32_t status;
	uint32_t body_len;
};

/* --- codec: pure functions over (buffer, length), fuzzed by fuzz/rpc_fuzz.c ------------- */
/* Every codec function is pure (no I/O, no globals) and thread-safe. */

/* Short name of a frame type ("DESC_FETCH"), or "unknown". Thread-safe. */
const char *rpc_type_str(unsigned int type);

/* Append one frame (header and @len bytes of @body) to @out. @len <= UINT32_MAX. */
void rpc_frame_append(GByteArray *out, uint8_t type, uint64_t request_id, int32_t status,
		      const void *body, size_t len);

/*
 * rpc_header_decode - validate the header at @buf.
 * TE_OK: *hdr_out is filled (the body need not be present yet).
 * TE_INPROGRESS: @len < RPC_HEADER_SIZE; nothing is written.
 * TE_ERR_PROTOCOL: *err_out (g_free; may be NULL) is one of "bad magic 0x%08x",
 * "unsupported version %u", "unknown type %u", "unknown flags 0x%04x",
 * "body length %u over limit %zu"; *hdr_out is not written.
 */
TE_NODISCARD enum te_status rpc_header_decode(const uint8_t *buf, size_t len, size_t max_body,
					      struct rpc_frame_header *hdr_out, char **err_out);

/*
 * rpc_frame_decode - as rpc_header_decode, but TE_OK only once the whole frame is
 * in @buf; then *frame_len_out = RPC_HEADER_SIZE + body_len and the body starts at
 * @buf + RPC_HEADER_SIZE. TE_INPROGRESS (nothing written) while any byte is missing.
 */
TE_NODISCARD enum te_status rpc_frame_decode(const uint8_t *buf, size_t len, size_t max_body,
					     struct rpc_frame_header *hdr_out,
					     size_t *frame_len_out, char **err_out);

/*
 * rpc_body_pack - append "name NUL payload" to @out: the body of RPC_HANDSHAKE
 * (name = plugin) and RPC_NOTIFY (name = sender). TE_ERR_INVALID_ARG (nothing
 * appended) when @name is empty, longer than RPC_MAX_NAME or has a byte outside
 * printable ASCII.
 */
TE_NODISCARD enum te_status rpc_body_pack(GByteArray *out, const char *name, const void *payload,
					  size_t len);

/*
 * rpc_body_unpack - split a packed body without copying: *name_out points at the
 * NUL-terminated name inside @body, *payload_out at the bytes after the NUL
 * (NULL when *payload_len_out is 0). TE_ERR_PROTOCOL with *err_out (g_free; may be
 * NULL) when the name is missing, unterminated, empty, too long or not printable.
 */
TE_NODISCARD enum te_status rpc_body_unpack(const uint8_t *body, size_t len, const char **name_out,
					    const uint8_t **payload_out, size_t *payload_len_out,
					    char **err_out);

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
