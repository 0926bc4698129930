/* SPDX-License-Identifier: Apache-2.0 */
/* mem.c: registration of local memory regions with every installed transport. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "core/engine.h"
#include "core/metadata/metadata.h"
#include "core/mem.h"
#include "core/memkind.h"
#include "core/metadata/descriptor.h"
#include "core/transport.h"

/* Index of the first region whose addr is > @addr (upper bound). */
static guint mem_upper_bound(GPtrArray *regions, uint64_t addr)
{
	guint lo = 0, hi = regions->len;

	while (lo < hi) {
		guint mid = lo + (hi - lo) / 2;
		const struct mem_region *r = g_ptr_array_index(regions, mid);

		if (r->addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

enum te_status mem_check_insert(GPtrArray *regions, uint64_t addr, uint64_t length,
				guint *index_out)
{
	guint i = mem_upper_bound(regions, addr);

	if (length == 0)
		return TE_ERR_INVALID_ARG;
	if (addr + length < addr)
		return TE_ERR_OVERFLOW;
	if (i > 0) {
		const struct mem_region *prev = g_ptr_array_index(regions, i - 1);

		if (prev->addr + prev->length > addr)
			return TE_ERR_ADDRESS_OVERLAPPED;
	}
	if (i < regions->len) {
		const struct mem_region *next = g_ptr_array_index(regions, i);

		if (next->addr < addr + length)
			return TE_ERR_ADDRESS_OVERLAPPED;
	}
	*index_out = i;
	return TE_OK;
}

enum te_status mem_lookup(GPtrArray *regions, uint64_t addr, uint64_t length,
			  struct mem_region **region_out)
{
	guint i = mem_upper_bound(regions, addr);
	struct mem_region *r;

	if (i == 0)
		return TE_ERR_NOT_REGISTERED;
	r = g_ptr_array_index(regions, i - 1);
	if (addr - r->addr >= r->length)
		return TE_ERR_NOT_REGISTERED;
	if (addr + length < addr || addr + length - r->addr > r->length)
		return TE_ERR_OUT_OF_RANGE;
	*region_out = r;
	return TE_OK;
}

void mem_table_init(struct mem_table *t)
{
	g_rw_lock_init(&t->lock);
	t->regions = g_ptr_array_new();
	atomic_init(&t->version, 1);
}

static void mem_region_free(struct engine *e, struct mem_region *r)
{
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (r->handles[i] && !atomic_load(&tp->stopped)) {
			enum te_status st = transport_dereg_mem(tp, r->handles[i]);

			if (st != TE_OK)
				ENGINE_LOG(e, TE_LOG_WARN, "%s: dereg_mem(0x%llx) failed: %s",
					   tp->plugin->name, (unsigned long long)r->addr,
					   te_status_str(st));
		}
		if (r->keys[i])
			g_bytes_unref(r->keys[i]);
	}
	g_free(r->handles);
	g_free(r->keys);
	g_free(r->location);
	g_free(r);
}

void mem_table_clear(struct mem_table *t)
{
	g_ptr_array_free(t->regions, TRUE);
	g_rw_lock_clear(&t->lock);
}

/*
 * The kind of [@addr, +@length) as the memory-kind owners (cuda, hip plugins) see it. "*"
 * takes their answer (host memory when nobody claims it, which must then be mapped here); an
 * explicit location must agree with them. *@location_out gets "cpu", "cuda:0", ...
 */
static enum te_status mem_check_kind(struct engine *e, void *addr, size_t length,
				     const char *location, uint32_t *mem_type, int32_t *dev,
				     char *location_out, size_t cap)
{
	g_autofree char *why = NULL;
	bool detect = !location || !*location || strcmp(location, "*") == 0;
	uint32_t owned = 0, ktype;
	int32_t kdev;
	enum te_status st;

	for (unsigned i = 0; i < e->n_tps; i++)
		owned |= e->tps[i]->caps.owned_mem_types;
	st = owned ? memkind_query(e, addr, length, &ktype, &kdev, &why) : TE_OK;
	if (!owned) {
		ktype = TE_PLUGIN_MEM_CPU;
		kdev = -1;
	}
	if (st != TE_OK)
		return log_error(st, "te_mem_register: [%p, +%zu) at %s: %s", addr, length,
				 detect ? "*" : location, why ? why : te_status_str(st));
	if (detect) {
		uintptr_t page = (uintptr_t)addr & ~(uintptr_t)4095;

		/* Nobody claims it: it must be this process's host memory. */
		if (ktype == TE_PLUGIN_MEM_CPU &&
		    msync((void *)page, (uintptr_t)addr + length - page, MS_ASYNC) != 0 &&
		    errno == ENOMEM)
			return log_error(
				TE_ERR_MEMORY_TYPE,
				"te_mem_register: [%p, +%zu) with location '*': not host "
				"memory of this process, and no loaded memory-kind transport "
				"(cuda, hip) claims it",
				addr, length);
		*mem_type = ktype;
		*dev = kdev;
	} else if (owned && (ktype != TE_PLUGIN_MEM_CPU || (*mem_type & owned)) &&
		   (ktype != *mem_type || (ktype != TE_PLUGIN_MEM_CPU && kdev != *dev))) {
		/* An owner knows this memory as another kind or device, or not at all. */
		if (ktype == TE_PLUGIN_MEM_CPU)
			return log_error(TE_ERR_MEMORY_TYPE,
					 "te_mem_register: [%p, +%zu) is not %s memory: no "
					 "allocation of the %s owner holds it",
					 addr, length, location, memkind_name(*mem_type));
		return log_error(TE_ERR_MEMORY_TYPE,
				 "te_mem_register: [%p, +%zu) is %s:%d memory, not '%s'", addr,
				 length, memkind_name(ktype), kdev, location);
	}
	if (*mem_type == TE_PLUGIN_MEM_CPU)
		g_snprintf(location_out, cap, "%s", detect ? "cpu" : location);
	else
		g_snprintf(location_out, cap, "%s:%d", memkind_name(*mem_type), *dev);
	return TE_OK;
}

/*
 * A store backend learns of the changed buffer list now, so that a peer that opens this
 * segment after te_mem_register returns sees the buffer. A failure leaves the registration in
 * place (it is local): the backend publishes the latest descriptor when the store answers.
 */
static void mem_publish(struct engine *e)
{
	g_autofree char *err = NULL;

	if (metadata_publish_local(e, &err) != TE_OK)
		ENGINE_LOG(e, TE_LOG_WARN,
			   "metadata: publishing the changed buffer list of segment %s failed "
			   "(peers keep the previous one until it succeeds): %s",
			   e->name, err);
}

enum te_status mem_register(struct engine *e, void *addr, size_t length, const char *location,
			    uint32_t access)
{
	struct mem_region *r;
	uint32_t mem_type;
	int32_t dev;
	char detected[32];
	unsigned supported = 0;
	enum te_status st;
	guint idx;

	if (!addr)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_register: addr is NULL");
	if (length == 0)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_register: length is 0 (addr %p)",
				 addr);
	if ((uintptr_t)addr + length < (uintptr_t)addr)
		return log_error(TE_ERR_OVERFLOW,
				 "te_mem_register: [%p, +%zu) wraps around the address space", addr,
				 length);
	if (access & ~(uint32_t)TE_MEM_REMOTE)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_register: unknown access bits 0x%x",
				 access);
	st = memkind_parse_location(location, &mem_type, &dev);
	if (st != TE_OK)
		return log_error(st,
				 "te_mem_register: location '%s' is not one of cpu[:N], cuda:N, "
				 "hip:N, cxl:N, *",
				 location);
	st = mem_check_kind(e, addr, length, location, &mem_type, &dev, detected, sizeof(detected));
	if (st != TE_OK)
		return st;

	r = g_new0(struct mem_region, 1);
	r->addr = (uintptr_t)addr;
	r->length = length;
	r->mem_type = mem_type;
	r->dev = dev;
	r->access = access;
	r->location = g_strdup(detected);
	r->handles = g_new0(struct te_plugin_mem *, e->n_tps ? e->n_tps : 1);
	r->keys = g_new0(GBytes *, e->n_tps ? e->n_tps : 1);

	g_rw_lock_writer_lock(&e->mem.lock);
	st = mem_check_insert(e->mem.regions, r->addr, r->length, &idx);
	if (st != TE_OK) {
		g_rw_lock_writer_unlock(&e->mem.lock);
		g_free(r->handles);
		g_free(r->keys);
		g_free(r->location);
		g_free(r);
		return log_error(st, "te_mem_register: [%p, +%zu) overlaps a registered region",
				 addr, length);
	}
	/* Register with every transport that takes this memory type, itself or by staging. */
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];
		uint8_t keybuf[DESCRIPTOR_MAX_BLOB];
		size_t klen = 0;

		if (!((tp->caps.mem_types | tp->caps.staged_mem_types) & mem_type))
			continue;
		st = transport_reg_mem(tp, addr, length, mem_type, dev, access, &r->handles[i]);
		/*
		 * Device memory a transport moves directly only for some regions (rdma through a
		 * dmabuf the GPU driver may not offer): UNSUPPORTED leaves this transport without
		 * a handle; the core stages the region when it is the local side, and peers see
		 * no key for it.
		 */
		if (st == TE_ERR_UNSUPPORTED && mem_type != TE_PLUGIN_MEM_CPU) {
			ENGINE_LOG(e, TE_LOG_DEBUG,
				   "%s: does not reach [%p, +%zu) %s directly%s%s; staging it",
				   tp->plugin->name, addr, length, r->location,
				   *transport_error(tp) ? ": " : "", transport_error(tp));
			r->handles[i] = NULL;
			if (tp->caps.mem_types & TE_PLUGIN_MEM_CPU)
				supported++;
			continue;
		}
		if (st != TE_OK) {
			log_error(st, "te_mem_register: %s: reg_mem([%p, +%zu), %s) failed: %s%s%s",
				  tp->plugin->name, addr, length, r->location, te_status_str(st),
				  *transport_error(tp) ? ": " : "", transport_error(tp));
			goto err_unwind;
		}
		st = transport_pack_key(tp, r->handles[i], keybuf, sizeof(keybuf), &klen);
		if (st != TE_OK || klen > sizeof(keybuf)) {
			st = st != TE_OK ? st : TE_ERR_TOO_LARGE;
			log_error(st, "te_mem_register: %s: pack_key failed: %s", tp->plugin->name,
				  te_status_str(st));
			goto err_unwind;
		}
		/* klen 0: nothing to publish for this transport (r->keys[i] stays NULL). */
		if (klen)
			r->keys[i] = g_bytes_new(keybuf, klen);
		supported++;
	}
	if (e->n_tps && !supported) {
		st = log_error(TE_ERR_MEMORY_TYPE,
			       "te_mem_register: no installed transport supports %s memory",
			       r->location);
		goto err_unwind;
	}
	g_ptr_array_insert(e->mem.regions, (gint)idx, r);
	atomic_fetch_add_explicit(&e->mem.version, 1, memory_order_release);
	g_rw_lock_writer_unlock(&e->mem.lock);
	ENGINE_LOG(e, TE_LOG_DEBUG, "registered [%p, +%zu) %s access 0x%x", addr, length,
		   r->location, access);
	if (access & (TE_MEM_REMOTE_READ | TE_MEM_REMOTE_WRITE))
		mem_publish(e);
	return TE_OK;

err_unwind:
	g_rw_lock_writer_unlock(&e->mem.lock);
	mem_region_free(e, r);
	return st;
}

enum te_status mem_unregister(struct engine *e, void *addr)
{
	struct mem_region *r = NULL;
	uint32_t remote;
	guint i;

	if (!addr)
		return log_error(TE_ERR_INVALID_ARG, "te_mem_unregister: addr is NULL");
	g_rw_lock_writer_lock(&e->mem.lock);
	for (i = 0; i < e->mem.regions->len; i++) {
		struct mem_region *c = g_ptr_array_index(e->mem.regions, i);

		if (c->addr == (uintptr_t)addr) {
			r = c;
			break;
		}
	}
	if (!r) {
		g_rw_lock_writer_unlock(&e->mem.lock);
		return log_error(TE_ERR_NOT_REGISTERED, "te_mem_unregister: no region starts at %p",
				 addr);
	}
	if (atomic_load_explicit(&r->refs, memory_order_acquire) > 0) {
		int refs = atomic_load(&r->refs);

		g_rw_lock_writer_unlock(&e->mem.lock);
		return log_error(TE_ERR_BUSY,
				 "te_mem_unregister: region %p is used by %d task(s) of live "
				 "batches, or of freed batches whose slices a transport still "
				 "holds",
				 addr, refs);
	}
	g_ptr_array_remove_index(e->mem.regions, i);
	atomic_fetch_add_explicit(&e->mem.version, 1, memory_order_release);
	g_rw_lock_writer_unlock(&e->mem.lock);
	remote = r->access & (TE_MEM_REMOTE_READ | TE_MEM_REMOTE_WRITE);
	mem_region_free(e, r);
	if (remote)
		mem_publish(e);
	return TE_OK;
}

enum te_status mem_overlapping(struct engine *e, uint64_t addr, uint64_t length, uint64_t skip_addr,
			       uint64_t *raddr_out, uint64_t *rlen_out)
{
	enum te_status st = TE_ERR_NOT_FOUND;
	guint i;

	g_rw_lock_reader_lock(&e->mem.lock);
	/* Sorted and disjoint: from the last region starting at or below @addr. */
	i = mem_upper_bound(e->mem.regions, addr);
	for (i = i ? i - 1 : 0; i < e->mem.regions->len; i++) {
		const struct mem_region *r = g_ptr_array_index(e->mem.regions, i);

		if (r->addr >= addr + length)
			break;
		if (r->addr + r->length <= addr || (skip_addr && r->addr == skip_addr))
			continue;
		*raddr_out = r->addr;
		*rlen_out = r->length;
		st = TE_OK;
		break;
	}
	g_rw_lock_reader_unlock(&e->mem.lock);
	return st;
}

enum te_status mem_unregister_within(struct engine *e, uint64_t addr, uint64_t length)
{
	uint64_t raddr, rlen;

	while (mem_overlapping(e, addr, length, 0, &raddr, &rlen) == TE_OK) {
		enum te_status st = mem_unregister(e, (void *)(uintptr_t)raddr);

		/* TE_ERR_NOT_REGISTERED: another thread unregistered it meanwhile. */
		if (st != TE_OK && st != TE_ERR_NOT_REGISTERED)
			return st;
	}
	return TE_OK;
}

void mem_unregister_all(struct engine *e)
{
	g_rw_lock_writer_lock(&e->mem.lock);
	while (e->mem.regions->len) {
		struct mem_region *r =
			g_ptr_array_steal_index(e->mem.regions, e->mem.regions->len - 1);

		mem_region_free(e, r);
	}
	g_rw_lock_writer_unlock(&e->mem.lock);
}
