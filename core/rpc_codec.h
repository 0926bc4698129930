/* SPDX-License-Identifier: Apache-2.0 */
/* rpc_codec.h: the control plane's wire frames: pure encode and decode, fuzzed by fuzz/. */
#ifndef TE_CORE_RPC_CODEC_H
#define TE_CORE_RPC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

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
/* Body limit a receiver applies unless configured otherwise (control.max_body). */
#define RPC_DEFAULT_MAX_BODY (16u << 20) /* fits DESCRIPTOR_MAX_JSON */
#define RPC_MAX_NAME 255u		 /* bytes of a plugin or sender name, without the NUL */


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

/* Whether @type is a request (a client may send it; its reply is type + 1). */
bool rpc_type_is_request(unsigned int type);

/* Whether @c may appear in a plugin or sender name (printable ASCII). */
bool rpc_name_byte_ok(uint8_t c);

/* Set *err_out (if not NULL; g_free) to the formatted text and return @status. */
enum te_status rpc_fail(enum te_status status, char **err_out, const char *fmt, ...)
	G_GNUC_PRINTF(3, 4);

#endif /* TE_CORE_RPC_CODEC_H */
