/* SPDX-License-Identifier: Apache-2.0 */
/* membuf.c: te-conformance's data patterns in host memory, or device memory through te_mem_copy. */
#include <string.h>

#include "conformance.h"

/* Bytes of the host bounce buffer for device memory. */
#define BOUNCE (4u << 20)

/*
 * Byte @i of pattern @seed: no short period, so bytes landing at a wrong offset are noticed,
 * and different seeds differ almost everywhere.
 */
static inline uint64_t pattern_word(uint64_t seed, uint64_t w)
{
	uint64_t x = w * 0x9e3779b97f4a7c15ull ^ (seed + 1) * 0xbf58476d1ce4e5b9ull;

	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return x;
}

uint8_t pattern_byte(uint64_t seed, uint64_t i)
{
	return (uint8_t)(pattern_word(seed, i >> 3) >> ((i & 7u) * 8u));
}

void pattern_fill(uint8_t *dst, uint64_t index, size_t len, uint64_t seed)
{
	size_t k = 0;

	for (; k < len && ((index + k) & 7u); k++)
		dst[k] = pattern_byte(seed, index + k);
	for (; k + 8 <= len; k += 8) {
		uint64_t x = pattern_word(seed, (index + k) >> 3);

		for (unsigned b = 0; b < 8; b++)
			dst[k + b] = (uint8_t)(x >> (b * 8));
	}
	for (; k < len; k++)
		dst[k] = pattern_byte(seed, index + k);
}

bool membuf_init(struct membuf *b, struct te_engine *e, uint8_t *base, size_t len, int64_t shift,
		 bool device, char *err, size_t cap)
{
	memset(b, 0, sizeof(*b));
	b->engine = e;
	b->base = base;
	b->len = len;
	b->shift = shift;
	b->device = device;
	if (device) {
		b->bounce = g_try_malloc(BOUNCE);
		if (!b->bounce) {
			g_snprintf(err, cap, "no memory for a %u-byte bounce buffer", BOUNCE);
			return false;
		}
	}
	return true;
}

void membuf_release(struct membuf *b)
{
	g_free(b->bounce);
	b->bounce = NULL;
}

static uint64_t idx(const struct membuf *b, uint64_t off)
{
	return (uint64_t)((int64_t)off + b->shift);
}

bool membuf_fill(struct membuf *b, uint64_t off, uint64_t len, uint64_t seed, char *err, size_t cap)
{
	if (off > b->len || len > b->len - off) {
		g_snprintf(err, cap,
			   "fill [%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT
			   ") is outside the %zu-byte buffer",
			   off, len, b->len);
		return false;
	}
	if (!b->device) {
		pattern_fill(b->base + off, idx(b, off), len, seed);
		return true;
	}
	for (uint64_t done = 0; done < len;) {
		size_t n = (size_t)MIN(len - done, (uint64_t)BOUNCE);
		enum te_status st;

		pattern_fill(b->bounce, idx(b, off + done), n, seed);
		st = te_mem_copy(b->engine, b->base + off + done, b->bounce, n);
		if (st != TE_OK) {
			g_snprintf(err, cap, "te_mem_copy to device memory: %s: %s",
				   te_status_str(st), te_last_error());
			return false;
		}
		done += n;
	}
	return true;
}

/* Host bytes of [off, +n) (n <= BOUNCE): in place, or copied into the bounce buffer. */
static const uint8_t *view(struct membuf *b, uint64_t off, size_t n, char *why, size_t cap)
{
	enum te_status st;

	if (!b->device)
		return b->base + off;
	st = te_mem_copy(b->engine, b->bounce, b->base + off, n);
	if (st != TE_OK) {
		g_snprintf(why, cap, "te_mem_copy from device memory: %s: %s", te_status_str(st),
			   te_last_error());
		return NULL;
	}
	return b->bounce;
}

enum membuf_bad membuf_check(struct membuf *b, uint64_t off, uint64_t len, uint64_t a, uint64_t b2,
			     bool either, struct membuf_diff *diff)
{
	uint8_t want[4096], alt[4096];

	if (off > b->len || len > b->len - off) {
		g_snprintf(diff->why, sizeof(diff->why), "range outside the buffer");
		return MEMBUF_COPY;
	}
	for (uint64_t done = 0; done < len;) {
		size_t n = (size_t)MIN(len - done, (uint64_t)BOUNCE);
		const uint8_t *p = view(b, off + done, n, diff->why, sizeof(diff->why));

		if (!p)
			return MEMBUF_COPY;
		for (size_t k = 0; k < n; k += sizeof(want)) {
			size_t m = MIN(n - k, sizeof(want));

			pattern_fill(want, idx(b, off + done + k), m, a);
			if (either)
				pattern_fill(alt, idx(b, off + done + k), m, b2);
			if (memcmp(p + k, want, m) == 0)
				continue;
			for (size_t j = 0; j < m; j++) {
				if (p[k + j] == want[j] || (either && p[k + j] == alt[j]))
					continue;
				diff->off = off + done + k + j;
				diff->got = p[k + j];
				diff->want = want[j];
				g_snprintf(diff->why, sizeof(diff->why),
					   "byte at offset %" G_GUINT64_FORMAT
					   " is 0x%02x, expected 0x%02x%s",
					   diff->off, diff->got, diff->want,
					   either ? " (or the other pattern)" : "");
				return MEMBUF_MISMATCH;
			}
		}
		done += n;
	}
	return MEMBUF_OK;
}

bool membuf_sum(struct membuf *b, uint64_t off, uint64_t len, uint64_t *sum, char *err, size_t cap)
{
	uint64_t h = 0xcbf29ce484222325ull;

	if (off > b->len || len > b->len - off) {
		g_snprintf(err, cap, "range outside the buffer");
		return false;
	}
	for (uint64_t done = 0; done < len;) {
		size_t n = (size_t)MIN(len - done, (uint64_t)BOUNCE);
		const uint8_t *p = view(b, off + done, n, err, cap);

		if (!p)
			return false;
		for (size_t k = 0; k < n; k++) {
			h ^= p[k];
			h *= 0x100000001b3ull;
		}
		done += n;
	}
	*sum = h;
	return true;
}
