/* SPDX-License-Identifier: Apache-2.0 */
/* rpc_fuzz.c: libFuzzer target for the control-plane frame decoder and body unpacker. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "core/rpc_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Abort with a message: libFuzzer and the replay driver both report it as a crash. */
static void check(int cond, const char *what, const char *detail)
{
	if (cond)
		return;
	fprintf(stderr, "rpc_fuzz: %s\n%s\n", what, detail ? detail : "");
	abort();
}

/* A reason is one line that starts with one of the documented texts. */
static void check_reason(const char *err, const char *const *prefixes)
{
	int known = 0;

	check(err != NULL, "error without a reason", NULL);
	for (const char *const *p = prefixes; *p; p++)
		known |= g_str_has_prefix(err, *p);
	check(known, "undocumented reason", err);
	check(strchr(err, '\n') == NULL, "reason spans lines", err);
}

static const char *const frame_reasons[] = { "bad magic 0x",  "unsupported version ",
					     "unknown type ", "unknown flags 0x",
					     "body length ",  NULL };
static const char *const body_reasons[] = { "name longer than ", "name without a NUL", "empty name",
					    "name byte ", NULL };

/* Unpack @body; when it parses, packing the parts again must give the same bytes. */
static void fuzz_body(const uint8_t *body, size_t len)
{
	const char *name = NULL;
	const uint8_t *payload = NULL;
	size_t plen = 0;
	char *err = NULL;
	enum te_status st;

	st = rpc_body_unpack(body, len, &name, &payload, &plen, &err);
	if (st != TE_OK) {
		check(st == TE_ERR_PROTOCOL, "unpack: unexpected status", NULL);
		check_reason(err, body_reasons);
		check(name == NULL && plen == 0, "unpack wrote outputs on failure", err);
		g_free(err);
		return;
	}
	check(err == NULL, "unpack set a reason on success", err);
	check(name == (const char *)body, "name not at the start of the body", NULL);
	check(strlen(name) + 1 + plen == len, "name and payload do not cover the body", name);
	check((plen == 0) == (payload == NULL), "payload pointer and length disagree", name);
	{
		GByteArray *again = g_byte_array_new();

		check(rpc_body_pack(again, name, payload, plen) == TE_OK, "repack refused", name);
		check(again->len == len && memcmp(again->data, body, len) == 0, "repack differs",
		      name);
		g_byte_array_unref(again);
	}
}

/* Decode frames one after another, as a connection would, under @max_body. */
static void fuzz_stream(const uint8_t *data, size_t size, size_t max_body)
{
	size_t off = 0;

	while (off < size) {
		struct rpc_frame_header hdr = { .type = 0xee };
		size_t flen = 0xdead;
		char *err = NULL;
		enum te_status st;

		st = rpc_frame_decode(data + off, size - off, max_body, &hdr, &flen, &err);
		if (st == TE_INPROGRESS) {
			check(err == NULL && hdr.type == 0xee && flen == 0xdead,
			      "in progress wrote outputs", err);
			/* With the header in, only the body can be missing. */
			if (size - off >= RPC_HEADER_SIZE) {
				check(rpc_header_decode(data + off, size - off, max_body, &hdr,
							NULL) == TE_OK,
				      "header decodes differently", NULL);
				check(hdr.body_len > size - off - RPC_HEADER_SIZE,
				      "in progress with the whole body present", NULL);
			}
			return;
		}
		if (st != TE_OK) {
			check(st == TE_ERR_PROTOCOL, "decode: unexpected status", NULL);
			check_reason(err, frame_reasons);
			check(hdr.type == 0xee && flen == 0xdead, "failure wrote outputs", err);
			check(rpc_frame_decode(data + off, size - off, max_body, &hdr, &flen,
					       NULL) == TE_ERR_PROTOCOL,
			      "decode without a reason differs", err);
			g_free(err);
			return;
		}
		check(err == NULL, "success set a reason", err);
		check(flen == RPC_HEADER_SIZE + (size_t)hdr.body_len && flen <= size - off,
		      "frame length wrong", NULL);
		check(hdr.body_len <= max_body, "body over the limit accepted", NULL);
		check(strcmp(rpc_type_str(hdr.type), "unknown") != 0, "unknown type accepted",
		      NULL);
		{
			/* Encoding the decoded frame reproduces its bytes exactly. */
			GByteArray *again = g_byte_array_new();

			rpc_frame_append(again, hdr.type, hdr.request_id, hdr.status,
					 data + off + RPC_HEADER_SIZE, hdr.body_len);
			check(again->len == flen && memcmp(again->data, data + off, flen) == 0,
			      "re-encoded frame differs", NULL);
			g_byte_array_unref(again);
		}
		if (hdr.type == RPC_HANDSHAKE || hdr.type == RPC_NOTIFY)
			fuzz_body(data + off + RPC_HEADER_SIZE, hdr.body_len);
		off += flen;
	}
}

/*
 * Refusals are final: once a prefix of the header is refused, every longer
 * prefix is refused for the same reason (the server relies on this to drop
 * garbage before a whole header arrives).
 */
static void fuzz_prefixes(const uint8_t *data, size_t size)
{
	char *first = NULL;

	for (size_t k = 0; k <= size && k <= RPC_HEADER_SIZE; k++) {
		struct rpc_frame_header hdr;
		char *err = NULL;
		enum te_status st = rpc_header_decode(data, k, RPC_DEFAULT_MAX_BODY, &hdr, &err);

		if (first) {
			check(st == TE_ERR_PROTOCOL, "a refused prefix became acceptable", first);
			/* Only a partial magic is reported with fewer digits. */
			check(g_str_has_prefix(first, "bad magic")
				      ? g_str_has_prefix(err, "bad magic")
				      : strcmp(err, first) == 0,
			      "a longer prefix is refused for another reason", err);
		} else if (st == TE_ERR_PROTOCOL) {
			first = g_strdup(err);
		} else {
			check(st == (k < RPC_HEADER_SIZE ? TE_INPROGRESS : TE_OK), "prefix status",
			      NULL);
		}
		g_free(err);
	}
	g_free(first);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_stream(data, size, 64);
	fuzz_stream(data, size, 4096);
	fuzz_stream(data, size, RPC_DEFAULT_MAX_BODY);
	fuzz_prefixes(data, size);
	fuzz_body(data, size);
	return 0;
}
