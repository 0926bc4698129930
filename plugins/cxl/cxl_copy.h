/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_copy.h: copies into and out of a shared CXL window with explicit cache management. */
#ifndef TE_PLUGIN_CXL_COPY_H
#define TE_PLUGIN_CXL_COPY_H

#include <stddef.h>
#include <stdint.h>

/* CPU features (cxl_copy_detect); the copier uses the subset it was given. */
#define CXL_CPU_SSE2 (1u << 0)	     /* 16-byte non-temporal and byte-masked stores */
#define CXL_CPU_AVX2 (1u << 1)	     /* 32-byte non-temporal stores */
#define CXL_CPU_CLFLUSH (1u << 2)    /* strongly ordered line flush */
#define CXL_CPU_CLFLUSHOPT (1u << 3) /* weakly ordered line flush (fenced in batches) */
#define CXL_CPU_CLWB (1u << 4)	     /* detected for the log only: the copies never dirty lines */

/* cxl_copy flags. */
#define CXL_COPY_FLUSH_SRC (1u << 0)  /* source is window memory: invalidate it before loading */
#define CXL_COPY_STREAM_DST (1u << 1) /* destination is window memory: non-temporal stores */

/* How the copier writes window memory. */
enum cxl_copy_impl {
	CXL_IMPL_PLAIN = 0, /* memcpy and full fences: no cache control (hardware coherence only) */
	CXL_IMPL_SSE2 = 1,  /* 16-byte streaming stores, byte-masked streaming head and tail */
	CXL_IMPL_AVX2 = 2,  /* as SSE2 with 32-byte streaming stores in the bulk */
};

/* A copy strategy chosen once at init; read-only afterwards, shared by all workers. */
struct cxl_copier {
	enum cxl_copy_impl impl;
	uint32_t features; /* CXL_CPU_* in use */
	uint32_t line;	   /* bytes per flushed cache line */
	/* Copy @n bytes with non-temporal stores to @dst; no fence. */
	void (*stream)(uint8_t *dst, const uint8_t *src, size_t n);
	/* Start invalidating every line that holds a byte of [@p, +@n); no fence. */
	void (*flush)(const struct cxl_copier *c, const uint8_t *p, size_t n);
};

/* CXL_CPU_* bits this CPU supports (0 off x86). Thread-safe. */
uint32_t cxl_copy_detect(void);

/* Best implementation the feature set @features allows. */
enum cxl_copy_impl cxl_copy_best(uint32_t features);

/*
 * Set @c up for @impl using the flush instructions of @features. Returns -1 when @features
 * lacks what @impl needs (AVX2 needs CXL_CPU_AVX2, SSE2 and AVX2 need CXL_CPU_SSE2), else 0.
 */
int cxl_copier_init(struct cxl_copier *c, enum cxl_copy_impl impl, uint32_t features);

/* "avx2", "sse2" or "plain". */
const char *cxl_copy_impl_name(enum cxl_copy_impl impl);

/*
 * Copy [@src, +@n) to @dst (no overlap). With CXL_COPY_FLUSH_SRC every source line is
 * invalidated and fenced before it is loaded; with CXL_COPY_STREAM_DST the destination is
 * written with non-temporal stores (never a read-modify-write of a line: partial lines use
 * byte-masked stores) and a store fence ends the call, so every byte is on its way to memory,
 * not in this CPU's cache, when it returns. Bytes outside [@dst, +@n) are never written.
 * Thread-safe.
 */
void cxl_copy(const struct cxl_copier *c, void *dst, const void *src, size_t n, unsigned flags);

#endif /* TE_PLUGIN_CXL_COPY_H */
