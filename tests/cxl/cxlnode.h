/* SPDX-License-Identifier: Apache-2.0 */
/* cxlnode.h: data pattern and window-file helpers shared by cxl-node and the cxl tests. */
#ifndef TE_TESTS_CXL_CXLNODE_H
#define TE_TESTS_CXL_CXLNODE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * Byte @o (offset from the start of a registered window buffer) of pattern @seed: byte o % 8
 * of cxlnode_word(o / 8, seed), little-endian. No short period, so data that lands at a
 * wrong offset or comes from another seed is noticed.
 */
static inline uint64_t cxlnode_word(uint64_t i, uint64_t seed)
{
	uint64_t x = i * 0x9e3779b97f4a7c15ull ^ (seed + 1) * 0xbf58476d1ce4e5b9ull;

	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return x;
}

static inline uint8_t cxlnode_byte(uint64_t o, uint64_t seed)
{
	return (uint8_t)(cxlnode_word(o >> 3, seed) >> ((o & 7) * 8));
}

/* Write pattern @seed for offsets [@off, +@len) into @dst. */
static inline void cxlnode_fill(uint8_t *dst, uint64_t off, size_t len, uint64_t seed)
{
	size_t k = 0;

	for (; k < len && ((off + k) & 7); k++)
		dst[k] = cxlnode_byte(off + k, seed);
	for (; k + 8 <= len; k += 8) {
		uint64_t w = cxlnode_word((off + k) >> 3, seed);

		memcpy(dst + k, &w, 8); /* little-endian hosts only, like the rest of te's tests */
	}
	for (; k < len; k++)
		dst[k] = cxlnode_byte(off + k, seed);
}

/* Index of the first byte of @p (holding offsets [@off, +@len)) that differs from @seed. */
static inline size_t cxlnode_check(const uint8_t *p, uint64_t off, size_t len, uint64_t seed)
{
	size_t k = 0;

	for (; k < len && ((off + k) & 7); k++)
		if (p[k] != cxlnode_byte(off + k, seed))
			return k;
	for (; k + 8 <= len; k += 8) {
		uint64_t w = cxlnode_word((off + k) >> 3, seed), got;

		memcpy(&got, p + k, 8);
		if (got != w)
			break;
	}
	for (; k < len; k++)
		if (p[k] != cxlnode_byte(off + k, seed))
			return k;
	return len;
}

#endif /* TE_TESTS_CXL_CXLNODE_H */
