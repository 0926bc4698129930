/* SPDX-License-Identifier: Apache-2.0 */
/* memkind.h: memory kinds: who owns an address, copies, and who allocates each kind. */
#ifndef TE_CORE_MEMKIND_H
#define TE_CORE_MEMKIND_H

#include <stdint.h>

#include <te/te_plugin.h>

struct engine;
struct transport;

/* "cpu", "cuda", "hip", "cxl" for one TE_PLUGIN_MEM_* bit; "?" otherwise. Thread-safe. */
const char *memkind_name(uint32_t mem_type);

/*
 * memkind_parse_location - "cpu", "cpu:N", "cuda:N", "hip:N", "cxl:N", "*" (or NULL)
 * → memory type bit and device number. Pure.
 */
enum te_status memkind_parse_location(const char *location, uint32_t *mem_type_out,
				      int32_t *dev_out);

/*
 * The loaded transport that owns memory kind @mem_type (the first in priority order whose
 * caps.owned_mem_types has it), or NULL. Thread-safe (the transport list is fixed while the
 * engine runs).
 */
struct transport *memkind_owner(struct engine *e, uint32_t mem_type);

/*
 * memkind_query - who owns [@addr, +@len): TE_OK with the kind and device; TE_PLUGIN_MEM_CPU
 * and -1 when no owner claims it. TE_ERR_OUT_OF_RANGE (with *err_out, g_free) when an owner's
 * allocation holds @addr but not the whole range. Thread-safe.
 */
enum te_status memkind_query(struct engine *e, const void *addr, uint64_t len,
			     uint32_t *mem_type_out, int32_t *dev_out, char **err_out);

/*
 * memkind_copy - copy between memory of kind @mem_type on @dev and host memory through the
 * owner. TE_ERR_MEMORY_TYPE without an owner. Blocks until done. Thread-safe.
 */
enum te_status memkind_copy(struct engine *e, void *dst, const void *src, uint64_t len,
			    uint32_t mem_type, int32_t dev, enum te_plugin_copy_dir dir);

/* memkind_dmabuf - the owner's dmabuf fd for a range (TE_ERR_UNSUPPORTED without one). */
enum te_status memkind_dmabuf(struct engine *e, const void *addr, uint64_t len, uint32_t mem_type,
			      int32_t dev, int *fd_out, uint64_t *offset_out);

/*
 * The loaded transport that allocates memory kind @mem_type for te_mem_alloc: the first in
 * priority order whose caps.owned_mem_types or caps.alloc_mem_types has it, or NULL.
 * Thread-safe.
 */
struct transport *memkind_allocator(struct engine *e, uint32_t mem_type);

/* Engine start and teardown of the allocation table of te_mem_alloc. */
void memkind_init(struct engine *e);
/*
 * Engine free, once no batch is left and before the transports' fini: unregister and free
 * every allocation the application left (transports are asked while they still run).
 */
void memkind_release_all(struct engine *e);
void memkind_fini(struct engine *e);

#endif /* TE_CORE_MEMKIND_H */
