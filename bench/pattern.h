/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pattern.h: the byte pattern te-bench, tcp-raw-loop and te-mesh fill and check buffers with.
 * Byte o of a region with salt s is byte o % 8 (little-endian) of mix((o / 8) XOR s), where
 * mix is a multiply by an odd constant and one xorshift: a bijection of the word index, so no
 * two words of a region are alike, at one multiply and one shift per 8 bytes. One function
 * for all three, so the bytes te-bench's target holds are the raw loop's server's, and the
 * mesh's te and raw rounds spend the same CPU on checking.
 */
#ifndef TE_BENCH_PATTERN_H
#define TE_BENCH_PATTERN_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

/* A salt per iteration: odd multiplier, so distinct iterations give distinct salts; 0 gives 0. */
static inline uint64_t pattern_salt(uint64_t iteration)
{
	return iteration * UINT64_C(0xd6e8feb86659fd93);
}

/* Word @word_index of the pattern with @salt, as stored (little-endian). */
static inline uint64_t pattern_word(uint64_t word_index, uint64_t salt)
{
	uint64_t x = (word_index ^ salt) * UINT64_C(0x9e3779b97f4a7c15);

	return htole64(x ^ (x >> 29));
}

static inline uint8_t pattern_byte(uint64_t off, uint64_t salt)
{
	uint64_t w = le64toh(pattern_word(off >> 3, salt));

	return (uint8_t)(w >> (8 * (off & 7)));
}

/* Write the pattern of offsets [off, off + len) into p. */
static inline void pattern_fill(uint8_t *p, uint64_t off, uint64_t len, uint64_t salt)
{
	uint64_t i = 0;

	for (; i < len && ((off + i) & 7); i++)
		p[i] = pattern_byte(off + i, salt);
	for (; i + 8 <= len; i += 8) {
		uint64_t w = pattern_word((off + i) >> 3, salt);

		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = pattern_byte(off + i, salt);
}

/* Index of the first byte of p that differs from the pattern of [off, off + len), or len. */
static inline uint64_t pattern_check(const uint8_t *p, uint64_t off, uint64_t len, uint64_t salt)
{
	uint64_t i = 0;

	for (; i < len && ((off + i) & 7); i++)
		if (p[i] != pattern_byte(off + i, salt))
			return i;
	for (; i + 8 <= len; i += 8) {
		uint64_t w = pattern_word((off + i) >> 3, salt), got;

		memcpy(&got, p + i, 8);
		if (got != w)
			break;
	}
	for (; i < len; i++)
		if (p[i] != pattern_byte(off + i, salt))
			return i;
	return len;
}

#endif
