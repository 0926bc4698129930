/* SPDX-License-Identifier: Apache-2.0 */
/* sysnode.h: data patterns and checksums shared by te-node and the system tests that drive it. */
#ifndef TE_TESTS_LIB_SYSNODE_H
#define TE_TESTS_LIB_SYSNODE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Byte @i (offset from the start of te-node's allocation, guard zones included) of the
 * pattern @seed. Seed 0 is the pattern te-node starts with, (uint8_t)(i * 131 + 7); its
 * period is 256 bytes, so te-node keeps its guard zones a multiple of 256 and byte j of the
 * registered buffer is (uint8_t)(j * 131 + 7) as well. Other seeds give a pattern without a
 * short period, so that data landing at a wrong offset is noticed.
 */
static inline uint8_t sysnode_pattern(uint64_t seed, uint64_t i)
{
	uint64_t x;

	if (seed == 0)
		return (uint8_t)(i * 131u + 7u);
	x = (i >> 3) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (uint8_t)(x >> ((i & 7u) * 8u));
}

/* Write @len bytes of pattern @seed to @dst, which holds offsets [@off, @off + @len). */
static inline void sysnode_fill(uint8_t *dst, uint64_t off, size_t len, uint64_t seed)
{
	for (size_t k = 0; k < len; k++)
		dst[k] = sysnode_pattern(seed, off + k);
}

/* 64-bit FNV-1a of @len bytes: what te-node's "checksum" command prints. */
static inline uint64_t sysnode_fnv(const uint8_t *p, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t k = 0; k < len; k++) {
		h ^= p[k];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Guard bytes on each side of te-node's registered buffer unless --guard says otherwise. */
#define SYSNODE_DEFAULT_GUARD (64u << 10)

/* Registered bytes unless --size says otherwise: 64 MiB plus room for unaligned 64 MiB. */
#define SYSNODE_DEFAULT_SIZE ((64u << 20) + (64u << 10))

/* Longest range the "dump" command prints. */
#define SYSNODE_DUMP_MAX 4096u

#endif /* TE_TESTS_LIB_SYSNODE_H */
