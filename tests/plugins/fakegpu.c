/* SPDX-License-Identifier: Apache-2.0 */
/* fakegpu.c: a test plugin that owns a GPU memory kind and moves no data (staging, GPUDirect). */

/*
 * It plays the part the nvlink and hip plugins play for the core's memory kinds: it owns
 * TE_PLUGIN_MEM_CUDA (option `kind: hip` for HIP) and answers mem_query, mem_copy, mem_alloc,
 * mem_free and mem_dmabuf, so that other transports reach its "device memory" only by staging
 * through the host (core bounce buffers, tcp's serving side) or, with `dmabuf: true`, through
 * a dmabuf registered with a NIC (rdma over the tests' fake verbs).
 *
 * Device memory is not host memory here either: every allocation is a PROT_NONE reservation
 * (its addresses are the device pointers) backed by a separate shadow mapping of a memfd that
 * only mem_copy, and whoever maps the fd mem_dmabuf hands out, reaches. Any direct CPU access
 * to a device pointer, by the core or by a transport that forgot to stage, faults at once.
 *
 * Options: kind (cuda|hip), devices (1..8, default 2), fail_copy_after (N: copies after the
 * first N fail with TE_ERR_DEVICE_FAILED), dmabuf (true|false, default false: mem_dmabuf
 * answers TE_ERR_UNSUPPORTED, as with a driver that exports none; true: a dup of the
 * allocation's memfd and the offset of the address in it, which a NIC driver would import).
 * It loads no peer: every request goes to another transport.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>

/* The project version, passed by the build; 0.0.0 when built outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define FAKEGPU_NAME "fakegpu"
#define FAKEGPU_MAX_ALLOCS 1024u

struct fakegpu_alloc {
	uint8_t *dev;	 /* PROT_NONE reservation: the device pointer */
	uint8_t *shadow; /* where the bytes really are: a MAP_SHARED mapping of fd */
	int fd;		 /* memfd of the bytes (what mem_dmabuf exports) */
	uint64_t len;
	int32_t device;
};

struct fakegpu_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	uint32_t kind;
	uint64_t devices;
	uint64_t fail_after; /* 0: never */
	bool dmabuf;	     /* mem_dmabuf exports the memfd (else: TE_ERR_UNSUPPORTED) */
	atomic_uint_fast64_t copies;
	pthread_mutex_t lock;
	struct fakegpu_alloc allocs[FAKEGPU_MAX_ALLOCS];
	uint32_t n_allocs;
};

struct fakegpu_mem {
	int unused;
};

static struct fakegpu_inst *fakegpu_of(struct te_plugin_inst *inst)
{
	return (struct fakegpu_inst *)inst;
}

static void fakegpu_release(struct fakegpu_alloc *a)
{
	if (a->dev && a->dev != MAP_FAILED)
		munmap(a->dev, a->len);
	if (a->shadow && a->shadow != MAP_FAILED)
		munmap(a->shadow, a->len);
	if (a->fd >= 0)
		close(a->fd);
}

#define fakegpu_error(fi, ...) (fi)->host->set_error((fi)->ctx, __VA_ARGS__)

static enum te_status fakegpu_init(const struct te_plugin_host *host,
				   struct te_plugin_host_ctx *ctx, struct te_plugin_inst **inst_out)
{
	static const char *const names[] = { "kind", "devices", "fail_copy_after", "dmabuf" };
	struct fakegpu_inst *fi;
	const char *kind;
	char bad[64];

	if (!host || !inst_out || !TE_PLUGIN_HAS(host, struct te_plugin_host, mem_dmabuf))
		return TE_ERR_INVALID_ARG;
	if (te_plugin_unknown_option(host, ctx, names, TE_PLUGIN_ARRAY_LEN(names), bad,
				     sizeof(bad))) {
		host->set_error(ctx, FAKEGPU_NAME ": unknown option '%s'", bad);
		return TE_ERR_CONFIG;
	}
	fi = calloc(1, sizeof(*fi));
	if (!fi)
		return TE_ERR_NOMEM;
	fi->host = host;
	fi->ctx = ctx;
	fi->kind = TE_PLUGIN_MEM_CUDA;
	fi->devices = 2;
	kind = host->config_get(ctx, "kind");
	if (kind && strcmp(kind, "hip") == 0)
		fi->kind = TE_PLUGIN_MEM_HIP;
	else if (kind && strcmp(kind, "cuda") != 0) {
		host->set_error(ctx, FAKEGPU_NAME ": option 'kind': cuda or hip, got '%s'", kind);
		free(fi);
		return TE_ERR_CONFIG;
	}
	if ((host->config_get(ctx, "devices") &&
	     !te_plugin_parse_u64(host->config_get(ctx, "devices"), false, 1, 8, &fi->devices)) ||
	    (host->config_get(ctx, "fail_copy_after") &&
	     !te_plugin_parse_u64(host->config_get(ctx, "fail_copy_after"), false, 1, 1u << 30,
				  &fi->fail_after))) {
		host->set_error(ctx, FAKEGPU_NAME ": options 'devices' (1..8), 'fail_copy_after'");
		free(fi);
		return TE_ERR_CONFIG;
	}
	if (host->config_get(ctx, "dmabuf") &&
	    !te_plugin_parse_bool(host->config_get(ctx, "dmabuf"), &fi->dmabuf)) {
		host->set_error(ctx, FAKEGPU_NAME ": option 'dmabuf': true or false");
		free(fi);
		return TE_ERR_CONFIG;
	}
	pthread_mutex_init(&fi->lock, NULL);
	*inst_out = (struct te_plugin_inst *)fi;
	return TE_OK;
}

static void fakegpu_fini(struct te_plugin_inst *inst)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);

	for (uint32_t i = 0; i < fi->n_allocs; i++)
		fakegpu_release(&fi->allocs[i]);
	pthread_mutex_destroy(&fi->lock);
	free(fi);
}

static enum te_status fakegpu_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);

	caps->mem_types = fi->kind;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->max_devices = 8;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, owned_mem_types))
		caps->owned_mem_types = fi->kind;
	return TE_OK;
}

static enum te_status fakegpu_query_devices(struct te_plugin_inst *inst,
					    struct te_plugin_device *devs, uint32_t max,
					    uint32_t *n_out)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);
	uint32_t n = (uint32_t)fi->devices < max ? (uint32_t)fi->devices : max;

	for (uint32_t i = 0; i < n; i++) {
		snprintf(devs[i].name, sizeof(devs[i].name), "fake%s%u",
			 fi->kind == TE_PLUGIN_MEM_HIP ? "hip" : "cuda", i);
		devs[i].numa_node = -1;
		devs[i].mem_types = fi->kind;
	}
	*n_out = n;
	return TE_OK;
}

/* The allocation holding @addr, or NULL. Under lock. */
static struct fakegpu_alloc *fakegpu_find(struct fakegpu_inst *fi, const void *addr)
{
	const uint8_t *p = addr;

	for (uint32_t i = 0; i < fi->n_allocs; i++)
		if (p >= fi->allocs[i].dev && p < fi->allocs[i].dev + fi->allocs[i].len)
			return &fi->allocs[i];
	return NULL;
}

static enum te_status fakegpu_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				      uint32_t mem_type, int32_t dev, uint32_t access,
				      struct te_plugin_mem **mem_out)
{
	static struct fakegpu_mem dummy;

	(void)inst, (void)addr, (void)length, (void)mem_type, (void)dev, (void)access;
	*mem_out = (struct te_plugin_mem *)&dummy;
	return TE_OK;
}

static enum te_status fakegpu_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	return TE_OK;
}

static enum te_status fakegpu_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				       void *buf, size_t cap, size_t *len_out)
{
	*len_out = 0; /* peers never reach this memory through fakegpu */
	return TE_OK;
}

static enum te_status fakegpu_load_peer(struct te_plugin_inst *inst, const char *peer_name,
					const void *blob, size_t len,
					struct te_plugin_peer **peer_out)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);

	fakegpu_error(fi, FAKEGPU_NAME ": moves no data between engines (a memory-kind owner)");
	return TE_ERR_UNSUPPORTED;
}

static void fakegpu_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
}

static enum te_status fakegpu_unpack_remote_key(struct te_plugin_inst *inst,
						struct te_plugin_peer *peer, const void *blob,
						size_t len, uint64_t addr, uint64_t length,
						struct te_plugin_rkey **rkey_out)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status fakegpu_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				     uint32_t n, uint32_t *accepted_out)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status fakegpu_mem_query(struct te_plugin_inst *inst, const void *addr, uint64_t len,
					uint32_t *mem_type_out, int32_t *dev_out)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);
	struct fakegpu_alloc *a;
	enum te_status st = TE_ERR_NOT_FOUND;

	pthread_mutex_lock(&fi->lock);
	a = fakegpu_find(fi, addr);
	if (a && (const uint8_t *)addr + len > a->dev + a->len) {
		fakegpu_error(fi,
			      FAKEGPU_NAME ": [%p, +%" PRIu64
					   ") runs past its allocation [%p, +%" PRIu64
					   ") on device %d",
			      addr, len, (void *)a->dev, a->len, a->device);
		st = TE_ERR_OUT_OF_RANGE;
	} else if (a) {
		*mem_type_out = fi->kind;
		*dev_out = a->device;
		st = TE_OK;
	}
	pthread_mutex_unlock(&fi->lock);
	return st;
}

static enum te_status fakegpu_mem_copy(struct te_plugin_inst *inst, void *dst, const void *src,
				       uint64_t len, uint32_t mem_type, int32_t dev,
				       enum te_plugin_copy_dir dir)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);
	const void *devp = dir == TE_PLUGIN_COPY_TO_HOST ? src : dst;
	struct fakegpu_alloc *a;
	uint8_t *shadow;
	uint64_t n;

	if (mem_type != fi->kind)
		return TE_ERR_MEMORY_TYPE;
	n = atomic_fetch_add(&fi->copies, 1) + 1;
	if (fi->fail_after && n > fi->fail_after) {
		fakegpu_error(fi, FAKEGPU_NAME ": copy %" PRIu64 " failed (injected)", n);
		return TE_ERR_DEVICE_FAILED;
	}
	pthread_mutex_lock(&fi->lock);
	a = fakegpu_find(fi, devp);
	if (!a || (const uint8_t *)devp + len > a->dev + a->len || a->device != dev) {
		pthread_mutex_unlock(&fi->lock);
		fakegpu_error(fi,
			      FAKEGPU_NAME ": copy of [%p, +%" PRIu64
					   ") on device %d: not inside one "
					   "allocation of that device",
			      devp, len, dev);
		return TE_ERR_OUT_OF_RANGE;
	}
	shadow = a->shadow + ((const uint8_t *)devp - a->dev);
	pthread_mutex_unlock(&fi->lock);
	if (dir == TE_PLUGIN_COPY_TO_HOST)
		memcpy(dst, shadow, len);
	else
		memcpy(shadow, src, len);
	return TE_OK;
}

/* A dup of the allocation's memfd: what a GPU driver's dmabuf export is to a NIC driver. */
static enum te_status fakegpu_mem_dmabuf(struct te_plugin_inst *inst, const void *addr,
					 uint64_t len, int *fd_out, uint64_t *offset_out)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);
	struct fakegpu_alloc *a;
	uint64_t off;
	int fd;

	if (!fi->dmabuf) {
		fakegpu_error(fi, FAKEGPU_NAME ": no dmabuf export (option dmabuf: false)");
		return TE_ERR_UNSUPPORTED;
	}
	pthread_mutex_lock(&fi->lock);
	a = fakegpu_find(fi, addr);
	if (!a || len > a->len - (uint64_t)((const uint8_t *)addr - a->dev)) {
		pthread_mutex_unlock(&fi->lock);
		fakegpu_error(fi,
			      FAKEGPU_NAME ": dmabuf of [%p, +%" PRIu64
					   "): not inside one allocation",
			      addr, len);
		return TE_ERR_OUT_OF_RANGE;
	}
	off = (uint64_t)((const uint8_t *)addr - a->dev);
	fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_unlock(&fi->lock);
	if (fd < 0) {
		fakegpu_error(fi, FAKEGPU_NAME ": dup of the memfd: %s", strerror(errno));
		return TE_ERR_SYSTEM;
	}
	*fd_out = fd;
	*offset_out = off;
	return TE_OK;
}

static enum te_status fakegpu_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
					uint64_t len, void **ptr_out)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);
	struct fakegpu_alloc a = { .len = len, .device = dev, .fd = -1 };

	if (mem_type != fi->kind)
		return TE_ERR_UNSUPPORTED; /* no pinned host memory here: the core allocates */
	if (dev < 0 || (uint64_t)dev >= fi->devices) {
		fakegpu_error(fi, FAKEGPU_NAME ": no device %d (%" PRIu64 " devices)", dev,
			      fi->devices);
		return TE_ERR_NO_DEVICE;
	}
	a.dev = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	/* The bytes live in a memfd, so that mem_dmabuf can hand them to a NIC driver. */
	a.fd = memfd_create("fakegpu", MFD_CLOEXEC);
	if (a.dev == MAP_FAILED || a.fd < 0 || ftruncate(a.fd, (off_t)len) != 0) {
		fakegpu_error(fi, FAKEGPU_NAME ": %" PRIu64 " bytes on device %d: %s", len, dev,
			      strerror(errno));
		a.shadow = NULL;
		fakegpu_release(&a);
		return TE_ERR_NOMEM;
	}
	a.shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
	if (a.shadow == MAP_FAILED) {
		fakegpu_error(fi, FAKEGPU_NAME ": mapping %" PRIu64 " bytes: %s", len,
			      strerror(errno));
		fakegpu_release(&a);
		return TE_ERR_NOMEM;
	}
	pthread_mutex_lock(&fi->lock);
	if (fi->n_allocs == FAKEGPU_MAX_ALLOCS) {
		pthread_mutex_unlock(&fi->lock);
		fakegpu_release(&a);
		return TE_ERR_NOMEM;
	}
	fi->allocs[fi->n_allocs++] = a;
	pthread_mutex_unlock(&fi->lock);
	*ptr_out = a.dev;
	return TE_OK;
}

static enum te_status fakegpu_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	struct fakegpu_inst *fi = fakegpu_of(inst);

	pthread_mutex_lock(&fi->lock);
	for (uint32_t i = 0; i < fi->n_allocs; i++) {
		if (fi->allocs[i].dev != ptr)
			continue;
		fakegpu_release(&fi->allocs[i]);
		fi->allocs[i] = fi->allocs[--fi->n_allocs];
		pthread_mutex_unlock(&fi->lock);
		return TE_OK;
	}
	pthread_mutex_unlock(&fi->lock);
	return TE_ERR_NOT_FOUND;
}

static const struct te_plugin_ops fakegpu_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = fakegpu_init,
	.fini = fakegpu_fini,
	.query_caps = fakegpu_query_caps,
	.query_devices = fakegpu_query_devices,
	.reg_mem = fakegpu_reg_mem,
	.dereg_mem = fakegpu_dereg_mem,
	.pack_key = fakegpu_pack_key,
	.load_peer = fakegpu_load_peer,
	.unload_peer = fakegpu_unload_peer,
	.unpack_remote_key = fakegpu_unpack_remote_key,
	.submit = fakegpu_submit,
	.mem_query = fakegpu_mem_query,
	.mem_copy = fakegpu_mem_copy,
	.mem_dmabuf = fakegpu_mem_dmabuf,
	.mem_alloc = fakegpu_mem_alloc,
	.mem_free = fakegpu_mem_free,
};

static const struct te_plugin_desc fakegpu_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = FAKEGPU_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "test plugin: owns a fake GPU memory kind, moves no data",
	.ops = &fakegpu_ops,
};

TE_PLUGIN_DEFINE(&fakegpu_desc)
