/* SPDX-License-Identifier: Apache-2.0 */
/* descriptor.h: the segment descriptor (JSON) that peers exchange through metadata. */
#ifndef TE_CORE_METADATA_DESCRIPTOR_H
#define TE_CORE_METADATA_DESCRIPTOR_H

#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

/* Limits on what a decoder accepts from a peer (every input is bounded). */
#define DESCRIPTOR_MAX_JSON (16u << 20)
#define DESCRIPTOR_MAX_BUFFERS 65536u
#define DESCRIPTOR_MAX_TRANSPORTS 32u
#define DESCRIPTOR_MAX_BLOB 4096u
#define DESCRIPTOR_MAX_NAME 256u

/* A blob published by one transport, or one transport's key of a buffer. */
struct descriptor_blob {
	char *transport; /* plugin name */
	GBytes *blob;	 /* raw bytes (base64 in JSON) */
};

struct descriptor_buffer {
	uint64_t addr;
	uint64_t length;
	char *location;	 /* "cpu:0", "cuda:1", ... */
	uint32_t access; /* TE_MEM_REMOTE_* */
	struct descriptor_blob *keys;
	size_t n_keys;
};

struct descriptor {
	char *name;
	uint64_t generation; /* new random value on every engine start */
	char *rpc;	     /* control-plane "host:port" or "" */
	char *host_id;	     /* identifies the host (boot id) for same-host transports */
	uint32_t pid;	     /* process id, for same-process transports */
	char *pid_ns; /* pid namespace ("pid:[4026531836]") or NULL: where pid means something */
	struct descriptor_blob *transports;
	size_t n_transports;
	struct descriptor_buffer *buffers; /* sorted by addr, non-overlapping */
	size_t n_buffers;
};

/*
 * descriptor_encode - JSON text (NUL-terminated, g_free) of @d:
 * {"name", "generation" (decimal string: JSON numbers lose 64-bit precision),
 *  "rpc", "host", "pid", "pidns" (optional), "transports": {<plugin>: <base64>},
 *  "buffers": [{"addr": "0x..", "length": "..", "location", "access",
 *               "keys": {<plugin>: <base64>}}]}
 */
char *descriptor_encode(const struct descriptor *d, size_t *len_out);

/*
 * descriptor_decode - parse and validate @len bytes of JSON (pure). Rejects
 * missing or mistyped fields, oversize input, overlapping or wrapping buffers,
 * bad base64, over-limit counts; unknown members are ignored (forward
 * compatibility). Buffers come out sorted by addr. On failure returns
 * TE_ERR_METADATA_MALFORMED and *err_out (g_free) says which field and why.
 */
enum te_status descriptor_decode(const char *json, size_t len, struct descriptor **d_out,
				 char **err_out);

/* Blob of @transport in @blobs, or NULL. */
GBytes *descriptor_find_blob(const struct descriptor_blob *blobs, size_t n, const char *transport);

/*
 * descriptor_find_buffer - the buffer containing [addr, addr+length), or NULL
 * (binary search; length > 0; rejects wrap-around).
 */
const struct descriptor_buffer *descriptor_find_buffer(const struct descriptor *d, uint64_t addr,
						       uint64_t length);

void descriptor_free(struct descriptor *d);

#endif /* TE_CORE_METADATA_DESCRIPTOR_H */
