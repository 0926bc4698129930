/* SPDX-License-Identifier: Apache-2.0 */
/* mem.h: the local segment's registered memory regions. */
#ifndef TE_CORE_MEM_H
#define TE_CORE_MEM_H

#include <stdatomic.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_plugin.h>

struct engine;

struct mem_region {
	uint64_t addr;
	uint64_t length;
	char *location;	   /* normalised, e.g. "cpu:0" */
	uint32_t mem_type; /* TE_PLUGIN_MEM_* */
	int32_t dev;	   /* numa node / device number, -1 unknown */
	uint32_t access;   /* TE_MEM_REMOTE_* */
	/* Per engine transport (index): plugin handle (NULL if that plugin skipped it). */
	struct te_plugin_mem **handles;
	GBytes **keys;	      /* packed key blobs, per transport */
	_Atomic int32_t refs; /* live batches using it */
};

/* Sorted, non-overlapping set of regions with its lock. */
struct mem_table {
	GRWLock lock;
	GPtrArray *regions;	  /* struct mem_region *, sorted by addr */
	_Atomic uint64_t version; /* bumped on every change (descriptor refresh) */
};

/* Pure range check on a sorted array: index where [addr,addr+len) would go. */
enum te_status mem_check_insert(GPtrArray *regions, uint64_t addr, uint64_t length,
				guint *index_out);

/*
 * mem_lookup - region containing [addr, addr+length) (caller holds the read lock).
 * TE_ERR_NOT_REGISTERED if addr is in no region, TE_ERR_OUT_OF_RANGE if the range
 * runs past the end of the region holding addr.
 */
enum te_status mem_lookup(GPtrArray *regions, uint64_t addr, uint64_t length,
			  struct mem_region **region_out);

void mem_table_init(struct mem_table *t);
void mem_table_clear(struct mem_table *t);

/* Public-API implementations. */
enum te_status mem_register(struct engine *e, void *addr, size_t length, const char *location,
			    uint32_t access);
enum te_status mem_unregister(struct engine *e, void *addr);

/*
 * mem_overlapping - a registered region overlapping [@addr, +@length), other than the one
 * starting at @skip_addr (0: none skipped): TE_OK with its start and length, TE_ERR_NOT_FOUND
 * when there is none. Thread-safe.
 */
enum te_status mem_overlapping(struct engine *e, uint64_t addr, uint64_t length, uint64_t skip_addr,
			       uint64_t *raddr_out, uint64_t *rlen_out);

/*
 * mem_unregister_within - unregister every region overlapping [@addr, +@length). TE_OK, or
 * TE_ERR_BUSY (te_last_error says which) when a live batch uses one (those before it are gone).
 * Thread-safe.
 */
enum te_status mem_unregister_within(struct engine *e, uint64_t addr, uint64_t length);

/* Engine teardown: deregister every region left. */
void mem_unregister_all(struct engine *e);

#endif /* TE_CORE_MEM_H */
