/* SPDX-License-Identifier: Apache-2.0 */
/* rpc_codec.c: the control plane's wire frames: pure encode and decode (fuzz/rpc_fuzz.c). */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>
#include <te/te_plugin_util.h>

#include "core/rpc_codec.h"

const char *rpc_type_str(unsigned int type)
{
	switch (type) {
	case RPC_HELLO:
		return "HELLO";
	case RPC_AUTH:
		return "AUTH";
	case RPC_AUTH_OK:
		return "AUTH_OK";
	case RPC_ERROR:
		return "ERROR";
	case RPC_DESC_FETCH:
		return "DESC_FETCH";
	case RPC_DESC_REPLY:
		return "DESC_REPLY";
	case RPC_HANDSHAKE:
		return "HANDSHAKE";
	case RPC_HANDSHAKE_REPLY:
		return "HANDSHAKE_REPLY";
	case RPC_NOTIFY:
		return "NOTIFY";
	case RPC_NOTIFY_ACK:
		return "NOTIFY_ACK";
	case RPC_PROBE:
		return "PROBE";
	case RPC_PROBE_REPLY:
		return "PROBE_REPLY";
	}
	return "unknown";
}

static bool rpc_type_known(unsigned int type)
{
	return (type >= RPC_HELLO && type <= RPC_ERROR) ||
	       (type >= RPC_DESC_FETCH && type <= RPC_PROBE_REPLY);
}

bool rpc_type_is_request(unsigned int type)
{
	return type == RPC_DESC_FETCH || type == RPC_HANDSHAKE || type == RPC_NOTIFY ||
	       type == RPC_PROBE;
}

/* Decoders report through here: the status, and the reason when the caller wants it. */
enum te_status rpc_fail(enum te_status status, char **err_out, const char *fmt, ...)
{
	va_list ap;

	if (!err_out)
		return status;
	va_start(ap, fmt);
	*err_out = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	return status;
}

void rpc_frame_append(GByteArray *out, uint8_t type, uint64_t request_id, int32_t status,
		      const void *body, size_t len)
{
	uint8_t hdr[RPC_HEADER_SIZE];

	assert(len <= UINT32_MAX && (body || !len));
	te_plugin_put_u32(hdr, RPC_MAGIC);
	hdr[4] = RPC_VERSION;
	hdr[5] = type;
	te_plugin_put_u16(hdr + 6, 0);
	te_plugin_put_u64(hdr + 8, request_id);
	te_plugin_put_u32(hdr + 16, (uint32_t)status);
	te_plugin_put_u32(hdr + 20, (uint32_t)len);
	g_byte_array_append(out, hdr, sizeof(hdr));
	if (len)
		g_byte_array_append(out, body, (guint)len);
}

enum te_status rpc_header_decode(const uint8_t *buf, size_t len, size_t max_body,
				 struct rpc_frame_header *hdr_out, char **err_out)
{
	static const uint8_t magic[4] = { 'T', 'E', 'C', 'P' };
	struct rpc_frame_header hdr;
	uint32_t body_len;
	uint16_t flags;

	/*
	 * Check each field as soon as its bytes are in, so that garbage is refused
	 * at once rather than after an idle timeout: TE_INPROGRESS means @buf is a
	 * valid prefix of some frame.
	 */
	if (len > 0 && len < sizeof(magic) && memcmp(buf, magic, len) != 0) {
		uint32_t v = 0;

		for (size_t i = 0; i < len; i++)
			v |= (uint32_t)buf[i] << (8 * i);
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "bad magic 0x%0*" PRIx32, (int)(2 * len),
				v);
	}
	if (len >= 4 && te_plugin_get_u32(buf) != RPC_MAGIC)
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "bad magic 0x%08" PRIx32,
				te_plugin_get_u32(buf));
	if (len >= 5 && buf[4] != RPC_VERSION)
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "unsupported version %u", buf[4]);
	if (len >= 6 && !rpc_type_known(buf[5]))
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "unknown type %u", buf[5]);
	if (len >= 8 && (flags = te_plugin_get_u16(buf + 6)) != 0)
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "unknown flags 0x%04x", flags);
	if (len < RPC_HEADER_SIZE)
		return TE_INPROGRESS;
	body_len = te_plugin_get_u32(buf + 20);
	if (body_len > max_body)
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "body length %" PRIu32 " over limit %zu",
				body_len, max_body);
	hdr.type = buf[5];
	hdr.request_id = te_plugin_get_u64(buf + 8);
	hdr.status = (int32_t)te_plugin_get_u32(buf + 16);
	hdr.body_len = body_len;
	*hdr_out = hdr;
	return TE_OK;
}

enum te_status rpc_frame_decode(const uint8_t *buf, size_t len, size_t max_body,
				struct rpc_frame_header *hdr_out, size_t *frame_len_out,
				char **err_out)
{
	struct rpc_frame_header hdr;
	enum te_status st;

	st = rpc_header_decode(buf, len, max_body, &hdr, err_out);
	if (st != TE_OK)
		return st;
	if (len - RPC_HEADER_SIZE < hdr.body_len)
		return TE_INPROGRESS;
	*hdr_out = hdr;
	*frame_len_out = RPC_HEADER_SIZE + (size_t)hdr.body_len;
	return TE_OK;
}

/* Names are one line of printable ASCII so that logs quoting them stay readable. */
bool rpc_name_byte_ok(uint8_t c)
{
	return c >= 0x20 && c <= 0x7e;
}

enum te_status rpc_body_pack(GByteArray *out, const char *name, const void *payload, size_t len)
{
	size_t n;

	if (!out || !name || (!payload && len))
		return TE_ERR_INVALID_ARG;
	n = strnlen(name, RPC_MAX_NAME + 1);
	if (n == 0 || n > RPC_MAX_NAME || len > UINT32_MAX - n - 1)
		return TE_ERR_INVALID_ARG;
	for (size_t i = 0; i < n; i++)
		if (!rpc_name_byte_ok((uint8_t)name[i]))
			return TE_ERR_INVALID_ARG;
	g_byte_array_append(out, (const guint8 *)name, (guint)n + 1);
	if (len)
		g_byte_array_append(out, payload, (guint)len);
	return TE_OK;
}

enum te_status rpc_body_unpack(const uint8_t *body, size_t len, const char **name_out,
			       const uint8_t **payload_out, size_t *payload_len_out, char **err_out)
{
	const uint8_t *nul;
	size_t n;

	nul = len ? memchr(body, 0, MIN(len, (size_t)RPC_MAX_NAME + 1)) : NULL;
	if (!nul) {
		if (len > RPC_MAX_NAME)
			return rpc_fail(TE_ERR_PROTOCOL, err_out, "name longer than %u bytes",
					RPC_MAX_NAME);
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "name without a NUL terminator");
	}
	n = (size_t)(nul - body);
	if (n == 0)
		return rpc_fail(TE_ERR_PROTOCOL, err_out, "empty name");
	for (size_t i = 0; i < n; i++)
		if (!rpc_name_byte_ok(body[i]))
			return rpc_fail(TE_ERR_PROTOCOL, err_out,
					"name byte %zu is 0x%02x, not printable ASCII", i, body[i]);
	*name_out = (const char *)body;
	*payload_len_out = len - n - 1;
	*payload_out = *payload_len_out ? nul + 1 : NULL;
	return TE_OK;
}
