/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_plugin_util.h: header-only helpers every transport plugin needs: little-endian wire
 * fields, a sorted table of registered regions, filling a device entry, and a guard for
 * threads that name a peer to the host.
 *
 * A plugin cannot link libte, so these are static inline functions over libc only (C11 or
 * C++11). They keep no state of their own and take no lock, except the peer-naming guard,
 * which is one: the plugin guards its tables.
 *
 *   uint8_t key[24];
 *   te_plugin_put_u32(key, MY_KEY_MAGIC);
 *   te_plugin_put_u64(key + 8, addr);
 *   ...
 *   if (te_plugin_get_u32(blob) != MY_KEY_MAGIC) ... malformed ...
 *
 *   struct te_plugin_regions regions = { 0 };              (under the plugin's write lock:)
 *   st = te_plugin_regions_add(&regions, start, length, access, my_mem);
 *   st = te_plugin_regions_remove(&regions, my_mem);      (under its read lock:)
 *   const struct te_plugin_region *r = te_plugin_regions_find(&regions, addr, len, need);
 *   te_plugin_regions_free(&regions);                      (at fini)
 *
 *   struct te_plugin_naming naming;            (per instance: te_plugin_naming_init at init)
 *   struct te_plugin_naming_peer np;           (per peer, zeroed at load_peer)
 *   if (te_plugin_naming_enter(&naming, &peer->np)) {      (a thread of the plugin's own)
 *           host->mark_failed(ctx, TE_PLUGIN_FAIL_PEER, dev, peer, why);
 *           te_plugin_naming_leave(&naming, &peer->np);
 *   }
 *   te_plugin_naming_unload(&naming, &peer->np);           (first thing in unload_peer)
 */
#ifndef TE_PLUGIN_UTIL_H
#define TE_PLUGIN_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --- little-endian fields of blobs, keys and wire headers ------------------------------ */

/*
 * One load or store each: memcpy of a fixed size compiles to a single unaligned move, and
 * only a big-endian host swaps. (Byte loops cost about 16 ns per wire header at -O2.)
 */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define TE_PLUGIN_LE16(v) __builtin_bswap16(v)
#define TE_PLUGIN_LE32(v) __builtin_bswap32(v)
#define TE_PLUGIN_LE64(v) __builtin_bswap64(v)
#else
#define TE_PLUGIN_LE16(v) (v)
#define TE_PLUGIN_LE32(v) (v)
#define TE_PLUGIN_LE64(v) (v)
#endif

static inline void te_plugin_put_u16(uint8_t *p, uint16_t v)
{
	v = (uint16_t)TE_PLUGIN_LE16(v);
	memcpy(p, &v, sizeof(v));
}

static inline void te_plugin_put_u32(uint8_t *p, uint32_t v)
{
	v = TE_PLUGIN_LE32(v);
	memcpy(p, &v, sizeof(v));
}

static inline void te_plugin_put_u64(uint8_t *p, uint64_t v)
{
	v = TE_PLUGIN_LE64(v);
	memcpy(p, &v, sizeof(v));
}

static inline uint16_t te_plugin_get_u16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return (uint16_t)TE_PLUGIN_LE16(v);
}

static inline uint32_t te_plugin_get_u32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return TE_PLUGIN_LE32(v);
}

static inline uint64_t te_plugin_get_u64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return TE_PLUGIN_LE64(v);
}

/* --- registered regions: sorted by start, disjoint ------------------------------------- */

/* One registered region [start, end) granting @access (TE_PLUGIN_ACCESS_*). */
struct te_plugin_region {
	uint64_t start;
	uint64_t end; /* exclusive */
	uint32_t access;
	void *mem; /* the plugin's handle (what reg_mem returned); found by identity */
};

/*
 * The regions of one instance, as its serving side checks peers' requests against them.
 * Zero-initialise it; free the array with te_plugin_regions_free. Disjoint regions keep
 * "inside one region" a single binary search. Not thread-safe: the plugin locks around it
 * (typically an rwlock: find under the read side, add and remove under the write side).
 */
struct te_plugin_regions {
	struct te_plugin_region *v;
	uint32_t n;
	uint32_t cap;
};

/* Index of the first region whose end is above @addr (t->n when none). */
static inline uint32_t te_plugin_regions_search(const struct te_plugin_regions *t, uint64_t addr)
{
	uint32_t lo = 0, hi = t->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (t->v[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * The ONE region holding all of [@addr, @addr + @len) and granting every bit of @need, or
 * NULL (also for @len 0 and a range that wraps around).
 */
static inline const struct te_plugin_region *
te_plugin_regions_find(const struct te_plugin_regions *t, uint64_t addr, uint64_t len,
		       uint32_t need)
{
	uint32_t i;

	if (len == 0 || addr > UINT64_MAX - len)
		return NULL;
	i = te_plugin_regions_search(t, addr);
	if (i < t->n && t->v[i].start <= addr && addr + len <= t->v[i].end &&
	    (t->v[i].access & need) == need)
		return &t->v[i];
	return NULL;
}

/*
 * Insert [@start, @start + @length) for handle @mem. TE_OK; TE_ERR_INVALID_ARG for an empty
 * or wrapping range; TE_ERR_ADDRESS_OVERLAPPED when it overlaps a region of the table;
 * TE_ERR_NOMEM. The table is unchanged on failure.
 */
static inline enum te_status te_plugin_regions_add(struct te_plugin_regions *t, uint64_t start,
						   uint64_t length, uint32_t access, void *mem)
{
	uint32_t i;

	if (length == 0 || start > UINT64_MAX - length)
		return TE_ERR_INVALID_ARG;
	i = te_plugin_regions_search(t, start);
	if (i < t->n && t->v[i].start < start + length)
		return TE_ERR_ADDRESS_OVERLAPPED;
	if (t->n == t->cap) {
		uint32_t ncap = t->cap ? t->cap * 2 : 16;
		struct te_plugin_region *nv;

		if (ncap < t->cap)
			return TE_ERR_NOMEM;
		nv = (struct te_plugin_region *)realloc(t->v, ncap * sizeof(*nv));
		if (!nv)
			return TE_ERR_NOMEM;
		t->v = nv;
		t->cap = ncap;
	}
	memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
	t->v[i].start = start;
	t->v[i].end = start + length;
	t->v[i].access = access;
	t->v[i].mem = mem;
	t->n++;
	return TE_OK;
}

/*
 * Remove the region of handle @mem, found by identity (never dereferenced: a stale handle
 * is an error, not a crash). TE_OK; TE_ERR_INVALID_HANDLE when no region has it.
 */
static inline enum te_status te_plugin_regions_remove(struct te_plugin_regions *t, const void *mem)
{
	uint32_t i;

	for (i = 0; i < t->n && t->v[i].mem != mem; i++)
		;
	if (i == t->n)
		return TE_ERR_INVALID_HANDLE;
	memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
	t->n--;
	return TE_OK;
}

/* Free the array (not the handles: walk t->v first to free them); the table is empty after. */
static inline void te_plugin_regions_free(struct te_plugin_regions *t)
{
	free(t->v);
	t->v = NULL;
	t->n = 0;
	t->cap = 0;
}

/* --- query_devices ---------------------------------------------------------------------- */

/*
 * Fill one entry of query_devices (the core set d->size): @name (cut to fit), @numa_node (-1
 * unknown), @pci ("" or NULL: none), @link_speed_mbps (0 unknown), @mem_types reachable.
 */
static inline void te_plugin_device_set(struct te_plugin_device *d, const char *name,
					int32_t numa_node, const char *pci,
					uint64_t link_speed_mbps, uint32_t mem_types)
{
	snprintf(d->name, sizeof(d->name), "%s", name ? name : "");
	d->numa_node = numa_node;
	snprintf(d->pci, sizeof(d->pci), "%s", pci ? pci : "");
	d->link_speed_mbps = link_speed_mbps;
	d->mem_types = mem_types;
}

/* --- naming a peer to the host, only until its unload_peer returns ----------------------- */

/*
 * A handle ends with unload_peer: no host call (mark_failed, peer_event) may name it once
 * unload_peer has returned, and unload_peer runs on any thread at any time. A thread of the
 * plugin's own that is about to name a peer enters the guard (false: the peer is unloaded,
 * name nothing), makes the call and leaves; unload_peer calls te_plugin_naming_unload
 * first, which marks the peer unloaded and waits until no thread is inside for it. The core
 * calls unload_peer holding none of its locks and those host calls take none of the
 * plugin's, so the wait ends. Never call te_plugin_naming_unload for a peer while inside
 * the guard for it on the same thread.
 */
struct te_plugin_naming {
	pthread_mutex_t lock;
	pthread_cond_t left; /* broadcast when a peer's last naming call left */
};

/* One peer's part, under the guard's lock: zero-initialise it when the peer is loaded. */
struct te_plugin_naming_peer {
	uint32_t inside; /* threads between enter and leave for this peer */
	bool unloaded;	 /* te_plugin_naming_unload ran */
};

/* 0, or the pthread error (nothing to destroy then). */
static inline int te_plugin_naming_init(struct te_plugin_naming *g)
{
	int rc = pthread_mutex_init(&g->lock, NULL);

	if (rc)
		return rc;
	rc = pthread_cond_init(&g->left, NULL);
	if (rc)
		pthread_mutex_destroy(&g->lock);
	return rc;
}

/* At fini, when no thread uses the guard any more. */
static inline void te_plugin_naming_destroy(struct te_plugin_naming *g)
{
	pthread_cond_destroy(&g->left);
	pthread_mutex_destroy(&g->lock);
}

/* True: name the peer now, then te_plugin_naming_leave. False: it is unloaded, name nothing. */
static inline bool te_plugin_naming_enter(struct te_plugin_naming *g,
					  struct te_plugin_naming_peer *p)
{
	bool ok;

	pthread_mutex_lock(&g->lock);
	ok = !p->unloaded;
	if (ok)
		p->inside++;
	pthread_mutex_unlock(&g->lock);
	return ok;
}

/* After the host call of a te_plugin_naming_enter that returned true. */
static inline void te_plugin_naming_leave(struct te_plugin_naming *g,
					  struct te_plugin_naming_peer *p)
{
	pthread_mutex_lock(&g->lock);
	if (--p->inside == 0)
		pthread_cond_broadcast(&g->left);
	pthread_mutex_unlock(&g->lock);
}

/* In unload_peer: no enter succeeds for @p after this, and none is inside when it returns. */
static inline void te_plugin_naming_unload(struct te_plugin_naming *g,
					   struct te_plugin_naming_peer *p)
{
	pthread_mutex_lock(&g->lock);
	p->unloaded = true;
	while (p->inside)
		pthread_cond_wait(&g->left, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_UTIL_H */
