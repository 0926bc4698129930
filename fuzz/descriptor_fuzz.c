/* SPDX-License-Identifier: Apache-2.0 */
/* descriptor_fuzz.c: fuzz target: decode any bytes, and re-encode what decodes, exactly. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>

#include "core/metadata/descriptor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Not assert(): the checks must hold in NDEBUG builds too. */
#define DESCRIPTOR_FUZZ_CHECK(cond)                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

static bool descriptor_fuzz_blob_equal(GBytes *a, GBytes *b)
{
	gsize na = a ? g_bytes_get_size(a) : 0, nb = b ? g_bytes_get_size(b) : 0;

	return na == nb &&
	       (na == 0 || memcmp(g_bytes_get_data(a, NULL), g_bytes_get_data(b, NULL), na) == 0);
}

static bool descriptor_fuzz_blobs_equal(const struct descriptor_blob *a, size_t na,
					const struct descriptor_blob *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++) {
		if (strcmp(a[i].transport, b[i].transport) != 0 ||
		    !descriptor_fuzz_blob_equal(a[i].blob, b[i].blob))
			return false;
	}
	return true;
}

static bool descriptor_fuzz_equal(const struct descriptor *a, const struct descriptor *b)
{
	if (strcmp(a->name, b->name) != 0 || a->generation != b->generation ||
	    strcmp(a->rpc, b->rpc) != 0 || strcmp(a->host_id, b->host_id) != 0 ||
	    a->pid != b->pid || a->n_buffers != b->n_buffers ||
	    !descriptor_fuzz_blobs_equal(a->transports, a->n_transports, b->transports,
					 b->n_transports))
		return false;
	for (size_t i = 0; i < a->n_buffers; i++) {
		const struct descriptor_buffer *x = &a->buffers[i], *y = &b->buffers[i];

		if (x->addr != y->addr || x->length != y->length ||
		    strcmp(x->location, y->location) != 0 || x->access != y->access ||
		    !descriptor_fuzz_blobs_equal(x->keys, x->n_keys, y->keys, y->n_keys))
			return false;
	}
	return true;
}

static void descriptor_fuzz_check_blobs(const struct descriptor_blob *blobs, size_t n)
{
	DESCRIPTOR_FUZZ_CHECK(n <= DESCRIPTOR_MAX_TRANSPORTS);
	for (size_t i = 0; i < n; i++) {
		DESCRIPTOR_FUZZ_CHECK(blobs[i].transport && blobs[i].transport[0]);
		DESCRIPTOR_FUZZ_CHECK(strlen(blobs[i].transport) <= DESCRIPTOR_MAX_NAME);
		DESCRIPTOR_FUZZ_CHECK(blobs[i].blob);
		DESCRIPTOR_FUZZ_CHECK(g_bytes_get_size(blobs[i].blob) <= DESCRIPTOR_MAX_BLOB);
		DESCRIPTOR_FUZZ_CHECK(descriptor_find_blob(blobs, n, blobs[i].transport) ==
				      blobs[i].blob);
	}
}

/* What decode promises about every descriptor it returns. */
static void descriptor_fuzz_check(const struct descriptor *d)
{
	DESCRIPTOR_FUZZ_CHECK(d->name[0] && strlen(d->name) <= DESCRIPTOR_MAX_NAME);
	DESCRIPTOR_FUZZ_CHECK(strlen(d->rpc) <= DESCRIPTOR_MAX_NAME);
	DESCRIPTOR_FUZZ_CHECK(strlen(d->host_id) <= DESCRIPTOR_MAX_NAME);
	descriptor_fuzz_check_blobs(d->transports, d->n_transports);
	DESCRIPTOR_FUZZ_CHECK(d->n_buffers <= DESCRIPTOR_MAX_BUFFERS);
	for (size_t i = 0; i < d->n_buffers; i++) {
		const struct descriptor_buffer *b = &d->buffers[i];
		uint64_t last = b->addr + (b->length - 1);

		DESCRIPTOR_FUZZ_CHECK(b->length > 0 && last >= b->addr);
		DESCRIPTOR_FUZZ_CHECK((b->access & ~TE_MEM_REMOTE) == 0);
		DESCRIPTOR_FUZZ_CHECK(strlen(b->location) <= DESCRIPTOR_MAX_NAME);
		/* Sorted and disjoint, so binary search finds each byte's owner. */
		if (i > 0)
			DESCRIPTOR_FUZZ_CHECK(b->addr > d->buffers[i - 1].addr +
								(d->buffers[i - 1].length - 1));
		DESCRIPTOR_FUZZ_CHECK(descriptor_find_buffer(d, b->addr, b->length) == b);
		DESCRIPTOR_FUZZ_CHECK(descriptor_find_buffer(d, last, 1) == b);
		/* A range one byte past either end is in a gap or spans two buffers. */
		if (b->addr > 0)
			DESCRIPTOR_FUZZ_CHECK(descriptor_find_buffer(d, b->addr - 1, 2) == NULL);
		if (last < UINT64_MAX)
			DESCRIPTOR_FUZZ_CHECK(descriptor_find_buffer(d, last, 2) == NULL);
		descriptor_fuzz_check_blobs(b->keys, b->n_keys);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct descriptor *d = NULL, *again = NULL;
	char *err = NULL, *text, *text2;
	size_t len = 0, len2 = 0;
	enum te_status st;

	st = descriptor_decode((const char *)data, size, &d, &err);
	if (st != TE_OK) {
		DESCRIPTOR_FUZZ_CHECK(st == TE_ERR_METADATA_MALFORMED);
		DESCRIPTOR_FUZZ_CHECK(d == NULL);
		DESCRIPTOR_FUZZ_CHECK(err && g_str_has_prefix(err, "descriptor: "));
		g_free(err);
		return 0;
	}
	DESCRIPTOR_FUZZ_CHECK(d && !err);
	descriptor_fuzz_check(d);

	/* Whatever decodes must survive encode -> decode unchanged, and encode canonically. */
	text = descriptor_encode(d, &len);
	DESCRIPTOR_FUZZ_CHECK(text && len == strlen(text));
	st = descriptor_decode(text, len, &again, &err);
	if (st != TE_OK)
		fprintf(stderr, "re-decode failed: %s\n", err);
	DESCRIPTOR_FUZZ_CHECK(st == TE_OK);
	DESCRIPTOR_FUZZ_CHECK(descriptor_fuzz_equal(d, again));
	text2 = descriptor_encode(again, &len2);
	DESCRIPTOR_FUZZ_CHECK(len == len2 && memcmp(text, text2, len) == 0);

	g_free(text2);
	g_free(text);
	descriptor_free(again);
	descriptor_free(d);
	return 0;
}
