/* SPDX-License-Identifier: Apache-2.0 */
/* memkind.c: memory kinds routed to the plugin that owns or allocates each; te_mem_alloc/copy. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/log.h"
#include "core/mem.h"
#include "core/memkind.h"
#include "core/transport.h"

/* Bytes of the host buffer te_mem_copy stages device-to-device copies through. */
#define MEMKIND_BOUNCE (4u << 20)

/* What te_mem_alloc handed out, so that te_mem_free knows whom to ask. */
struct memkind_alloc {
	uint32_t mem_type;
	int32_t dev;
	size_t length;
	struct transport *tp; /* the allocating transport; NULL: the core's host memory */
	bool registered;      /* te_mem_alloc_registered registered it */
	char location[32];    /* as the application named it, for messages */
};

enum te_status memkind_parse_location(const char *location, uint32_t *mem_type_out,
				      int32_t *dev_out)
{
	static const struct {
		const char *prefix;
		uint32_t type;
	} kinds[] = {
		{ "cpu", TE_PLUGIN_MEM_CPU },
		{ "cuda", TE_PLUGIN_MEM_CUDA },
		{ "hip", TE_PLUGIN_MEM_HIP },
		{ "cxl", TE_PLUGIN_MEM_CXL },
	};
	const char *colon;
	size_t plen;

	if (!location || strcmp(location, "*") == 0 || strcmp(location, "") == 0) {
		/* Detection needs a GPU runtime; the core names none, so "*" is host memory. */
		*mem_type_out = TE_PLUGIN_MEM_CPU;
		*dev_out = -1;
		return TE_OK;
	}
	colon = strchr(location, ':');
	plen = colon ? (size_t)(colon - location) : strlen(location);
	for (size_t i = 0; i < G_N_ELEMENTS(kinds); i++) {
		guint64 v = 0;

		if (strlen(kinds[i].prefix) != plen || strncmp(location, kinds[i].prefix, plen))
			continue;
		if (colon) {
			if (!g_ascii_string_to_unsigned(colon + 1, 10, 0, 4095, &v, NULL))
				return TE_ERR_INVALID_ARG;
		} else if (kinds[i].type != TE_PLUGIN_MEM_CPU) {
			v = 0;
		}
		*mem_type_out = kinds[i].type;
		*dev_out = colon ? (int32_t)v : (kinds[i].type == TE_PLUGIN_MEM_CPU ? -1 : 0);
		return TE_OK;
	}
	return TE_ERR_INVALID_ARG;
}

const char *memkind_name(uint32_t mem_type)
{
	switch (mem_type) {
	case TE_PLUGIN_MEM_CPU:
		return "cpu";
	case TE_PLUGIN_MEM_CUDA:
		return "cuda";
	case TE_PLUGIN_MEM_HIP:
		return "hip";
	case TE_PLUGIN_MEM_CXL:
		return "cxl";
	}
	return "?";
}

struct transport *memkind_owner(struct engine *e, uint32_t mem_type)
{
	for (unsigned i = 0; e && i < e->n_tps; i++)
		if ((e->tps[i]->caps.owned_mem_types & mem_type) &&
		    !atomic_load_explicit(&e->tps[i]->stopped, memory_order_relaxed))
			return e->tps[i];
	return NULL;
}

struct transport *memkind_allocator(struct engine *e, uint32_t mem_type)
{
	for (unsigned i = 0; e && i < e->n_tps; i++)
		if (((e->tps[i]->caps.owned_mem_types | e->tps[i]->caps.alloc_mem_types) &
		     mem_type) &&
		    !atomic_load_explicit(&e->tps[i]->stopped, memory_order_relaxed))
			return e->tps[i];
	return NULL;
}

enum te_status memkind_query(struct engine *e, const void *addr, uint64_t len,
			     uint32_t *mem_type_out, int32_t *dev_out, char **err_out)
{
	uint32_t asked = 0;

	for (unsigned i = 0; e && i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];
		uint32_t type = 0;
		int32_t dev = -1;
		enum te_status st;

		/* Each kind is answered by its first owner only. */
		if (!(tp->caps.owned_mem_types & ~asked))
			continue;
		asked |= tp->caps.owned_mem_types;
		st = transport_mem_query(tp, addr, len, &type, &dev);
		if (st == TE_ERR_NOT_FOUND)
			continue;
		if (st == TE_OK && (type & tp->caps.owned_mem_types) && !(type & (type - 1))) {
			*mem_type_out = type;
			*dev_out = dev;
			return TE_OK;
		}
		if (err_out)
			*err_out = g_strdup_printf(
				"%s: [%p, +%" PRIu64 ") %s%s%s", tp->plugin->name, addr, len,
				st == TE_ERR_OUT_OF_RANGE ? "runs past the end of its allocation"
				: st == TE_OK		  ? "answered with a kind it does not own"
							  : te_status_str(st),
				*transport_error(tp) ? ": " : "", transport_error(tp));
		return st == TE_OK ? TE_ERR_PLUGIN_INVALID : st;
	}
	*mem_type_out = TE_PLUGIN_MEM_CPU;
	*dev_out = -1;
	return TE_OK;
}

enum te_status memkind_copy(struct engine *e, void *dst, const void *src, uint64_t len,
			    uint32_t mem_type, int32_t dev, enum te_plugin_copy_dir dir)
{
	struct transport *tp = memkind_owner(e, mem_type);

	if (!tp)
		return TE_ERR_MEMORY_TYPE;
	if (!len)
		return TE_OK;
	/* the owner's words, if any: transport_op_error() */
	return transport_mem_copy(tp, dst, src, len, mem_type, dev, dir);
}

enum te_status memkind_dmabuf(struct engine *e, const void *addr, uint64_t len, uint32_t mem_type,
			      int32_t dev, int *fd_out, uint64_t *offset_out)
{
	struct transport *tp = memkind_owner(e, mem_type);

	(void)dev;
	if (!tp)
		return TE_ERR_MEMORY_TYPE;
	return transport_mem_dmabuf(tp, addr, len, fd_out, offset_out);
}

void memkind_init(struct engine *e)
{
	g_mutex_init(&e->alloc_lock);
	e->allocs = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
}

/* Hand @a's memory at @ptr back to whoever allocated it. */
static enum te_status memkind_release(struct memkind_alloc *a, void *ptr)
{
	if (!a->tp) {
		free(ptr);
		return TE_OK;
	}
	return transport_mem_free(a->tp, ptr);
}

void memkind_release_all(struct engine *e)
{
	GHashTableIter it;
	gpointer key, val;

	if (!e->allocs)
		return;
	/*
	 * Every allocation is unregistered, then freed, while its transport still runs (no batch
	 * is left: the engine drained them). One still in use by slices a transport holds is
	 * left to that transport's fini, or to memkind_fini for host memory.
	 */
	g_mutex_lock(&e->alloc_lock);
	g_hash_table_iter_init(&it, e->allocs);
	while (g_hash_table_iter_next(&it, &key, &val)) {
		struct memkind_alloc *a = val;
		enum te_status st;

		st = mem_unregister_within(e, (uintptr_t)key, a->length);
		if (st == TE_OK)
			st = memkind_release(a, key);
		if (st == TE_OK) {
			ENGINE_LOG(e, TE_LOG_DEBUG, "engine free: released %zu bytes at %p (%s)",
				   a->length, key, a->location);
			g_hash_table_iter_remove(&it);
			continue;
		}
		ENGINE_LOG(e, TE_LOG_WARN,
			   "engine free: %zu bytes at %p (%s, from %s) not released now: %s%s%s",
			   a->length, key, a->location, a->tp ? a->tp->plugin->name : "host memory",
			   te_status_str(st), a->tp && *transport_error(a->tp) ? ": " : "",
			   a->tp ? transport_error(a->tp) : "");
		/* Host memory goes in memkind_fini; a transport's fini releases its own. */
		if (a->tp)
			g_hash_table_iter_remove(&it);
	}
	g_mutex_unlock(&e->alloc_lock);
}

void memkind_fini(struct engine *e)
{
	GHashTableIter it;
	gpointer key, val;

	if (!e->allocs)
		return;
	/* Host memory memkind_release_all could not free; transports released theirs. */
	g_hash_table_iter_init(&it, e->allocs);
	while (g_hash_table_iter_next(&it, &key, &val)) {
		const struct memkind_alloc *a = val;

		if (!a->tp)
			free(key);
	}
	g_hash_table_destroy(e->allocs);
	e->allocs = NULL;
	g_mutex_clear(&e->alloc_lock);
}

/*
 * Allocate @length bytes at @location for @fn (the public call, for messages): the core's
 * host memory, or the first transport that offers the kind. TE_OK with *ptr_out and the
 * record to keep in *a_out (g_free); otherwise te_last_error() names the location, the
 * transport and its reason.
 */
static enum te_status memkind_alloc(struct engine *e, const char *fn, const char *location,
				    size_t length, void **ptr_out, struct memkind_alloc **a_out)
{
	struct memkind_alloc *a;
	struct transport *tp;
	uint32_t type;
	int32_t dev;
	void *p = NULL;
	enum te_status st;

	if (!ptr_out || !length)
		return log_error(TE_ERR_INVALID_ARG, "%s: NULL pointer or length 0", fn);
	if (!location || strcmp(location, "*") == 0 ||
	    memkind_parse_location(location, &type, &dev) != TE_OK)
		return log_error(TE_ERR_INVALID_ARG,
				 "%s: location '%s' is not one of cpu[:N], cuda:N, hip:N, cxl:N",
				 fn, location ? location : "(null)");
	tp = memkind_allocator(e, type);
	if (!tp && type == TE_PLUGIN_MEM_CPU) {
		int rc = posix_memalign(&p, 4096, length);

		if (rc != 0)
			return log_error(TE_ERR_NOMEM, "%s: %s: %zu bytes of host memory: %s", fn,
					 location, length, g_strerror(rc));
	} else if (!tp) {
		g_autoptr(GString) names = g_string_new(NULL);

		for (unsigned i = 0; i < e->n_tps; i++)
			g_string_append_printf(names, "%s%s", i ? ", " : "",
					       e->tps[i]->plugin->name);
		return log_error(TE_ERR_MEMORY_TYPE,
				 "%s: %s: no loaded transport owns %s memory or allocates it "
				 "(loaded: %s)",
				 fn, location, memkind_name(type), e->n_tps ? names->str : "none");
	} else {
		st = transport_mem_alloc(tp, type, dev, length, &p);
		if (st != TE_OK || !p)
			return log_error(st != TE_OK ? st : TE_ERR_INTERNAL,
					 "%s: %s: %s: %zu bytes: %s%s%s", fn, location,
					 tp->plugin->name, length,
					 st != TE_OK ? te_status_str(st)
						     : "mem_alloc returned TE_OK and no memory",
					 *transport_error(tp) ? ": " : "", transport_error(tp));
	}
	a = g_new0(struct memkind_alloc, 1);
	a->mem_type = type;
	a->dev = dev;
	a->length = length;
	a->tp = tp;
	g_strlcpy(a->location, location, sizeof(a->location));
	*ptr_out = p;
	*a_out = a;
	return TE_OK;
}

static void memkind_insert(struct engine *e, void *p, struct memkind_alloc *a)
{
	g_mutex_lock(&e->alloc_lock);
	g_hash_table_insert(e->allocs, p, a);
	g_mutex_unlock(&e->alloc_lock);
}

/* --- public API -------------------------------------------------------------------- */

enum te_status te_mem_alloc(struct te_engine *engine, const char *location, size_t length,
			    void **ptr_out)
{
	ENGINE_OR_FAIL(engine, "te_mem_alloc");
	struct memkind_alloc *a = NULL;
	void *p = NULL;
	enum te_status st;

	st = memkind_alloc(e, "te_mem_alloc", location, length, &p, &a);
	if (st != TE_OK)
		return st;
	memkind_insert(e, p, a);
	*ptr_out = p;
	return TE_OK;
}

enum te_status te_mem_alloc_registered(struct te_engine *engine, const char *location,
				       size_t length, uint32_t access, void **ptr_out)
{
	ENGINE_OR_FAIL(engine, "te_mem_alloc_registered");
	static const char fn[] = "te_mem_alloc_registered";
	struct memkind_alloc *a = NULL;
	g_autofree char *why = NULL;
	void *p = NULL;
	enum te_status st, fst;

	if (access & ~(uint32_t)TE_MEM_REMOTE)
		return log_error(TE_ERR_INVALID_ARG, "%s: unknown access bits 0x%x", fn, access);
	st = memkind_alloc(e, fn, location, length, &p, &a);
	if (st != TE_OK)
		return st;
	st = mem_register(e, p, length, location, access);
	if (st == TE_OK) {
		a->registered = true;
		memkind_insert(e, p, a);
		*ptr_out = p;
		return TE_OK;
	}
	why = g_strdup(te_last_error());
	fst = memkind_release(a, p);
	if (fst != TE_OK && a->tp)
		ENGINE_LOG(e, TE_LOG_WARN,
			   "%s: %s: freeing %zu bytes at %p after the failed "
			   "registration failed too: %s%s%s",
			   fn, a->tp->plugin->name, length, p, te_status_str(fst),
			   *transport_error(a->tp) ? ": " : "", transport_error(a->tp));
	st = log_error(st, "%s: %s: %zu bytes from %s, registration refused (nothing kept): %s", fn,
		       location, length, a->tp ? a->tp->plugin->name : "host memory", why);
	g_free(a);
	return st;
}

enum te_status te_mem_free(struct te_engine *engine, void *ptr)
{
	ENGINE_OR_FAIL(engine, "te_mem_free");
	struct memkind_alloc *a;
	uint64_t raddr = 0, rlen = 0;
	enum te_status st = TE_OK;
	const char *by;

	if (!ptr)
		return TE_OK;
	/* Taken out while it is freed: a concurrent te_mem_free of it finds nothing. */
	g_mutex_lock(&e->alloc_lock);
	a = g_hash_table_lookup(e->allocs, ptr);
	if (a)
		g_hash_table_steal(e->allocs, ptr);
	g_mutex_unlock(&e->alloc_lock);
	if (!a)
		return log_error(TE_ERR_NOT_FOUND,
				 "te_mem_free: %p did not come from te_mem_alloc or "
				 "te_mem_alloc_registered, or was freed already",
				 ptr);
	by = a->tp ? a->tp->plugin->name : "host memory";
	/* Regions the application registered inside it (ours, at @ptr, is undone below). */
	if (mem_overlapping(e, (uintptr_t)ptr, a->length, a->registered ? (uintptr_t)ptr : 0,
			    &raddr, &rlen) == TE_OK) {
		st = log_error(TE_ERR_BUSY,
			       "te_mem_free: %p (%s, %zu bytes from %s) not freed: region "
			       "[0x%" PRIx64 ", +%" PRIu64 ") inside it is still registered "
			       "(te_mem_unregister it first)",
			       ptr, a->location, a->length, by, raddr, rlen);
		memkind_insert(e, ptr, a);
		return st;
	}
	if (a->registered) {
		st = mem_unregister(e, ptr);
		if (st == TE_ERR_BUSY) {
			g_autofree char *why = g_strdup(te_last_error());

			log_error(st, "te_mem_free: %p (%s, %zu bytes from %s) not freed: %s", ptr,
				  a->location, a->length, by, why);
			memkind_insert(e, ptr, a);
			return st;
		}
		/* TE_ERR_NOT_REGISTERED: the application unregistered it itself. */
		a->registered = false;
	}
	st = memkind_release(a, ptr);
	if (st != TE_OK) {
		log_error(st, "te_mem_free: %p (%s, %zu bytes from %s): %s%s%s", ptr, a->location,
			  a->length, by, te_status_str(st), *transport_error(a->tp) ? ": " : "",
			  transport_error(a->tp));
		/* The transport kept it (e.g. TE_ERR_BUSY): so does the table. */
		if (st != TE_ERR_NOT_FOUND)
			memkind_insert(e, ptr, a);
		else
			g_free(a);
		return st;
	}
	g_free(a);
	return TE_OK;
}

enum te_status te_mem_copy(struct te_engine *engine, void *dst, const void *src, size_t length)
{
	ENGINE_OR_FAIL(engine, "te_mem_copy");
	g_autofree char *why = NULL;
	uint32_t dt, stype;
	int32_t dd, sd;
	enum te_status st;

	if (!dst || !src)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_copy: NULL pointer");
	if (!length)
		return TE_OK;
	if ((st = memkind_query(e, dst, length, &dt, &dd, &why)) != TE_OK ||
	    (st = memkind_query(e, src, length, &stype, &sd, &why)) != TE_OK)
		return log_error(st, "te_mem_copy: %s", why ? why : te_status_str(st));
	if (dt == TE_PLUGIN_MEM_CPU && stype == TE_PLUGIN_MEM_CPU) {
		memmove(dst, src, length);
		return TE_OK;
	}
	if (dt == TE_PLUGIN_MEM_CPU)
		st = memkind_copy(e, dst, src, length, stype, sd, TE_PLUGIN_COPY_TO_HOST);
	else if (stype == TE_PLUGIN_MEM_CPU)
		st = memkind_copy(e, dst, src, length, dt, dd, TE_PLUGIN_COPY_FROM_HOST);
	else {
		/* Device to device: through host memory, a chunk at a time. */
		size_t chunk = MIN(length, (size_t)MEMKIND_BOUNCE);
		g_autofree uint8_t *bounce = g_try_malloc(chunk);

		if (!bounce)
			return log_error(TE_ERR_NOMEM, "te_mem_copy: no %zu-byte bounce buffer",
					 chunk);
		for (size_t off = 0; off < length && st == TE_OK; off += chunk) {
			size_t n = MIN(chunk, length - off);

			st = memkind_copy(e, bounce, (const uint8_t *)src + off, n, stype, sd,
					  TE_PLUGIN_COPY_TO_HOST);
			if (st == TE_OK)
				st = memkind_copy(e, (uint8_t *)dst + off, bounce, n, dt, dd,
						  TE_PLUGIN_COPY_FROM_HOST);
		}
	}
	if (st != TE_OK)
		return log_error(st, "te_mem_copy: %zu bytes %s -> %s: %s%s%s", length,
				 memkind_name(stype), memkind_name(dt), te_status_str(st),
				 *transport_op_error() ? ": " : "", transport_op_error());
	return TE_OK;
}
