/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_copy_test.c: the cxl plugin's copy routines at every alignment with each instruction set. */

/*
 * plugins/cxl/cxl_copy.c is compiled into this test. Every implementation the CPU allows
 * (plain, sse2, avx2) with every flush variant (clflushopt, clflush, none) and every flag
 * combination copies ranges of many lengths between all 64 x 64 line offsets; the copy must
 * be exact and every byte around the destination untouched. Further cases: copies that end
 * at a page followed by an inaccessible page (no byte outside the range is read or written),
 * and threads that stream into interleaved byte ranges sharing cache lines (no
 * read-modify-write of a line, which would lose a neighbour's bytes).
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <glib.h>

#include "cxl_copy.h"
#include "cxlnode.h"

#define GUARD 128u
#define BIG (300u << 10) /* beyond the 64 KiB invalidate-then-copy step, several times */

struct variant {
	enum cxl_copy_impl impl;
	uint32_t features;
	char name[48];
};

/* Every copier this CPU can run, with each flush instruction it has. */
static size_t variants(struct variant *v, size_t cap)
{
	uint32_t cpu = cxl_copy_detect();
	static const enum cxl_copy_impl impls[] = { CXL_IMPL_PLAIN, CXL_IMPL_SSE2, CXL_IMPL_AVX2 };
	const uint32_t flushes[] = { CXL_CPU_CLFLUSHOPT, CXL_CPU_CLFLUSH, 0 };
	const uint32_t base = cpu & ~(CXL_CPU_CLFLUSHOPT | CXL_CPU_CLFLUSH);
	size_t n = 0;

	for (size_t i = 0; i < G_N_ELEMENTS(impls); i++) {
		for (size_t f = 0; f < G_N_ELEMENTS(flushes) && n < cap; f++) {
			struct cxl_copier c;

			if (flushes[f] && !(cpu & flushes[f]))
				continue;
			if (cxl_copier_init(&c, impls[i], base | flushes[f]) != 0)
				continue;
			v[n].impl = impls[i];
			v[n].features = base | flushes[f];
			g_snprintf(v[n].name, sizeof(v[n].name), "%s/%s",
				   cxl_copy_impl_name(impls[i]),
				   impls[i] == CXL_IMPL_PLAIN	      ? "noflush"
				   : flushes[f] == CXL_CPU_CLFLUSHOPT ? "clflushopt"
				   : flushes[f] == CXL_CPU_CLFLUSH    ? "clflush"
								      : "noflush");
			n++;
			if (impls[i] == CXL_IMPL_PLAIN)
				break; /* plain uses no flush at all */
		}
	}
	return n;
}

static void test_detect(void)
{
	uint32_t cpu = cxl_copy_detect();
	struct cxl_copier c;

	g_test_message("features 0x%x, best %s", cpu, cxl_copy_impl_name(cxl_copy_best(cpu)));
	g_assert_cmpint(cxl_copier_init(&c, cxl_copy_best(cpu), cpu), ==, 0);
	g_assert_cmpint(cxl_copier_init(&c, CXL_IMPL_PLAIN, 0), ==, 0);
	g_assert_null(c.flush);
	g_assert_cmpint(cxl_copier_init(&c, CXL_IMPL_AVX2, 0), ==, -1);
	g_assert_cmpint(cxl_copier_init(&c, CXL_IMPL_SSE2, 0), ==, -1);
#if defined(__x86_64__)
	g_assert_true(cpu & CXL_CPU_SSE2);
	g_assert_cmpint(cxl_copier_init(&c, CXL_IMPL_SSE2, cpu), ==, 0);
	g_assert_nonnull(c.flush);
	g_assert_cmpuint(c.line, >=, 16);
	g_assert_cmpuint(c.line & (c.line - 1), ==, 0);
#endif
}

/* One copy of @len bytes to dst + @doff from src + @soff, checked with its surroundings. */
static void copy_one(const struct cxl_copier *c, uint8_t *dst, const uint8_t *src, size_t doff,
		     size_t soff, size_t len, unsigned flags, const char *name)
{
	size_t span = GUARD + BIG + 64 + GUARD, bad, after;

	cxl_copy(c, dst + GUARD + doff, src + soff, len, flags);
	bad = cxlnode_check(dst + GUARD + doff, soff, len, 1);
	if (bad != len)
		g_error("%s flags %u: dst+%zu src+%zu len %zu: byte %zu wrong", name, flags, doff,
			soff, len, bad);
	/*
	 * Around the destination: the guard pattern (seed 2, offsets of dst); after a long copy
	 * all of the rest, after a short one the next GUARD bytes (what a stray vector store
	 * could reach).
	 */
	after = span - (GUARD + doff + len);
	if (len < 4096 && after > GUARD)
		after = GUARD;
	if (cxlnode_check(dst, 0, GUARD + doff, 2) != GUARD + doff ||
	    cxlnode_check(dst + GUARD + doff + len, GUARD + doff + len, after, 2) != after)
		g_error("%s flags %u: dst+%zu src+%zu len %zu: a byte outside was written", name,
			flags, doff, soff, len);
	/* Restore what was written, for the next copy. */
	cxlnode_fill(dst + GUARD + doff, GUARD + doff, len, 2);
}

static void test_alignments(void)
{
	static const size_t extra[] = { 255,   256,   257,   1000,	   4095,	4096, 4097,
					65535, 65536, 65537, 65536 + 4033, 131072 + 77, BIG };
	static const size_t soffs[] = { 0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63 };
	size_t span = GUARD + BIG + 64 + GUARD;
	uint8_t *src = g_malloc(BIG + 64), *dst = g_malloc(span);
	struct variant v[16];
	size_t nv = variants(v, G_N_ELEMENTS(v));

	cxlnode_fill(src, 0, BIG + 64, 1);
	cxlnode_fill(dst, 0, span, 2);
	for (size_t i = 0; i < nv; i++) {
		struct cxl_copier c;

		g_assert_cmpint(cxl_copier_init(&c, v[i].impl, v[i].features), ==, 0);
		g_test_message("variant %s", v[i].name);
		for (unsigned flags = 0; flags < 4; flags++) {
			for (size_t d = 0; d < 64; d++)
				for (size_t s = 0; s < G_N_ELEMENTS(soffs); s++)
					for (size_t len = 0; len <= 200; len++)
						copy_one(&c, dst, src, d, soffs[s], len, flags,
							 v[i].name);
			for (size_t d = 0; d < 64; d += 7)
				for (size_t s = 0; s < G_N_ELEMENTS(soffs); s += 5)
					for (size_t e = 0; e < G_N_ELEMENTS(extra); e++)
						copy_one(&c, dst, src, d, soffs[s], extra[e], flags,
							 v[i].name);
		}
	}
	g_free(src);
	g_free(dst);
}

/* Copies touching a page that is followed (or preceded) by an inaccessible page. */
static void test_page_edges(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct variant v[16];
	size_t nv = variants(v, G_N_ELEMENTS(v));
	/* [none][rw][rw][none] for the source and the same for the destination. */
	uint8_t *s =
		mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *d =
		mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	g_assert_true(s != MAP_FAILED && d != MAP_FAILED);
	g_assert_cmpint(mprotect(s, page, PROT_NONE), ==, 0);
	g_assert_cmpint(mprotect(s + 3 * page, page, PROT_NONE), ==, 0);
	g_assert_cmpint(mprotect(d, page, PROT_NONE), ==, 0);
	g_assert_cmpint(mprotect(d + 3 * page, page, PROT_NONE), ==, 0);
	cxlnode_fill(s + page, 0, 2 * page, 3);
	for (size_t i = 0; i < nv; i++) {
		struct cxl_copier c;

		g_assert_cmpint(cxl_copier_init(&c, v[i].impl, v[i].features), ==, 0);
		for (unsigned flags = 0; flags < 4; flags++) {
			for (size_t len = 1; len <= 130; len++) {
				/* Both ranges end at the last accessible byte. */
				uint8_t *se = s + 3 * page - len, *de = d + 3 * page - len;

				memset(d + page, 0, 2 * page);
				cxl_copy(&c, de, se, len, flags);
				g_assert_cmpint(memcmp(de, se, len), ==, 0);
				/* Both ranges start at the first accessible byte. */
				cxl_copy(&c, d + page, s + page, len, flags);
				g_assert_cmpint(memcmp(d + page, s + page, len), ==, 0);
				g_assert_cmpuint(d[page + len], ==, 0);
			}
		}
	}
	munmap(s, 4 * page);
	munmap(d, 4 * page);
}

/*
 * Writers stream into interleaved ranges of 37 bytes (so neighbours share lines), each
 * repeatedly with a new seed; in the end every range holds its own writer's last seed.
 */
#define IL_LEN 37u
#define IL_COUNT 4096u
#define IL_ROUNDS 40u

struct il_writer {
	const struct cxl_copier *c;
	uint8_t *area;
	unsigned parity;
	atomic_int *go;
};

static void *il_main(void *arg)
{
	struct il_writer *w = arg;
	g_autofree uint8_t *src = g_malloc(IL_LEN * IL_COUNT);

	while (!atomic_load(w->go))
		;
	for (unsigned r = 0; r < IL_ROUNDS; r++) {
		uint64_t seed = 100 + 2 * r + w->parity;

		cxlnode_fill(src, 0, IL_LEN * IL_COUNT, seed);
		for (unsigned k = w->parity; k < IL_COUNT; k += 2)
			cxl_copy(w->c, w->area + k * IL_LEN, src + k * IL_LEN, IL_LEN,
				 CXL_COPY_STREAM_DST);
	}
	return NULL;
}

static void test_interleaved_writers(void)
{
	struct variant v[16];
	size_t nv = variants(v, G_N_ELEMENTS(v));
	g_autofree uint8_t *area = g_malloc0(IL_LEN * IL_COUNT + 64);

	for (size_t i = 0; i < nv; i++) {
		struct cxl_copier c;
		struct il_writer w[2];
		pthread_t t[2];
		atomic_int go = 0;

		g_assert_cmpint(cxl_copier_init(&c, v[i].impl, v[i].features), ==, 0);
		for (unsigned k = 0; k < 2; k++) {
			w[k] = (struct il_writer){ &c, area + 5, k, &go };
			g_assert_cmpint(pthread_create(&t[k], NULL, il_main, &w[k]), ==, 0);
		}
		atomic_store(&go, 1);
		for (unsigned k = 0; k < 2; k++)
			pthread_join(t[k], NULL);
		for (unsigned k = 0; k < IL_COUNT; k++) {
			uint64_t seed = 100 + 2 * (IL_ROUNDS - 1) + (k & 1);

			if (cxlnode_check(area + 5 + k * IL_LEN, k * IL_LEN, IL_LEN, seed) !=
			    IL_LEN)
				g_error("%s: range %u lost bytes to its neighbour", v[i].name, k);
		}
	}
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/cxl/copy/detect", test_detect);
	g_test_add_func("/cxl/copy/alignments", test_alignments);
	g_test_add_func("/cxl/copy/page-edges", test_page_edges);
	g_test_add_func("/cxl/copy/interleaved-writers", test_interleaved_writers);
	return g_test_run();
}
