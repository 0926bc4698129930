/* SPDX-License-Identifier: Apache-2.0 */
/* memkind.c: memory kinds (cuda, hip) routed to the plugin that owns each; te_mem_alloc/copy. */
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

void memkind_fini(struct engine *e)
{
	GHashTableIter it;
	gpointer key, val;

	if (!e->allocs)
		return;
	/* Host allocations the application never freed; device ones went with their plugin. */
	g_hash_table_iter_init(&it, e->allocs);
	while (g_hash_table_iter_next(&it, &key, &val)) {
		const struct memkind_alloc *a = val;

		if (a->mem_type == TE_PLUGIN_MEM_CPU)
			free(key);
	}
	g_hash_table_destroy(e->allocs);
	e->allocs = NULL;
	g_mutex_clear(&e->alloc_lock);
}

/* --- public API -------------------------------------------------------------------- */

enum te_status te_mem_alloc(struct te_engine *engine, const char *location, size_t length,
			    void **ptr_out)
{
	ENGINE_OR_FAIL(engine, "te_mem_alloc");
	struct memkind_alloc *a;
	struct transport *tp;
	uint32_t type;
	int32_t dev;
	void *p = NULL;
	enum te_status st;

	if (!ptr_out || !length)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_alloc: NULL pointer or length 0");
	if (!location || strcmp(location, "*") == 0 ||
	    memkind_parse_location(location, &type, &dev) != TE_OK)
		return log_error(TE_ERR_INVALID_ARG,
				 "te_mem_alloc: location '%s' is not one of cpu[:N], cuda:N, hip:N",
				 location ? location : "(null)");
	if (type == TE_PLUGIN_MEM_CPU) {
		int rc = posix_memalign(&p, 4096, length);

		if (rc != 0)
			return log_error(TE_ERR_NOMEM, "te_mem_alloc: %zu bytes of host memory: %s",
					 length, g_strerror(rc));
	} else {
		tp = memkind_owner(e, type);
		if (!tp)
			return log_error(TE_ERR_MEMORY_TYPE,
					 "te_mem_alloc: %s: no loaded transport owns %s memory",
					 location, memkind_name(type));
		st = transport_mem_alloc(tp, type, dev, length, &p);
		if (st != TE_OK || !p)
			return log_error(st != TE_OK ? st : TE_ERR_INTERNAL,
					 "te_mem_alloc: %s: %s: %zu bytes: %s%s%s", location,
					 tp->plugin->name, length, te_status_str(st),
					 *transport_error(tp) ? ": " : "", transport_error(tp));
	}
	a = g_new0(struct memkind_alloc, 1);
	a->mem_type = type;
	a->dev = dev;
	a->length = length;
	g_mutex_lock(&e->alloc_lock);
	g_hash_table_insert(e->allocs, p, a);
	g_mutex_unlock(&e->alloc_lock);
	*ptr_out = p;
	return TE_OK;
}

enum te_status te_mem_free(struct te_engine *engine, void *ptr)
{
	ENGINE_OR_FAIL(engine, "te_mem_free");
	struct memkind_alloc *a;
	struct transport *tp;
	enum te_status st = TE_OK;

	if (!ptr)
		return TE_OK;
	g_mutex_lock(&e->alloc_lock);
	a = g_hash_table_lookup(e->allocs, ptr);
	if (a)
		g_hash_table_steal(e->allocs, ptr);
	g_mutex_unlock(&e->alloc_lock);
	if (!a)
		return log_error(TE_ERR_NOT_FOUND, "te_mem_free: %p did not come from te_mem_alloc",
				 ptr);
	if (a->mem_type == TE_PLUGIN_MEM_CPU) {
		free(ptr);
	} else if ((tp = memkind_owner(e, a->mem_type)) != NULL) {
		st = transport_mem_free(tp, ptr);
		if (st != TE_OK)
			log_error(st, "te_mem_free: %s: %p: %s%s%s", tp->plugin->name, ptr,
				  te_status_str(st), *transport_error(tp) ? ": " : "",
				  transport_error(tp));
	}
	g_free(a);
	return st;
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
