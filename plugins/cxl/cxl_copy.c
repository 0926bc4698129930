/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_copy.c: streaming stores, line invalidation and fences for copies through a CXL window. */

/*
 * Why these instructions (README.md, "Ordering and cache management", says what users get):
 *
 * - Writes into the window use non-temporal (streaming) stores: they bypass this CPU's cache,
 *   so no dirty copy of a window line is left behind for a later eviction to write back over
 *   a peer's newer data, and a store fence pushes them out of the write-combining buffers.
 *   Lines that are only partly covered are written with byte-masked streaming stores
 *   (MASKMOVDQU), never by reading the line, merging and writing it whole: a peer writing the
 *   rest of that line at the same time keeps its bytes.
 * - Reads from the window first invalidate the source lines (CLFLUSHOPT, else CLFLUSH) and
 *   fence, so the loads that follow miss this CPU's cache and see what the device holds.
 *   The range is processed in steps: while step k is copied, the invalidations of step k + 1
 *   are already in flight, and one MFENCE per step waits for both.
 * - The features are chosen at run time; the vector code is compiled with target attributes,
 *   so the build needs no -m flags. Without them (another architecture, or "copy: plain") the
 *   copies are memcpy with sequentially consistent fences: correct only where the hardware
 *   keeps the window coherent.
 */

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "cxl_copy.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define CXL_X86 1
#else
#define CXL_X86 0
#endif

/* Bytes per pipelined invalidate-then-copy step (chosen by measurement, see README.md). */
#define CXL_STEP (64u << 10)
#define CXL_DEF_LINE 64u

/* --- x86-64 ------------------------------------------------------------------------------ */

#if CXL_X86

/* Byte-masked streaming store of [@src, +@k) to @dst; the range lies in one 16-byte block. */
static inline void cxl_masked16(uint8_t *dst, const uint8_t *src, size_t k)
{
	uint8_t *blk = (uint8_t *)((uintptr_t)dst & ~(uintptr_t)15);
	size_t lane = (size_t)(dst - blk);
	uint8_t data[16] __attribute__((aligned(16))) = { 0 };
	uint8_t mask[16] __attribute__((aligned(16))) = { 0 };

	/* Only the requested source bytes are loaded: the source may end at a page boundary. */
	memcpy(data + lane, src, k);
	memset(mask + lane, 0x80, k);
	_mm_maskmoveu_si128(_mm_load_si128((const __m128i *)(const void *)data),
			    _mm_load_si128((const __m128i *)(const void *)mask), (char *)blk);
}

static void cxl_stream_sse2(uint8_t *dst, const uint8_t *src, size_t n)
{
	size_t head = (size_t)(-(uintptr_t)dst & 15);

	if (head) {
		head = head < n ? head : n;
		cxl_masked16(dst, src, head);
		dst += head;
		src += head;
		n -= head;
	}
	for (; n >= 64; dst += 64, src += 64, n -= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));

		_mm_stream_si128((__m128i *)(void *)dst, a);
		_mm_stream_si128((__m128i *)(void *)(dst + 16), b);
		_mm_stream_si128((__m128i *)(void *)(dst + 32), c);
		_mm_stream_si128((__m128i *)(void *)(dst + 48), d);
	}
	for (; n >= 16; dst += 16, src += 16, n -= 16)
		_mm_stream_si128((__m128i *)(void *)dst,
				 _mm_loadu_si128((const __m128i *)(const void *)src));
	if (n)
		cxl_masked16(dst, src, n);
}

__attribute__((target("avx2"))) static void cxl_stream_avx2(uint8_t *dst, const uint8_t *src,
							    size_t n)
{
	size_t head = (size_t)(-(uintptr_t)dst & 15);

	if (head) {
		head = head < n ? head : n;
		cxl_masked16(dst, src, head);
		dst += head;
		src += head;
		n -= head;
	}
	/* 32-byte streaming stores need 32-byte alignment. */
	if (n >= 16 && ((uintptr_t)dst & 16)) {
		_mm_stream_si128((__m128i *)(void *)dst,
				 _mm_loadu_si128((const __m128i *)(const void *)src));
		dst += 16;
		src += 16;
		n -= 16;
	}
	for (; n >= 64; dst += 64, src += 64, n -= 64) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(const void *)src);
		__m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32));

		_mm256_stream_si256((__m256i *)(void *)dst, a);
		_mm256_stream_si256((__m256i *)(void *)(dst + 32), b);
	}
	if (n >= 32) {
		_mm256_stream_si256((__m256i *)(void *)dst,
				    _mm256_loadu_si256((const __m256i *)(const void *)src));
		dst += 32;
		src += 32;
		n -= 32;
	}
	if (n >= 16) {
		_mm_stream_si128((__m128i *)(void *)dst,
				 _mm_loadu_si128((const __m128i *)(const void *)src));
		dst += 16;
		src += 16;
		n -= 16;
	}
	if (n)
		cxl_masked16(dst, src, n);
}

__attribute__((target("clflushopt"))) static void cxl_flush_opt(const struct cxl_copier *c,
								const uint8_t *p, size_t n)
{
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(c->line - 1), end = (uintptr_t)p + n;

	for (; a < end; a += c->line)
		_mm_clflushopt((void *)a);
}

static void cxl_flush_legacy(const struct cxl_copier *c, const uint8_t *p, size_t n)
{
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(c->line - 1), end = (uintptr_t)p + n;

	for (; a < end; a += c->line)
		_mm_clflush((const void *)a);
}

/* CLFLUSH line size from CPUID leaf 1 (EBX[15:8] in 8-byte units). */
static uint32_t cxl_line_size(void)
{
	unsigned a, b, c, d;
	uint32_t line;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return CXL_DEF_LINE;
	line = ((b >> 8) & 0xffu) * 8u;
	return line >= 16 && (line & (line - 1)) == 0 ? line : CXL_DEF_LINE;
}

uint32_t cxl_copy_detect(void)
{
	unsigned a, b, c, d;
	uint32_t f = 0;

	if (__get_cpuid(1, &a, &b, &c, &d)) {
		if (d & (1u << 26))
			f |= CXL_CPU_SSE2;
		if (d & (1u << 19))
			f |= CXL_CPU_CLFLUSH;
	}
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
		if (b & (1u << 23))
			f |= CXL_CPU_CLFLUSHOPT;
		if (b & (1u << 24))
			f |= CXL_CPU_CLWB;
	}
	/* Also checks that the OS saves the YMM state. */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		f |= CXL_CPU_AVX2;
	return f;
}

/* MFENCE is the sequentially consistent fence of x86 (plain copies use it too). */
static void cxl_fence_full(const struct cxl_copier *c)
{
	(void)c;
	_mm_mfence();
}

/* SFENCE drains streaming stores; plain copies get a full fence. */
static void cxl_fence_store(const struct cxl_copier *c)
{
	if (c->impl == CXL_IMPL_PLAIN)
		_mm_mfence();
	else
		_mm_sfence();
}

#else /* !CXL_X86 */

static uint32_t cxl_line_size(void)
{
	return CXL_DEF_LINE;
}

uint32_t cxl_copy_detect(void)
{
	return 0;
}

static void cxl_fence_full(const struct cxl_copier *c)
{
	(void)c;
	atomic_thread_fence(memory_order_seq_cst);
}

static void cxl_fence_store(const struct cxl_copier *c)
{
	(void)c;
	atomic_thread_fence(memory_order_seq_cst);
}

#endif /* CXL_X86 */

/* --- portable part ------------------------------------------------------------------------ */

static void cxl_stream_plain(uint8_t *dst, const uint8_t *src, size_t n)
{
	memcpy(dst, src, n);
}

enum cxl_copy_impl cxl_copy_best(uint32_t features)
{
	if ((features & (CXL_CPU_SSE2 | CXL_CPU_AVX2)) == (CXL_CPU_SSE2 | CXL_CPU_AVX2))
		return CXL_IMPL_AVX2;
	if (features & CXL_CPU_SSE2)
		return CXL_IMPL_SSE2;
	return CXL_IMPL_PLAIN;
}

const char *cxl_copy_impl_name(enum cxl_copy_impl impl)
{
	switch (impl) {
	case CXL_IMPL_AVX2:
		return "avx2";
	case CXL_IMPL_SSE2:
		return "sse2";
	case CXL_IMPL_PLAIN:
		break;
	}
	return "plain";
}

int cxl_copier_init(struct cxl_copier *c, enum cxl_copy_impl impl, uint32_t features)
{
	(void)features; /* off x86 only "plain" exists */
	memset(c, 0, sizeof(*c));
	c->impl = impl;
	c->line = cxl_line_size();
	c->stream = cxl_stream_plain;
	switch (impl) {
	case CXL_IMPL_PLAIN:
		return 0; /* no cache control at all */
	case CXL_IMPL_AVX2:
#if CXL_X86
		if ((features & (CXL_CPU_SSE2 | CXL_CPU_AVX2)) != (CXL_CPU_SSE2 | CXL_CPU_AVX2))
			return -1;
		c->stream = cxl_stream_avx2;
		c->features = CXL_CPU_SSE2 | CXL_CPU_AVX2;
		break;
#else
		return -1;
#endif
	case CXL_IMPL_SSE2:
#if CXL_X86
		if (!(features & CXL_CPU_SSE2))
			return -1;
		c->stream = cxl_stream_sse2;
		c->features = CXL_CPU_SSE2;
		break;
#else
		return -1;
#endif
	}
#if CXL_X86
	if (features & CXL_CPU_CLFLUSHOPT) {
		c->flush = cxl_flush_opt;
		c->features |= CXL_CPU_CLFLUSHOPT;
	} else if (features & CXL_CPU_CLFLUSH) {
		c->flush = cxl_flush_legacy;
		c->features |= CXL_CPU_CLFLUSH;
	}
#endif
	return 0;
}

/* Length of the step at @off of an @n-byte copy: ends on a 64-byte line of @dst if it can. */
static size_t cxl_step(const uint8_t *dst, size_t off, size_t n)
{
	size_t end;

	if (n - off <= CXL_STEP)
		return n - off;
	end = off + CXL_STEP;
	end -= (uintptr_t)(dst + end) & 63; /* no masked stores inside the range */
	return end - off;
}

void cxl_copy(const struct cxl_copier *c, void *dstv, const void *srcv, size_t n, unsigned flags)
{
	uint8_t *dst = dstv;
	const uint8_t *src = srcv;
	bool stream = flags & CXL_COPY_STREAM_DST;
	size_t off, k;

	if (n == 0)
		return;
	if (!(flags & CXL_COPY_FLUSH_SRC) || !c->flush) {
		if (flags & CXL_COPY_FLUSH_SRC)
			cxl_fence_full(c); /* no invalidation available: order at least */
		if (stream)
			c->stream(dst, src, n);
		else
			memcpy(dst, src, n);
		if (stream)
			cxl_fence_store(c);
		return;
	}
	k = cxl_step(dst, 0, n);
	c->flush(c, src, k);
	cxl_fence_full(c);
	for (off = 0; off < n;) {
		size_t next = off + k, k2 = 0;

		if (next < n) {
			k2 = cxl_step(dst, next, n);
			c->flush(c, src + next, k2);
		}
		if (stream)
			c->stream(dst + off, src + off, k);
		else
			memcpy(dst + off, src + off, k);
		/*
		 * Completes the next step's invalidations before its loads, and drains this
		 * step's streaming stores.
		 */
		cxl_fence_full(c);
		off = next;
		k = k2;
	}
}
