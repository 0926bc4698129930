/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_plugin_gpu.h: header-only toolkit for GPU transport plugins: everything but the vendor's
 * runtime calls, so that plugins for CUDA (nvlink), HIP (hip) and others share one data path.
 *
 * A GPU plugin moves bytes between GPU memory (and host memory on one side) of te engines with
 * the GPUs' copy engines, and owns its memory kind (te_plugin.h, "memory kinds"). What is the
 * same for every vendor lives here; the plugin gives a table of hooks over its runtime
 * (struct te_plugin_gpu_vendor: streams, events, copies, pointer queries, IPC handles) and
 * embeds struct te_plugin_gpu at the start of its instance:
 *
 *   struct my_inst { struct te_plugin_gpu g; struct my_runtime_fns fns; ... };
 *   static const struct te_plugin_gpu_vendor my_vendor = { ... hooks ... };
 *   static enum te_status my_init(const struct te_plugin_host *h, struct te_plugin_host_ctx *c,
 *                                 struct te_plugin_inst **out)
 *   {
 *           return te_plugin_gpu_init(h, c, &my_vendor, sizeof(struct my_inst), out);
 *   }
 *   static const struct te_plugin_ops my_ops = TE_PLUGIN_GPU_OPS(my_init);
 *
 * What the toolkit does:
 * - init: options (library, streams, window, slice_size, pin_host, fetch_timeout_ms, and the
 *   vendor's: declared in the plugin's descriptor, TE_PLUGIN_GPU_OPTIONS_COMMON), dlopen of the runtime with the loader's text, a minimum runtime version, one te
 *   device per GPU (name, PCI bus id, NUMA node from sysfs when the runtime has none), peer
 *   access between every pair that allows it (it decides which GPU can copy to which), the
 *   published blob (who this process is: te_plugin_gpu_util.h), an fd socket when the vendor
 *   shares file descriptors (te_plugin_gpu_sock.h), the wait helper thread.
 * - memory: the owner ops (mem_query, mem_copy, mem_dmabuf, mem_alloc, mem_free: allocations
 *   are tracked, leftovers freed at fini); reg_mem of host memory (pinned, the local side only)
 *   and of GPU memory (one allocation; remote access exports an IPC handle, or what the vendor's
 *   export hook makes); keys of 152 bytes; load_peer telling a peer of this process, this host,
 *   a dead process or another host; an import cache mapping each remote allocation once per peer
 *   instance, reference counted, unmapped when the last key goes (release_remote_key, a peer's
 *   restart, fini).
 * - data path: MANUAL progress. submit launches one async copy per slice on a stream of the
 *   copying GPU (the local GPU; for host memory the GPU holding the remote memory), round robin
 *   over `streams` per GPU; slices launched back to back on a stream form a launch group
 *   (TE_PLUGIN_GPU_GROUP_MAX slices, TE_PLUGIN_GPU_GROUP_BYTES bytes) whose last slot's event is
 *   recorded after them, so small slices cost one record and one query per group. Rings and
 *   events are preallocated (`window` per stream; a full ring is back-pressure); nothing is kept
 *   in slice->priv. progress reaps each stream's oldest groups; wait parks the caller until a
 *   helper thread, blocked in the runtime's event synchronize on blocking-sync events, sees the
 *   oldest group complete. Failures found in submit are queued and reported by progress. cancel
 *   cannot stop a launched copy: the slice comes back with its real outcome when its group
 *   completes. A sticky runtime error marks the GPU failed for good: its slices, later slices,
 *   copies and allocations on it fail with the runtime's text, and the core is told
 *   (device_event DOWN).
 *
 * Vendor hooks return the runtime's own status code (0: success; CUresult, hipError_t) unless
 * they say otherwise; the toolkit turns codes into text with the strerror hook. Hooks are called
 * from any thread, concurrently (the data path is THREAD_MULTI): the runtime's per-thread
 * current device is set with set_dev before every call that needs one.
 *
 * Linux, C11 or C++11, pthreads and libdl (see te_plugin_gpu_util.h for what it includes).
 */
#ifndef TE_PLUGIN_GPU_H
#define TE_PLUGIN_GPU_H

#include <te/te_plugin_gpu_sock.h>
#include <te/te_plugin_gpu_util.h>

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_PLUGIN_GPU_MAX_DEV TE_PLUGIN_MAX_DEVICES /* GPUs per instance: the core's limit */
#define TE_PLUGIN_GPU_WIRE_VERSION 1u
#define TE_PLUGIN_GPU_PAGE 4096ull
#define TE_PLUGIN_GPU_DEF_SLICE (64ull << 20)
/* A launch group: at most this many slices and bytes (a larger slice is a group of its own). */
#define TE_PLUGIN_GPU_GROUP_MAX 32u
#define TE_PLUGIN_GPU_GROUP_BYTES (256u << 10)
#define TE_PLUGIN_GPU_REAP_CHUNK 64u

/* How a peer maps a region's allocation (key kind). */
enum te_plugin_gpu_key_kind {
	TE_PLUGIN_GPU_KEY_NONE = 0, /* host memory, or local only: no key */
	TE_PLUGIN_GPU_KEY_IPC = 1, /* a legacy IPC handle (cuIpcGetMemHandle, hipIpcGetMemHandle) */
	TE_PLUGIN_GPU_KEY_FD = 2,  /* a file descriptor fetched from the exporter's fd socket */
	TE_PLUGIN_GPU_KEY_FABRIC = 3, /* a handle that also reaches other hosts (CUDA FABRIC) */
};

/* Blob flags. */
#define TE_PLUGIN_GPU_BLOB_FABRIC 1u /* this instance shares FABRIC handles */

/* Published blob (56 bytes): what the plugin is and which process it runs in. */
struct te_plugin_gpu_blob {
	uint32_t magic; /* the vendor's blob_magic */
	uint8_t version;
	uint8_t flags; /* TE_PLUGIN_GPU_BLOB_* */
	uint16_t reserved;
	struct te_plugin_gpu_ident id;
};

/* Region key (152 bytes): what a peer needs to map the region's allocation. */
struct te_plugin_gpu_key {
	uint32_t magic; /* the vendor's key_magic */
	uint8_t version;
	uint8_t kind;	/* enum te_plugin_gpu_key_kind */
	uint8_t access; /* TE_PLUGIN_ACCESS_* */
	uint8_t reserved;
	int32_t dev; /* exporter's device ordinal */
	uint32_t reserved2;
	uint64_t addr; /* the region */
	uint64_t length;
	uint64_t alloc_base; /* the allocation holding it, exporter's address */
	uint64_t alloc_size;
	uint64_t export_id; /* KEY_FD */
	char pci[32];	    /* the exporter's GPU */
	uint8_t handle[64]; /* IPC or FABRIC handle */
};

TE_PLUGIN_GPU_STATIC_ASSERT(sizeof(struct te_plugin_gpu_blob) == 56, "blob wire size");
TE_PLUGIN_GPU_STATIC_ASSERT(sizeof(struct te_plugin_gpu_key) == 152, "key wire size");

struct te_plugin_gpu;
struct te_plugin_gpu_dev;

/* Membership of the instance's lists of what the core holds (fini frees what is left). */
struct te_plugin_gpu_link {
	struct te_plugin_gpu_link *prev, *next;
};

/* A stream of one GPU and its ring of launched slices. */
struct te_plugin_gpu_stream {
	pthread_mutex_t lock;
	struct te_plugin_gpu_dev *dev;
	void *s;   /* the runtime's stream */
	void **ev; /* per slot; recorded at the last slot of each launch group */
	struct te_plugin_slice **ring; /* atomic: per slot, the slice in flight */
	uint32_t *gend;		       /* per slot: the slot ending its launch group */
	uint64_t *seq;		       /* per slot: launch order, for the wait helper */
	uint32_t cap;
	uint32_t head;
	uint32_t count; /* atomic: written under lock; read without it to skip idle streams */
};

struct te_plugin_gpu_dev {
	int ordinal;
	char gpu[64];	/* name */
	char pci[32];	/* bus id */
	int numa;	/* -1 unknown */
	bool dmabuf;	/* the runtime exports dmabufs of its memory (dmabuf hook) */
	uint64_t peers; /* devices this one reaches with peer access enabled */
	bool failed;	/* atomic: a sticky error; fail holds why */
	pthread_mutex_t fail_lock;
	char fail[TE_PLUGIN_GPU_DETAIL];
	struct te_plugin_gpu_stream *streams;
	uint32_t n_streams;
	uint32_t rr; /* atomic: round robin over streams */
	void *priv;  /* the vendor's (dev_open sets it, dev_close frees it) */
};

/* What the runtime says of a pointer (ptr_info hook). */
struct te_plugin_gpu_ptr {
	bool device; /* GPU memory of this runtime; the rest is meaningful only then */
	int dev;
	uintptr_t base; /* the allocation holding it */
	size_t size;
	bool ipc; /* a legacy IPC handle can share it */
};

/* Direction of an async copy, for runtimes that want it said (hipMemcpyKind). */
enum te_plugin_gpu_dir {
	TE_PLUGIN_GPU_D2D = 0,
	TE_PLUGIN_GPU_D2H = 1,
	TE_PLUGIN_GPU_H2D = 2,
};

/* A remote allocation mapped here, shared by the keys of one peer instance. */
struct te_plugin_gpu_import {
	struct te_plugin_gpu_import *next;
	int refs; /* under imp_lock */
	uint64_t peer_nonce;
	uint8_t kind;
	uint64_t alloc_base;
	uint64_t alloc_size;
	uintptr_t local; /* import hook: where the allocation starts here */
	size_t map_size; /* import hook: bytes mapped, for unimport */
	int owner;	 /* local ordinal of the GPU holding it, -1 not visible here */
	int copy_dev;	 /* GPU that copies for a host buffer (current during import hooks) */
	uint64_t reach;	 /* local GPUs that can copy to and from it */
};

/* A registration (struct te_plugin_mem of the ABI). */
struct te_plugin_gpu_mem {
	struct te_plugin_gpu_link link;
	void *addr;
	uint64_t length;
	uint32_t type;
	int32_t dev;
	uint32_t access;
	bool pinned;
	struct te_plugin_gpu_key key; /* kind NONE: nothing published */
};

/* A peer (struct te_plugin_peer). */
struct te_plugin_gpu_peer {
	struct te_plugin_gpu_link link;
	char name[128];
	struct te_plugin_gpu_blob blob;
	bool same_process;
	bool same_host;
};

/* A remote region (struct te_plugin_rkey). */
struct te_plugin_gpu_rkey {
	struct te_plugin_gpu_link link;
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	uint64_t local;			  /* this process's address of addr */
	int copy_dev;			  /* GPU that copies for a host buffer */
	uint64_t reach;			  /* GPUs that can copy to and from it */
	struct te_plugin_gpu_import *imp; /* NULL: same process, or broken */
	int exporter_dev;
	char exporter_pci[32];
	enum te_status broken; /* TE_OK, or why every slice using it fails */
	char why[TE_PLUGIN_GPU_DETAIL];
};

/* An allocation of mem_alloc. */
struct te_plugin_gpu_alloc {
	struct te_plugin_gpu_alloc *next;
	void *ptr;
	size_t size; /* what the alloc hook says (for its free) */
	int flavor;  /* the alloc hook's kind of allocation (for its free) */
	int dev;
};

/* A slice queued to fail (found in submit, reported by progress). */
struct te_plugin_gpu_failed {
	struct te_plugin_slice *s;
	enum te_status status;
	char text[TE_PLUGIN_GPU_DETAIL];
};

struct te_plugin_gpu_waiter {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t kick;
	pthread_cond_t woke; /* on CLOCK_MONOTONIC */
	unsigned sleepers;
	uint64_t gen;
	bool stop;
};

/*
 * The vendor's part: names for messages and hooks over its runtime. Static storage. Hooks marked
 * "optional" may be NULL.
 */
struct te_plugin_gpu_vendor {
	const char *name;    /* the plugin's name ("nvlink"): message prefix, socket names */
	const char *kind;    /* location kind ("cuda"): "cuda:0" */
	const char *api;     /* "CUDA": "no such CUDA device", "CUDA memory handles" */
	const char *runtime; /* "CUDA driver", "HIP runtime": "no CUDA driver: cannot load ..." */
	uint32_t mem_type;   /* TE_PLUGIN_MEM_CUDA, TE_PLUGIN_MEM_HIP */
	uint32_t blob_magic;
	uint32_t key_magic;
	const char *description_fabric; /* "FABRIC handles" where the vendor has them, else NULL */
	/*
	 * Options: declared in the plugin's descriptor (TE_PLUGIN_GPU_OPTIONS_COMMON and its
	 * own, te_plugin_gpu_util.h); the core checks them before init.
	 */
	const char *const *libraries; /* default names to dlopen, in order */
	size_t n_libraries;
	int min_version; /* the oldest runtime version (as the version hook reports) it works with */
	int not_ready;	 /* the code event_query returns while copies run */
	int host_registered; /* the code host_register returns for memory registered already */
	/* Names of runtime calls, for messages ("cuMemcpyAsync"). */
	const char *fn_set_dev, *fn_copy, *fn_copy_async, *fn_event_record, *fn_event_query,
		*fn_stream_create, *fn_event_create, *fn_enable_peer, *fn_host_register,
		*fn_ipc_get, *fn_dmabuf;

	/* --- setup (init; set_error through te_plugin_gpu_error on failure) --- */
	/* Optional: the vendor's own options (the common ones are in g already). */
	enum te_status (*options)(struct te_plugin_gpu *g);
	/* The runtime's version from g->dl; TE_ERR_NO_DEVICE when it is not this runtime. */
	enum te_status (*version)(struct te_plugin_gpu *g, int *version_out);
	/* "12.0" for version 12000: into @buf. */
	void (*version_str)(int version, char *buf, size_t len);
	/* Resolve the runtime's entry points, initialise it, count the GPUs (> 0). */
	enum te_status (*open)(struct te_plugin_gpu *g, uint32_t *n_devs_out);
	/* Fill d->gpu, d->pci, d->numa (else -1: sysfs), d->dmabuf, d->priv for d->ordinal. */
	enum te_status (*dev_open)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d);
	/* Optional: release what dev_open took (called for every device, opened or not). */
	void (*dev_close)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d);
	/* Optional: the end (the toolkit dlcloses g->dl after it). */
	void (*close)(struct te_plugin_gpu *g);
	/* "CUDA driver 13.0 via libcuda.so.1" into @head; optional extras ("; fabric ...") @tail. */
	void (*describe)(struct te_plugin_gpu *g, char *head, size_t hlen, char *tail, size_t tlen);

	/* --- devices --- */
	int (*set_dev)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d);
	/* *can: whether @d reaches memory of @peer; enable it (0 when already enabled). */
	int (*can_access_peer)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
			       struct te_plugin_gpu_dev *peer, int *can);
	int (*enable_peer)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
			   struct te_plugin_gpu_dev *peer);

	/* --- streams, events, copies (@d current) --- */
	int (*stream_create)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out);
	void (*stream_destroy)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *s);
	int (*stream_sync)(struct te_plugin_gpu *g, void *s);
	/* An event for blocking synchronization (the wait helper sleeps in event_sync). */
	int (*event_create)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out);
	void (*event_destroy)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *e);
	int (*event_record)(struct te_plugin_gpu *g, void *e, void *s);
	/* 0: done; not_ready: copies before it still run; other codes: failure. */
	int (*event_query)(struct te_plugin_gpu *g, void *e);
	int (*event_sync)(struct te_plugin_gpu *g, void *e);
	int (*copy_async)(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
			  enum te_plugin_gpu_dir dir, void *s);
	/* A synchronous copy between GPU memory of the current device and host memory. */
	int (*copy)(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
		    enum te_plugin_copy_dir dir);

	/* --- errors --- */
	/* "CUDA_ERROR_X: text" of @err into @buf; returns @buf. */
	const char *(*strerror)(struct te_plugin_gpu *g, int err, char *buf, size_t len);
	/* Whether @err leaves the GPU unusable in this process (illegal address, ECC, ...). */
	bool (*sticky)(int err);
	/* te status of @err (out of memory: TE_ERR_NOMEM, ...). */
	enum te_status (*status)(int err);

	/* --- memory --- */
	/* What the runtime knows of @addr; 0 with out->device false when it is not its memory. */
	int (*ptr_info)(struct te_plugin_gpu *g, const void *addr, struct te_plugin_gpu_ptr *out);
	/* @len bytes on @d (current): *ptr, the bytes reserved (*size), its flavor; *step names the
	 * call that failed. */
	int (*alloc)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uint64_t len, void **ptr,
		     size_t *size, int *flavor, const char **step);
	int (*free)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *ptr, size_t size,
		    int flavor);
	/* Pin host memory for every GPU (devs[0] current). */
	int (*host_register)(struct te_plugin_gpu *g, void *addr, uint64_t len);
	void (*host_unregister)(struct te_plugin_gpu *g, void *addr);
	/* Optional: a dmabuf fd of [@start, +@len) (page aligned) of @d's memory. */
	int (*dmabuf)(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uintptr_t start,
		      size_t len, int *fd);
	/* The legacy IPC handle of the allocation at @base (pi.ipc), 64 bytes. */
	int (*ipc_get)(struct te_plugin_gpu *g, uintptr_t base, uint8_t handle[64]);
	/*
	 * Optional: what peers need for memory that is not IPC capable (CUDA VMM): set m->key.kind
	 * (FD: te_plugin_gpu_export_add on g->sock, the id in key.export_id; FABRIC: key.handle),
	 * and key.alloc_base/alloc_size when the allocation is not @pi's range. set_error and an
	 * error status when peers cannot map it.
	 */
	enum te_status (*export_other)(struct te_plugin_gpu *g, struct te_plugin_gpu_mem *m,
				       const struct te_plugin_gpu_ptr *pi,
				       struct te_plugin_gpu_dev *d);
	/*
	 * Map the allocation of key @k here (imp->copy_dev current): set imp->local and
	 * imp->map_size. @fd: the descriptor of a KEY_FD key (owned by the caller), else -1.
	 * *step names the call that failed.
	 */
	int (*import)(struct te_plugin_gpu *g, const struct te_plugin_gpu_key *k, int fd,
		      struct te_plugin_gpu_import *imp, const char **step);
	void (*unimport)(struct te_plugin_gpu *g, struct te_plugin_gpu_import *imp);
};

/* The toolkit's part of a plugin instance; the vendor's instance starts with it. */
struct te_plugin_gpu {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	const struct te_plugin_gpu_vendor *v;
	/* the runtime */
	void *dl;
	const char *dl_name; /* the name that loaded (in library or v->libraries) */
	int version;	     /* the version hook's */
	/* common options */
	char library[256]; /* "" : v->libraries */
	uint32_t streams_per_dev;
	uint32_t window;
	uint64_t slice_size;
	bool pin_host;
	uint32_t fetch_timeout_ms;
	/* Set by the vendor in its options/open/dev_open hooks. */
	bool fabric; /* FABRIC handles usable: peers of other hosts (clears SAME_HOST_ONLY) */
	bool fds;    /* regions may be shared as file descriptors: serve the fd socket */
	/* identity */
	struct te_plugin_gpu_blob blob;
	bool auth;
	/* devices */
	struct te_plugin_gpu_dev *devs;
	uint32_t n_devs;
	uint64_t launch_seq; /* atomic */
	/* failures found in submit, reported by progress */
	pthread_mutex_t defer_lock;
	struct te_plugin_gpu_failed *defers; /* grows on failures only, never on the data path */
	uint32_t n_defers, cap_defers;
	uint32_t n_defer; /* atomic copy of n_defers */
	/* imports and allocations */
	pthread_mutex_t imp_lock;
	struct te_plugin_gpu_import *imports;
	pthread_mutex_t alloc_lock;
	struct te_plugin_gpu_alloc *allocs;
	/* registrations, peers and keys the core holds; under obj_lock */
	pthread_mutex_t obj_lock;
	struct te_plugin_gpu_link mems, peers, rkeys;
	struct te_plugin_gpu_sock sock;
	struct te_plugin_gpu_waiter waiter;
};

/* --- small things ------------------------------------------------------------------------- */

static inline struct te_plugin_gpu *te_plugin_gpu_of(struct te_plugin_inst *inst)
{
	return (struct te_plugin_gpu *)inst;
}

#define TE_PLUGIN_GPU_ERROR(g, ...)                                                                \
	te_plugin_gpu_error((g)->host, (g)->ctx, (g)->v->name, __VA_ARGS__)

static inline struct te_plugin_gpu_dev *te_plugin_gpu_dev_get(struct te_plugin_gpu *g, int32_t dev)
{
	return dev >= 0 && (uint32_t)dev < g->n_devs ? &g->devs[dev] : NULL;
}

static inline const char *te_plugin_gpu_strerror(struct te_plugin_gpu *g, int err, char *buf,
						 size_t len)
{
	return g->v->strerror(g, err, buf, len);
}

static inline void te_plugin_gpu_link_add(struct te_plugin_gpu *g, struct te_plugin_gpu_link *head,
					  struct te_plugin_gpu_link *l)
{
	pthread_mutex_lock(&g->obj_lock);
	l->next = head->next;
	l->prev = head;
	head->next->prev = l;
	head->next = l;
	pthread_mutex_unlock(&g->obj_lock);
}

static inline void te_plugin_gpu_link_del(struct te_plugin_gpu *g, struct te_plugin_gpu_link *l)
{
	pthread_mutex_lock(&g->obj_lock);
	l->prev->next = l->next;
	l->next->prev = l->prev;
	l->next = l->prev = l;
	pthread_mutex_unlock(&g->obj_lock);
}

/* Mark @d failed for good (a sticky error in @where): its slices fail from now on. */
static inline void te_plugin_gpu_dev_fail(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
					  const char *where, int err)
{
	char why[TE_PLUGIN_GPU_DETAIL], cs[128];
	bool first;

	pthread_mutex_lock(&d->fail_lock);
	first = !__atomic_load_n(&d->failed, __ATOMIC_RELAXED);
	if (first) {
		te_plugin_gpu_fmt(d->fail, sizeof(d->fail), "%s: %s:%d (%s): %s: %s", g->v->name,
				  g->v->kind, d->ordinal, d->pci, where,
				  te_plugin_gpu_strerror(g, err, cs, sizeof(cs)));
		__atomic_store_n(&d->failed, true, __ATOMIC_RELEASE);
	}
	te_plugin_gpu_fmt(why, sizeof(why), "%s", d->fail);
	pthread_mutex_unlock(&d->fail_lock);
	if (first) {
		g->host->log(g->ctx, TE_PLUGIN_LOG_ERROR, "%s; the GPU is unusable in this process",
			     why + strlen(g->v->name) + 2);
		g->host->device_event(g->ctx, (uint32_t)d->ordinal, TE_PLUGIN_EVENT_DOWN, why);
	}
}

/* A failed device's text into @buf (copied: the device may be failing concurrently). */
static inline bool te_plugin_gpu_dev_failed(struct te_plugin_gpu_dev *d, char *buf, size_t len)
{
	if (!__atomic_load_n(&d->failed, __ATOMIC_ACQUIRE))
		return false;
	pthread_mutex_lock(&d->fail_lock);
	te_plugin_gpu_fmt(buf, len, "%s", d->fail);
	pthread_mutex_unlock(&d->fail_lock);
	return true;
}

/* GPUs that can copy to and from memory of local GPU @owner: itself and its peers. */
static inline uint64_t te_plugin_gpu_reach_of(const struct te_plugin_gpu *g, int owner)
{
	uint64_t m;

	if (owner < 0)
		return 0;
	m = 1ull << owner;
	for (uint32_t j = 0; j < g->n_devs; j++)
		if (g->devs[j].peers & (1ull << owner))
			m |= 1ull << j;
	return m;
}

static inline int te_plugin_gpu_dev_by_pci(const struct te_plugin_gpu *g, const char *pci)
{
	for (uint32_t i = 0; i < g->n_devs; i++)
		if (strncasecmp(g->devs[i].pci, pci, sizeof(g->devs[i].pci)) == 0)
			return (int)i;
	return -1;
}

/* --- devices and streams ------------------------------------------------------------------ */

static inline enum te_status te_plugin_gpu_stream_init_(struct te_plugin_gpu *g,
							struct te_plugin_gpu_stream *st)
{
	char cs[128];
	int r;

	st->cap = g->window;
	pthread_mutex_init(&st->lock, NULL);
	st->ev = (void **)calloc(st->cap, sizeof(*st->ev));
	st->ring = (struct te_plugin_slice **)calloc(st->cap, sizeof(*st->ring));
	st->seq = (uint64_t *)calloc(st->cap, sizeof(*st->seq));
	st->gend = (uint32_t *)calloc(st->cap, sizeof(*st->gend));
	if (!st->ev || !st->ring || !st->seq || !st->gend) {
		TE_PLUGIN_GPU_ERROR(g, "%s: out of memory for stream rings", g->v->name);
		return TE_ERR_NOMEM;
	}
	r = g->v->stream_create(g, st->dev, &st->s);
	if (r) {
		st->s = NULL;
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: %s: %s", g->v->name, g->v->kind,
				    st->dev->ordinal, g->v->fn_stream_create,
				    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	for (uint32_t i = 0; i < st->cap; i++) {
		r = g->v->event_create(g, st->dev, &st->ev[i]);
		if (r) {
			st->ev[i] = NULL;
			TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: %s: %s", g->v->name, g->v->kind,
					    st->dev->ordinal, g->v->fn_event_create,
					    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
			return TE_ERR_NO_DEVICE;
		}
	}
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_dev_open_(struct te_plugin_gpu *g,
						     struct te_plugin_gpu_dev *d)
{
	char cs[128];
	enum te_status st;
	int r;

	st = g->v->dev_open(g, d);
	if (st != TE_OK)
		return st;
	if (d->numa < 0)
		d->numa = te_plugin_gpu_sysfs_numa(d->pci);
	r = g->v->set_dev(g, d);
	if (r) {
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d (%s): %s: %s", g->v->name, g->v->kind, d->ordinal,
				    d->pci, g->v->fn_set_dev,
				    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	d->n_streams = g->streams_per_dev;
	d->streams = (struct te_plugin_gpu_stream *)calloc(d->n_streams, sizeof(*d->streams));
	if (!d->streams) {
		TE_PLUGIN_GPU_ERROR(g, "%s: out of memory", g->v->name);
		return TE_ERR_NOMEM;
	}
	for (uint32_t i = 0; i < d->n_streams; i++) {
		d->streams[i].dev = d;
		st = te_plugin_gpu_stream_init_(g, &d->streams[i]);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

/* Enable peer access between every pair of GPUs that allows it. */
static inline void te_plugin_gpu_peers_enable_(struct te_plugin_gpu *g)
{
	char cs[128];

	for (uint32_t i = 0; i < g->n_devs; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];

		for (uint32_t j = 0; j < g->n_devs; j++) {
			int can = 0, r;

			if (i == j || g->v->can_access_peer(g, d, &g->devs[j], &can) || !can)
				continue;
			if (g->v->set_dev(g, d))
				continue;
			r = g->v->enable_peer(g, d, &g->devs[j]);
			if (!r)
				d->peers |= 1ull << j;
			else
				g->host->log(g->ctx, TE_PLUGIN_LOG_WARN, "%s:%u -> %s:%u: %s: %s",
					     g->v->kind, i, g->v->kind, j, g->v->fn_enable_peer,
					     te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		}
	}
}

/* --- the wait helper ------------------------------------------------------------------------- */

/* The in-flight stream whose oldest copy was launched first, or NULL. */
static inline struct te_plugin_gpu_stream *te_plugin_gpu_oldest_(struct te_plugin_gpu *g,
								 uint32_t *slot_out)
{
	struct te_plugin_gpu_stream *best = NULL;
	uint64_t best_seq = UINT64_MAX;

	for (uint32_t i = 0; i < g->n_devs; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];

		if (__atomic_load_n(&d->failed, __ATOMIC_RELAXED))
			continue;
		for (uint32_t k = 0; k < d->n_streams; k++) {
			struct te_plugin_gpu_stream *st = &d->streams[k];
			uint32_t head;

			if (!__atomic_load_n(&st->count, __ATOMIC_ACQUIRE))
				continue;
			if (pthread_mutex_trylock(&st->lock) != 0)
				continue;
			head = st->head;
			if (__atomic_load_n(&st->count, __ATOMIC_RELAXED) &&
			    st->seq[head] < best_seq) {
				best_seq = st->seq[head];
				best = st;
				*slot_out = st->gend[head];
			}
			pthread_mutex_unlock(&st->lock);
		}
	}
	return best;
}

/*
 * Sleeps until a thread waits in te_plugin_gpu_wait, then blocks in event_sync on the oldest
 * copy's event and wakes the waiters. The event may be recorded again meanwhile (its slice
 * completed and the slot was reused): then it waits for a later copy, which the waiters'
 * timeouts bound. Events live until fini, which stops this thread first.
 */
static inline void *te_plugin_gpu_waiter_main_(void *arg)
{
	struct te_plugin_gpu *g = (struct te_plugin_gpu *)arg;
	struct te_plugin_gpu_waiter *w = &g->waiter;

	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		struct te_plugin_gpu_stream *st;
		uint32_t slot = 0;
		uint64_t gen = w->gen;

		if (!w->sleepers) {
			pthread_cond_wait(&w->kick, &w->lock);
			continue;
		}
		pthread_mutex_unlock(&w->lock);
		st = te_plugin_gpu_oldest_(g, &slot);
		if (st && g->v->set_dev(g, st->dev) == 0)
			(void)g->v->event_sync(g, st->ev[slot]);
		pthread_mutex_lock(&w->lock);
		if (w->gen == gen)
			w->gen++;
		pthread_cond_broadcast(&w->woke);
		/* Nothing to wait on: let the sleepers time out rather than spin. */
		if (!st && !w->stop && w->sleepers)
			pthread_cond_wait(&w->kick, &w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

static inline void te_plugin_gpu_waiter_stop_(struct te_plugin_gpu *g)
{
	struct te_plugin_gpu_waiter *w = &g->waiter;

	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->kick);
	pthread_cond_broadcast(&w->woke);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	w->started = false;
}

/* --- registrations, peers, keys ------------------------------------------------------------ */

/* Drop a reference on @imp; the last unmaps it (under imp_lock). */
static inline void te_plugin_gpu_import_put_(struct te_plugin_gpu *g,
					     struct te_plugin_gpu_import *imp)
{
	struct te_plugin_gpu_dev *d;

	if (--imp->refs > 0)
		return;
	for (struct te_plugin_gpu_import **pp = &g->imports; *pp; pp = &(*pp)->next) {
		if (*pp == imp) {
			*pp = imp->next;
			break;
		}
	}
	d = te_plugin_gpu_dev_get(g, imp->copy_dev);
	if (d)
		(void)g->v->set_dev(g, d);
	g->v->unimport(g, imp);
	free(imp);
}

static inline enum te_status te_plugin_gpu_dereg_mem(struct te_plugin_inst *inst,
						     struct te_plugin_mem *mem)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_mem *m = (struct te_plugin_gpu_mem *)mem;

	if (!m)
		return TE_OK;
	te_plugin_gpu_link_del(g, &m->link);
	if (m->pinned && g->n_devs) {
		(void)g->v->set_dev(g, &g->devs[0]);
		g->v->host_unregister(g, m->addr);
	}
	if (m->key.kind == TE_PLUGIN_GPU_KEY_FD)
		te_plugin_gpu_export_remove(&g->sock, m->key.export_id);
	free(m);
	return TE_OK;
}

static inline void te_plugin_gpu_unload_peer(struct te_plugin_inst *inst,
					     struct te_plugin_peer *peer)
{
	struct te_plugin_gpu_peer *p = (struct te_plugin_gpu_peer *)peer;

	/* Imports belong to the keys (released before their peer); nothing else is held. */
	if (!p)
		return;
	te_plugin_gpu_link_del(te_plugin_gpu_of(inst), &p->link);
	free(p);
}

static inline void te_plugin_gpu_release_remote_key(struct te_plugin_inst *inst,
						    struct te_plugin_rkey *rkey)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_rkey *rk = (struct te_plugin_gpu_rkey *)rkey;

	if (!rk)
		return;
	te_plugin_gpu_link_del(g, &rk->link);
	if (rk->imp) {
		pthread_mutex_lock(&g->imp_lock);
		te_plugin_gpu_import_put_(g, rk->imp);
		pthread_mutex_unlock(&g->imp_lock);
	}
	free(rk);
}

/* --- init and fini --------------------------------------------------------------------------- */

/* Hand back every launched slice once its copy ended (the streams synchronized), canceled. */
static inline void te_plugin_gpu_drain_(struct te_plugin_gpu *g)
{
	for (uint32_t i = 0; g->devs && i < g->n_devs; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];

		for (uint32_t k = 0; d->streams && k < d->n_streams; k++) {
			struct te_plugin_gpu_stream *st = &d->streams[k];

			if (!st->s)
				continue;
			if (g->v->set_dev(g, d) == 0)
				(void)g->v->stream_sync(g, st->s);
			while (__atomic_load_n(&st->count, __ATOMIC_ACQUIRE)) {
				struct te_plugin_slice *s =
					__atomic_load_n(&st->ring[st->head], __ATOMIC_ACQUIRE);
				char why[96];

				__atomic_store_n(&st->ring[st->head],
						 (struct te_plugin_slice *)NULL, __ATOMIC_RELAXED);
				st->head = (st->head + 1) % st->cap;
				__atomic_fetch_sub(&st->count, 1, __ATOMIC_RELEASE);
				te_plugin_gpu_fmt(
					why, sizeof(why),
					"%s: engine shutting down (the copy had run to its end)",
					g->v->name);
				g->host->slice_done(g->ctx, s, TE_ERR_CANCELED, 0, why);
			}
		}
	}
	for (uint32_t i = 0; i < g->n_defers; i++)
		g->host->slice_done(g->ctx, g->defers[i].s, g->defers[i].status, 0,
				    g->defers[i].text);
	free(g->defers);
	g->defers = NULL;
	g->n_defers = g->cap_defers = 0;
}

static inline void te_plugin_gpu_destroy_(struct te_plugin_gpu *g)
{
	char cs[128];

	te_plugin_gpu_waiter_stop_(g);
	te_plugin_gpu_sock_stop(&g->sock);
	/* Launched copies cannot be stopped: wait for them, then hand their slices back. */
	te_plugin_gpu_drain_(g);
	/* What the core did not release: keys, peers, registrations, imports, allocations. */
	while (g->rkeys.next != &g->rkeys)
		te_plugin_gpu_release_remote_key((struct te_plugin_inst *)g,
						 (struct te_plugin_rkey *)g->rkeys.next);
	while (g->peers.next != &g->peers)
		te_plugin_gpu_unload_peer((struct te_plugin_inst *)g,
					  (struct te_plugin_peer *)g->peers.next);
	while (g->mems.next != &g->mems)
		(void)te_plugin_gpu_dereg_mem((struct te_plugin_inst *)g,
					      (struct te_plugin_mem *)g->mems.next);
	while (g->imports) {
		g->imports->refs = 1;
		te_plugin_gpu_import_put_(g, g->imports);
	}
	te_plugin_gpu_sock_fini(&g->sock);
	while (g->allocs) {
		struct te_plugin_gpu_alloc *a = g->allocs;
		struct te_plugin_gpu_dev *d = te_plugin_gpu_dev_get(g, a->dev);
		int r = -1;

		g->allocs = a->next;
		if (d && (r = g->v->set_dev(g, d)) == 0)
			r = g->v->free(g, d, a->ptr, a->size, a->flavor);
		if (r)
			g->host->log(g->ctx, TE_PLUGIN_LOG_WARN,
				     "freeing leftover %s:%d memory %p: %s", g->v->kind, a->dev,
				     a->ptr, te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		free(a);
	}
	for (uint32_t i = 0; g->devs && i < g->n_devs; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];

		for (uint32_t k = 0; d->streams && k < d->n_streams; k++) {
			struct te_plugin_gpu_stream *st = &d->streams[k];

			(void)g->v->set_dev(g, d);
			for (uint32_t e = 0; st->ev && e < st->cap; e++)
				if (st->ev[e])
					g->v->event_destroy(g, d, st->ev[e]);
			if (st->s)
				g->v->stream_destroy(g, d, st->s);
			free(st->ev);
			free(st->ring);
			free(st->seq);
			free(st->gend);
			pthread_mutex_destroy(&st->lock);
		}
		free(d->streams);
		if (g->v->dev_close)
			g->v->dev_close(g, d);
		pthread_mutex_destroy(&d->fail_lock);
	}
	if (g->v->close)
		g->v->close(g);
	free(g->devs);
	pthread_cond_destroy(&g->waiter.kick);
	pthread_cond_destroy(&g->waiter.woke);
	pthread_mutex_destroy(&g->waiter.lock);
	pthread_mutex_destroy(&g->defer_lock);
	pthread_mutex_destroy(&g->imp_lock);
	pthread_mutex_destroy(&g->alloc_lock);
	pthread_mutex_destroy(&g->obj_lock);
	if (g->dl)
		dlclose(g->dl); /* RTLD_NODELETE: the runtime stays mapped, as runtimes must */
	free(g);
}

/*
 * The common options (declared: TE_PLUGIN_GPU_OPTIONS_COMMON; the core checked them and
 * filled in their defaults), then the vendor's.
 */
static inline enum te_status te_plugin_gpu_options_(struct te_plugin_gpu *g)
{
	const struct te_plugin_gpu_vendor *v = g->v;
	const struct te_plugin_host *h = g->host;
	enum te_status st;

	st = te_plugin_gpu_opt_path(h, g->ctx, v->name, "library", NULL, g->library,
				    sizeof(g->library));
	if (st != TE_OK)
		return st;
	g->streams_per_dev = (uint32_t)te_plugin_opt_int(h, g->ctx, "streams", 4);
	g->window = (uint32_t)te_plugin_opt_int(h, g->ctx, "window", 256);
	g->slice_size = te_plugin_opt_size(h, g->ctx, "slice_size", TE_PLUGIN_GPU_DEF_SLICE);
	g->pin_host = te_plugin_opt_bool(h, g->ctx, "pin_host", true);
	/* Only plugins that share file descriptors declare it (TE_PLUGIN_GPU_OPTION_FETCH_TIMEOUT). */
	g->fetch_timeout_ms = (uint32_t)te_plugin_opt_int(h, g->ctx, "fetch_timeout_ms", 5000);
	return v->options ? v->options(g) : TE_OK;
}

/* dlopen the runtime (option library, else the vendor's names) and check its version. */
static inline enum te_status te_plugin_gpu_runtime_(struct te_plugin_gpu *g)
{
	const struct te_plugin_gpu_vendor *v = g->v;
	const char *one[1];
	const char *const *names = v->libraries;
	size_t n = v->n_libraries;
	char why[384], list[256], have[32], need[32];
	enum te_status st;

	if (g->library[0]) {
		one[0] = g->library;
		names = one;
		n = 1;
	}
	g->dl = te_plugin_gpu_dlopen(names, n, &g->dl_name, why, sizeof(why));
	if (!g->dl) {
		TE_PLUGIN_GPU_ERROR(g, "%s: no %s: cannot load %s: %s", v->name, v->runtime,
				    te_plugin_join(names, n, list, sizeof(list)), why);
		return TE_ERR_NO_DEVICE;
	}
	st = v->version(g, &g->version);
	if (st != TE_OK)
		return st;
	if (g->version < v->min_version) {
		v->version_str(g->version, have, sizeof(have));
		v->version_str(v->min_version, need, sizeof(need));
		TE_PLUGIN_GPU_ERROR(
			g, "%s: the %s %s is version %s (%d); %s needs %s (%d) or newer", v->name,
			v->runtime, g->dl_name, have, g->version, v->name, need, v->min_version);
		return TE_ERR_NO_DEVICE;
	}
	return TE_OK;
}

/* One line on what the instance found (info level). */
static inline void te_plugin_gpu_log_ready_(struct te_plugin_gpu *g)
{
	char list[512], head[160], tail[96];
	size_t at = 0;

	head[0] = tail[0] = '\0';
	list[0] = '\0';
	g->v->describe(g, head, sizeof(head), tail, sizeof(tail));
	for (uint32_t i = 0; i < g->n_devs && at < sizeof(list); i++) {
		const struct te_plugin_gpu_dev *d = &g->devs[i];
		int k = te_plugin_gpu_fmt(list + at, sizeof(list) - at,
					  "%s%s:%u %s (%s, NUMA %d, peers 0x%" PRIx64 ")",
					  i ? "; " : "", g->v->kind, i, d->gpu, d->pci, d->numa,
					  d->peers);

		if (k < 0)
			break;
		at += (size_t)k;
	}
	g->host->log(g->ctx, TE_PLUGIN_LOG_INFO, "%s; %u GPU(s): %s%s%s%s%s", head, g->n_devs, list,
		     tail, g->sock.started ? "; fd socket @" : "",
		     g->sock.started ? g->sock.name : "",
		     g->sock.started && g->auth ? " (authenticated)" : "");
}

/*
 * The init op of a GPU plugin: a zeroed instance of @size bytes (the vendor's, starting with
 * struct te_plugin_gpu) set up as the header comment says, or a status with set_error.
 */
static inline enum te_status te_plugin_gpu_init(const struct te_plugin_host *host,
						struct te_plugin_host_ctx *ctx,
						const struct te_plugin_gpu_vendor *v, size_t size,
						struct te_plugin_inst **inst_out)
{
	struct te_plugin_gpu *g;
	pthread_condattr_t ca;
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
	uint32_t count = 0;
	enum te_status st;

	if (!host || host->abi_major != TE_PLUGIN_ABI_MAJOR ||
	    !TE_PLUGIN_HAS(host, struct te_plugin_host, mem_dmabuf) ||
	    size < sizeof(struct te_plugin_gpu))
		return TE_ERR_ABI_MISMATCH;
	g = (struct te_plugin_gpu *)calloc(1, size);
	if (!g)
		return TE_ERR_NOMEM;
	g->host = host;
	g->ctx = ctx;
	g->v = v;
	pthread_mutex_init(&g->defer_lock, NULL);
	pthread_mutex_init(&g->imp_lock, NULL);
	pthread_mutex_init(&g->alloc_lock, NULL);
	pthread_mutex_init(&g->obj_lock, NULL);
	g->mems.next = g->mems.prev = &g->mems;
	g->peers.next = g->peers.prev = &g->peers;
	g->rkeys.next = g->rkeys.prev = &g->rkeys;
	pthread_mutex_init(&g->waiter.lock, NULL);
	pthread_cond_init(&g->waiter.kick, NULL);
	/* te_plugin_gpu_wait's deadline is on the monotonic clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->waiter.woke, &ca);
	pthread_condattr_destroy(&ca);
	te_plugin_gpu_sock_init(&g->sock, host, ctx, v->name, 0, false);
	st = te_plugin_gpu_options_(g);
	if (st == TE_OK)
		st = te_plugin_gpu_runtime_(g);
	if (st == TE_OK)
		st = v->open(g, &count);
	if (st != TE_OK)
		goto err;
	g->n_devs = count > TE_PLUGIN_GPU_MAX_DEV ? TE_PLUGIN_GPU_MAX_DEV : count;
	g->devs = (struct te_plugin_gpu_dev *)calloc(g->n_devs, sizeof(*g->devs));
	if (!g->devs) {
		g->n_devs = 0;
		st = TE_ERR_NOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < g->n_devs; i++) {
		g->devs[i].ordinal = (int)i;
		g->devs[i].numa = -1;
		pthread_mutex_init(&g->devs[i].fail_lock, NULL);
	}
	for (uint32_t i = 0; i < g->n_devs; i++) {
		st = te_plugin_gpu_dev_open_(g, &g->devs[i]);
		if (st != TE_OK)
			goto err;
	}
	te_plugin_gpu_peers_enable_(g);
	/* Identity: peers tell process, host and liveness from it. */
	g->blob.magic = v->blob_magic;
	g->blob.version = TE_PLUGIN_GPU_WIRE_VERSION;
	g->blob.flags = g->fabric ? TE_PLUGIN_GPU_BLOB_FABRIC : 0u;
	te_plugin_gpu_ident_self(&g->blob.id);
	g->auth = host->auth_mac(ctx, "probe", 5, mac) == TE_OK;
	g->sock.nonce = g->blob.id.nonce;
	g->sock.auth = g->auth;
	if (g->fds) {
		st = te_plugin_gpu_sock_start(&g->sock);
		if (st != TE_OK)
			goto err;
	}
	if (pthread_create(&g->waiter.thread, NULL, te_plugin_gpu_waiter_main_, g) != 0) {
		TE_PLUGIN_GPU_ERROR(g, "%s: cannot start the wait helper", v->name);
		st = TE_ERR_SYSTEM;
		goto err;
	}
	g->waiter.started = true;
	st = host->publish(ctx, &g->blob, sizeof(g->blob));
	if (st != TE_OK) {
		TE_PLUGIN_GPU_ERROR(g, "%s: publish: %d", v->name, (int)st);
		goto err;
	}
	te_plugin_gpu_log_ready_(g);
	*inst_out = (struct te_plugin_inst *)g;
	return TE_OK;
err:
	te_plugin_gpu_destroy_(g);
	return st;
}

static inline void te_plugin_gpu_fini(struct te_plugin_inst *inst)
{
	te_plugin_gpu_destroy_(te_plugin_gpu_of(inst));
}

static inline enum te_status te_plugin_gpu_query_caps(struct te_plugin_inst *inst,
						      struct te_plugin_caps *caps)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);

	caps->mem_types = TE_PLUGIN_MEM_CPU | g->v->mem_type;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_MANUAL;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	/* FABRIC handles reach GPUs of other hosts; nothing else does. */
	/* A GPU copies its own memory: devices are not interchangeable rails. */
	caps->flags = (g->fabric ? 0 : TE_PLUGIN_CAP_SAME_HOST_ONLY) | TE_PLUGIN_CAP_FIXED_DEVICES;
	caps->max_slice_size = 0;
	caps->default_slice_size = g->slice_size;
	caps->slice_priv_size = 0;
	caps->max_devices = g->n_devs;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, owned_mem_types))
		caps->owned_mem_types = g->v->mem_type;
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_query_devices(struct te_plugin_inst *inst,
							 struct te_plugin_device *devices,
							 uint32_t max, uint32_t *n_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	uint32_t n = g->n_devs < max ? g->n_devs : max;

	for (uint32_t i = 0; i < n; i++) {
		const struct te_plugin_gpu_dev *d = &g->devs[i];

		te_plugin_gpu_fmt(devices[i].name, sizeof(devices[i].name), "%s:%u %s", g->v->kind,
				  i, d->gpu);
		devices[i].numa_node = d->numa;
		te_plugin_gpu_fmt(devices[i].pci, sizeof(devices[i].pci), "%s", d->pci);
		devices[i].link_speed_mbps = 0;
		devices[i].mem_types = g->v->mem_type | TE_PLUGIN_MEM_CPU;
	}
	*n_out = n;
	return TE_OK;
}

/* --- memory kinds (the owner ops) ---------------------------------------------------------- */

/* Whether [@addr, +@len) of @pi runs past the end of its allocation. */
static inline bool te_plugin_gpu_past_end_(uintptr_t addr, uint64_t len,
					   const struct te_plugin_gpu_ptr *pi)
{
	return addr < pi->base || len > pi->size || addr - pi->base > pi->size - len;
}

static inline enum te_status te_plugin_gpu_mem_query(struct te_plugin_inst *inst, const void *addr,
						     uint64_t len, uint32_t *mem_type_out,
						     int32_t *dev_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_ptr pi;

	memset(&pi, 0, sizeof(pi));
	if (g->v->ptr_info(g, addr, &pi) || !pi.device || pi.dev < 0)
		return TE_ERR_NOT_FOUND;
	if (te_plugin_gpu_past_end_((uintptr_t)addr, len, &pi)) {
		TE_PLUGIN_GPU_ERROR(g,
				    "%s: [%p, +%" PRIu64 ") runs past the end of its %s:%d "
				    "allocation [0x%llx, +%zu)",
				    g->v->name, addr, len, g->v->kind, pi.dev,
				    (unsigned long long)pi.base, pi.size);
		return TE_ERR_OUT_OF_RANGE;
	}
	*mem_type_out = g->v->mem_type;
	*dev_out = pi.dev;
	return TE_OK;
}

/* The device @dev of kind @mem_type for an owner op, or NULL with set_error and *st. */
static inline struct te_plugin_gpu_dev *te_plugin_gpu_owner_dev_(struct te_plugin_gpu *g,
								 const char *op, uint32_t mem_type,
								 int32_t dev, enum te_status *st)
{
	struct te_plugin_gpu_dev *d = te_plugin_gpu_dev_get(g, dev);
	char why[TE_PLUGIN_GPU_DETAIL];

	if (mem_type != g->v->mem_type) {
		TE_PLUGIN_GPU_ERROR(g, "%s: %s: only %s memory", g->v->name, op, g->v->kind);
		*st = TE_ERR_MEMORY_TYPE;
		return NULL;
	}
	if (!d) {
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: no such %s device (%u visible: %s:0..%u)",
				    g->v->name, g->v->kind, dev, g->v->api, g->n_devs, g->v->kind,
				    g->n_devs - 1);
		*st = TE_ERR_NO_DEVICE;
		return NULL;
	}
	if (te_plugin_gpu_dev_failed(d, why, sizeof(why))) {
		TE_PLUGIN_GPU_ERROR(g, "%s", why);
		*st = TE_ERR_DEVICE_FAILED;
		return NULL;
	}
	return d;
}

static inline enum te_status te_plugin_gpu_mem_copy(struct te_plugin_inst *inst, void *dst,
						    const void *src, uint64_t len,
						    uint32_t mem_type, int32_t dev,
						    enum te_plugin_copy_dir dir)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	enum te_status st = TE_OK;
	struct te_plugin_gpu_dev *d = te_plugin_gpu_owner_dev_(g, "mem_copy", mem_type, dev, &st);
	char cs[128];
	int r;

	if (!d)
		return st;
	r = g->v->set_dev(g, d);
	if (!r)
		r = g->v->copy(g, dst, src, (size_t)len, dir);
	if (!r)
		return TE_OK;
	if (g->v->sticky(r))
		te_plugin_gpu_dev_fail(g, d, g->v->fn_copy, r);
	TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: %s of %" PRIu64 " bytes %s: %s", g->v->name, g->v->kind,
			    dev, g->v->fn_copy, len,
			    dir == TE_PLUGIN_COPY_TO_HOST ? "to host" : "from host",
			    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
	return g->v->status(r);
}

static inline enum te_status te_plugin_gpu_mem_dmabuf(struct te_plugin_inst *inst, const void *addr,
						      uint64_t len, int *fd_out,
						      uint64_t *offset_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_ptr pi;
	struct te_plugin_gpu_dev *d = NULL;
	uintptr_t start, end;
	char cs[128];
	int fd = -1, r;

	memset(&pi, 0, sizeof(pi));
	if (g->v->ptr_info(g, addr, &pi) || !pi.device || !(d = te_plugin_gpu_dev_get(g, pi.dev))) {
		TE_PLUGIN_GPU_ERROR(g, "%s: mem_dmabuf: %p is not %s device memory", g->v->name,
				    addr, g->v->api);
		return TE_ERR_INVALID_ARG;
	}
	if (!d->dmabuf || !g->v->dmabuf) {
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d (%s): the runtime offers no dma-buf export",
				    g->v->name, g->v->kind, pi.dev, d->pci);
		return TE_ERR_UNSUPPORTED;
	}
	start = (uintptr_t)addr & ~(uintptr_t)(TE_PLUGIN_GPU_PAGE - 1);
	end = ((uintptr_t)addr + (uintptr_t)len + TE_PLUGIN_GPU_PAGE - 1) &
	      ~(uintptr_t)(TE_PLUGIN_GPU_PAGE - 1);
	r = g->v->set_dev(g, d);
	if (!r)
		r = g->v->dmabuf(g, d, start, end - start, &fd);
	if (r) {
		enum te_status st = g->v->status(r);

		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: %s([0x%lx, +%lu)): %s", g->v->name, g->v->kind,
				    pi.dev, g->v->fn_dmabuf, (unsigned long)start,
				    (unsigned long)(end - start),
				    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		return st;
	}
	*fd_out = fd;
	*offset_out = (uintptr_t)addr - start;
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type,
						     int32_t dev, uint64_t len, void **ptr_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	enum te_status st = TE_OK;
	struct te_plugin_gpu_dev *d = te_plugin_gpu_owner_dev_(g, "mem_alloc", mem_type, dev, &st);
	struct te_plugin_gpu_alloc *a;
	const char *step = "";
	char cs[128];
	int r;

	if (!d)
		return st;
	a = (struct te_plugin_gpu_alloc *)calloc(1, sizeof(*a));
	if (!a)
		return TE_ERR_NOMEM;
	r = g->v->set_dev(g, d);
	if (r)
		step = g->v->fn_set_dev;
	else
		r = g->v->alloc(g, d, len, &a->ptr, &a->size, &a->flavor, &step);
	if (r) {
		free(a);
		if (g->v->sticky(r))
			te_plugin_gpu_dev_fail(g, d, step, r);
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d (%s): %s of %" PRIu64 " bytes: %s", g->v->name,
				    g->v->kind, dev, d->pci, step, len,
				    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		return g->v->status(r);
	}
	a->dev = dev;
	pthread_mutex_lock(&g->alloc_lock);
	a->next = g->allocs;
	g->allocs = a;
	pthread_mutex_unlock(&g->alloc_lock);
	*ptr_out = a->ptr;
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_alloc *a = NULL;
	struct te_plugin_gpu_dev *d;
	char cs[128];
	int r;

	pthread_mutex_lock(&g->alloc_lock);
	for (struct te_plugin_gpu_alloc **pa = &g->allocs; *pa; pa = &(*pa)->next) {
		if ((*pa)->ptr == ptr) {
			a = *pa;
			*pa = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&g->alloc_lock);
	if (!a) {
		TE_PLUGIN_GPU_ERROR(g, "%s: mem_free: %p did not come from mem_alloc", g->v->name,
				    ptr);
		return TE_ERR_NOT_FOUND;
	}
	d = &g->devs[a->dev];
	r = g->v->set_dev(g, d);
	if (!r)
		r = g->v->free(g, d, a->ptr, a->size, a->flavor);
	free(a);
	if (r) {
		TE_PLUGIN_GPU_ERROR(g, "%s: %s:%d: freeing %p: %s", g->v->name, g->v->kind,
				    d->ordinal, ptr, te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		return g->v->status(r);
	}
	return TE_OK;
}

/* --- registration and keys ------------------------------------------------------------------- */

/* Host memory: the local side only; pinned for the GPUs when pin_host. */
static inline void te_plugin_gpu_pin_(struct te_plugin_gpu *g, struct te_plugin_gpu_mem *m)
{
	char cs[128];
	int r;

	if (!g->pin_host || !g->n_devs)
		return;
	r = g->v->set_dev(g, &g->devs[0]);
	if (!r)
		r = g->v->host_register(g, m->addr, m->length);
	if (!r)
		m->pinned = true;
	else if (r != g->v->host_registered)
		g->host->log(g->ctx, TE_PLUGIN_LOG_INFO,
			     "%s([%p, +%" PRIu64 ")): %s; copies use it pageable (slower)",
			     g->v->fn_host_register, m->addr, m->length,
			     te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
}

/* Check @m (GPU memory at @d) against what the runtime says; fill its key and export it. */
static inline enum te_status te_plugin_gpu_reg_device_(struct te_plugin_gpu *g,
						       struct te_plugin_gpu_mem *m,
						       struct te_plugin_gpu_dev *d)
{
	const struct te_plugin_gpu_vendor *v = g->v;
	struct te_plugin_gpu_ptr pi;
	char cs[128];
	int r;

	memset(&pi, 0, sizeof(pi));
	r = v->ptr_info(g, m->addr, &pi);
	if (r || !pi.device || pi.dev != m->dev) {
		TE_PLUGIN_GPU_ERROR(
			g, "%s: region [%p, +%" PRIu64 ") is not memory of %s:%d (%s)%s%s", v->name,
			m->addr, m->length, v->kind, m->dev, d->pci, r ? ": " : "",
			r ? te_plugin_gpu_strerror(g, r, cs, sizeof(cs)) : "");
		return TE_ERR_MEMORY_TYPE;
	}
	if (te_plugin_gpu_past_end_((uintptr_t)m->addr, m->length, &pi)) {
		TE_PLUGIN_GPU_ERROR(g,
				    "%s: region [%p, +%" PRIu64
				    ") on %s:%d (%s) crosses the end of "
				    "its allocation [0x%llx, +%zu)",
				    v->name, m->addr, m->length, v->kind, m->dev, d->pci,
				    (unsigned long long)pi.base, pi.size);
		return TE_ERR_OUT_OF_RANGE;
	}
	m->key.magic = v->key_magic;
	m->key.version = TE_PLUGIN_GPU_WIRE_VERSION;
	m->key.access = (uint8_t)m->access;
	m->key.dev = m->dev;
	m->key.addr = (uint64_t)(uintptr_t)m->addr;
	m->key.length = m->length;
	m->key.alloc_base = pi.base;
	m->key.alloc_size = pi.size;
	te_plugin_gpu_fmt(m->key.pci, sizeof(m->key.pci), "%s", d->pci);
	m->key.kind = TE_PLUGIN_GPU_KEY_NONE;
	if (!(m->access & (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)))
		return TE_OK;
	if (pi.ipc) {
		r = v->ipc_get(g, pi.base, m->key.handle);
		if (r) {
			TE_PLUGIN_GPU_ERROR(
				g, "%s: region [%p, +%" PRIu64 ") on %s:%d (%s): %s: %s", v->name,
				m->addr, m->length, v->kind, m->dev, d->pci, v->fn_ipc_get,
				te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
			return v->status(r);
		}
		m->key.kind = TE_PLUGIN_GPU_KEY_IPC;
		return TE_OK;
	}
	if (v->export_other)
		return v->export_other(g, m, &pi, d);
	TE_PLUGIN_GPU_ERROR(g,
			    "%s: region [%p, +%" PRIu64 ") on %s:%d (%s) is not in memory %s IPC "
			    "handles can share: peers cannot map it",
			    v->name, m->addr, m->length, v->kind, m->dev, d->pci, v->api);
	return TE_ERR_MEMORY_TYPE;
}

static inline enum te_status te_plugin_gpu_reg_mem(struct te_plugin_inst *inst, void *addr,
						   uint64_t length, uint32_t mem_type, int32_t dev,
						   uint32_t access, struct te_plugin_mem **mem_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_mem *m;
	struct te_plugin_gpu_dev *d = NULL;
	enum te_status st = TE_OK;

	if (mem_type != TE_PLUGIN_MEM_CPU && mem_type != g->v->mem_type)
		return TE_ERR_MEMORY_TYPE;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(d = te_plugin_gpu_dev_get(g, dev))) {
		TE_PLUGIN_GPU_ERROR(g,
				    "%s: region [%p, +%" PRIu64 ") at %s:%d: no such %s device "
				    "(%u visible)",
				    g->v->name, addr, length, g->v->kind, dev, g->v->api,
				    g->n_devs);
		return TE_ERR_NO_DEVICE;
	}
	m = (struct te_plugin_gpu_mem *)calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = addr;
	m->length = length;
	m->type = mem_type;
	m->dev = dev;
	m->access = access;
	if (d)
		st = te_plugin_gpu_reg_device_(g, m, d);
	else
		te_plugin_gpu_pin_(g, m);
	if (st != TE_OK) {
		free(m);
		return st;
	}
	te_plugin_gpu_link_add(g, &g->mems, &m->link);
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_pack_key(struct te_plugin_inst *inst,
						    struct te_plugin_mem *mem, void *buf,
						    size_t cap, size_t *len_out)
{
	struct te_plugin_gpu_mem *m = (struct te_plugin_gpu_mem *)mem;

	(void)inst;
	if (m->type == TE_PLUGIN_MEM_CPU || m->key.kind == TE_PLUGIN_GPU_KEY_NONE) {
		*len_out = 0; /* host memory and local-only regions: a local side only */
		return TE_OK;
	}
	if (cap < sizeof(m->key))
		return TE_ERR_TOO_LARGE;
	memcpy(buf, &m->key, sizeof(m->key));
	*len_out = sizeof(m->key);
	return TE_OK;
}

/* --- peers ---------------------------------------------------------------------------------- */

static inline enum te_status te_plugin_gpu_load_peer(struct te_plugin_inst *inst,
						     const char *peer_name, const void *blob,
						     size_t len, struct te_plugin_peer **peer_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	const char *name = g->v->name;
	struct te_plugin_gpu_peer *p;
	struct te_plugin_gpu_blob b;
	enum te_plugin_gpu_where where;

	if (len != sizeof(b)) {
		TE_PLUGIN_GPU_ERROR(g, "%s: peer %s: blob of %zu bytes, expected %zu", name,
				    peer_name, len, sizeof(b));
		return TE_ERR_PROTOCOL;
	}
	memcpy(&b, blob, sizeof(b));
	if (b.magic != g->v->blob_magic || b.version != TE_PLUGIN_GPU_WIRE_VERSION) {
		TE_PLUGIN_GPU_ERROR(g, "%s: peer %s: not a %s blob of version %u", name, peer_name,
				    name, TE_PLUGIN_GPU_WIRE_VERSION);
		return TE_ERR_PROTOCOL;
	}
	where = te_plugin_gpu_ident_where(&g->blob.id, &b.id);
	if (where == TE_PLUGIN_GPU_OTHER_HOST &&
	    !(g->fabric && (b.flags & TE_PLUGIN_GPU_BLOB_FABRIC))) {
		if (g->v->description_fabric)
			TE_PLUGIN_GPU_ERROR(g,
					    "%s: peer %s is on another host, and %s %s (only they "
					    "reach GPUs of other hosts)",
					    name, peer_name,
					    !g->fabric ? "this driver offers no"
						       : "the peer offers no",
					    g->v->description_fabric);
		else
			TE_PLUGIN_GPU_ERROR(g,
					    "%s: peer %s is on another host: %s memory handles "
					    "reach processes of this host only",
					    name, peer_name, g->v->api);
		return TE_ERR_PEER_UNREACHABLE;
	}
	/* A process that is gone left only dead handles: say so now, not at the first copy. */
	if (where == TE_PLUGIN_GPU_GONE) {
		TE_PLUGIN_GPU_ERROR(g,
				    "%s: peer %s: process %" PRIu32 " of this host is gone: its %s "
				    "memory handles are dead",
				    name, peer_name, b.id.pid, g->v->api);
		return TE_ERR_PEER_UNREACHABLE;
	}
	p = (struct te_plugin_gpu_peer *)calloc(1, sizeof(*p));
	if (!p)
		return TE_ERR_NOMEM;
	te_plugin_gpu_fmt(p->name, sizeof(p->name), "%s", peer_name);
	p->blob = b;
	p->same_host = where != TE_PLUGIN_GPU_OTHER_HOST;
	p->same_process = where == TE_PLUGIN_GPU_SAME_PROCESS;
	te_plugin_gpu_link_add(g, &g->peers, &p->link);
	*peer_out = (struct te_plugin_peer *)p;
	return TE_OK;
}

/*
 * The mapping of the allocation @k names, from the cache or mapped now (under imp_lock).
 * TE_OK with a reference, or a status and @why naming the region, GPU and runtime text.
 */
static inline enum te_status te_plugin_gpu_import_get_(struct te_plugin_gpu *g,
						       const struct te_plugin_gpu_peer *peer,
						       const struct te_plugin_gpu_key *k,
						       struct te_plugin_gpu_import **out, char *why)
{
	const struct te_plugin_gpu_vendor *v = g->v;
	struct te_plugin_gpu_import *imp;
	const char *step = "";
	char cs[128], fwhy[TE_PLUGIN_GPU_DETAIL];
	uint64_t size = 0;
	int owner = te_plugin_gpu_dev_by_pci(g, k->pci), fd = -1, r;
	enum te_status st;

	for (imp = g->imports; imp; imp = imp->next) {
		if (imp->peer_nonce == peer->blob.id.nonce && imp->kind == k->kind &&
		    imp->alloc_base == k->alloc_base && imp->alloc_size == k->alloc_size) {
			imp->refs++;
			*out = imp;
			return TE_OK;
		}
	}
	imp = (struct te_plugin_gpu_import *)calloc(1, sizeof(*imp));
	if (!imp) {
		te_plugin_gpu_fmt(why, TE_PLUGIN_GPU_DETAIL, "%s: out of memory", v->name);
		return TE_ERR_NOMEM;
	}
	imp->refs = 1;
	imp->peer_nonce = peer->blob.id.nonce;
	imp->kind = k->kind;
	imp->alloc_base = k->alloc_base;
	imp->alloc_size = k->alloc_size;
	imp->owner = owner;
	/* A GPU not visible here (other host, CUDA_VISIBLE_DEVICES): GPU 0 copies. */
	imp->copy_dev = owner >= 0 ? owner : 0;
	imp->reach = owner >= 0	       ? te_plugin_gpu_reach_of(g, owner)
		     : g->n_devs >= 64 ? UINT64_MAX
				       : (1ull << g->n_devs) - 1;
	if (g->v->set_dev(g, &g->devs[imp->copy_dev])) {
		te_plugin_gpu_fmt(why, TE_PLUGIN_GPU_DETAIL, "%s: %s:%d: cannot make it current",
				  v->name, v->kind, imp->copy_dev);
		free(imp);
		return TE_ERR_DEVICE_FAILED;
	}
	if (k->kind == TE_PLUGIN_GPU_KEY_FD) {
		st = te_plugin_gpu_sock_fetch(&g->sock, peer->blob.id.pid, peer->blob.id.nonce,
					      k->export_id, g->fetch_timeout_ms, &fd, &size, fwhy,
					      sizeof(fwhy));
		if (st != TE_OK) {
			te_plugin_gpu_fmt(
				why, TE_PLUGIN_GPU_DETAIL,
				"%s: cannot map region [0x%llx, +%llu) of %s (%s:%d %s): %s",
				v->name, (unsigned long long)k->addr, (unsigned long long)k->length,
				peer->name, v->kind, k->dev, k->pci, fwhy);
			free(imp);
			return st;
		}
	}
	imp->map_size = (size_t)(size ? size : k->alloc_size);
	r = v->import(g, k, fd, imp, &step);
	if (fd >= 0)
		close(fd);
	if (r) {
		te_plugin_gpu_fmt(
			why, TE_PLUGIN_GPU_DETAIL,
			"%s: cannot map region [0x%llx, +%llu) of %s (%s:%d %s, pid %" PRIu32
			"): %s: %s",
			v->name, (unsigned long long)k->addr, (unsigned long long)k->length,
			peer->name, v->kind, k->dev, k->pci, peer->blob.id.pid, step,
			te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
		free(imp);
		return v->status(r) == TE_ERR_NOMEM ? TE_ERR_NOMEM : TE_ERR_PEER_UNREACHABLE;
	}
	imp->next = g->imports;
	g->imports = imp;
	*out = imp;
	return TE_OK;
}

static inline const char *te_plugin_gpu_kind_name_(unsigned kind)
{
	static const char *const names[] = { "none", "ipc", "fd", "fabric" };

	return kind < 4 ? names[kind] : "?";
}

static inline enum te_status te_plugin_gpu_unpack_remote_key(struct te_plugin_inst *inst,
							     struct te_plugin_peer *peer,
							     const void *blob, size_t len,
							     uint64_t addr, uint64_t length,
							     struct te_plugin_rkey **rkey_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_peer *p = (struct te_plugin_gpu_peer *)peer;
	const char *name = g->v->name;
	struct te_plugin_gpu_rkey *rk;
	struct te_plugin_gpu_key k;

	if (len != sizeof(k)) {
		TE_PLUGIN_GPU_ERROR(g, "%s: key of %zu bytes, expected %zu", name, len, sizeof(k));
		return TE_ERR_PROTOCOL;
	}
	memcpy(&k, blob, sizeof(k));
	k.pci[sizeof(k.pci) - 1] = '\0';
	if (k.magic != g->v->key_magic || k.version != TE_PLUGIN_GPU_WIRE_VERSION ||
	    k.kind < TE_PLUGIN_GPU_KEY_IPC || k.kind > TE_PLUGIN_GPU_KEY_FABRIC) {
		TE_PLUGIN_GPU_ERROR(g, "%s: not a %s key of version %u", name, name,
				    TE_PLUGIN_GPU_WIRE_VERSION);
		return TE_ERR_PROTOCOL;
	}
	if (k.addr != addr || k.length != length || k.addr < k.alloc_base ||
	    k.length > k.alloc_size || k.addr - k.alloc_base > k.alloc_size - k.length) {
		TE_PLUGIN_GPU_ERROR(g,
				    "%s: key of [0x%llx, +%llu) (allocation [0x%llx, +%llu)) does "
				    "not describe buffer [0x%llx, +%llu)",
				    name, (unsigned long long)k.addr, (unsigned long long)k.length,
				    (unsigned long long)k.alloc_base,
				    (unsigned long long)k.alloc_size, (unsigned long long)addr,
				    (unsigned long long)length);
		return TE_ERR_PROTOCOL;
	}
	rk = (struct te_plugin_gpu_rkey *)calloc(1, sizeof(*rk));
	if (!rk)
		return TE_ERR_NOMEM;
	rk->addr = addr;
	rk->length = length;
	rk->access = k.access;
	rk->exporter_dev = k.dev;
	te_plugin_gpu_fmt(rk->exporter_pci, sizeof(rk->exporter_pci), "%s", k.pci);
	if (p->same_process) {
		/* Its device pointers are valid here: no import. */
		int owner = te_plugin_gpu_dev_by_pci(g, k.pci);

		rk->local = addr;
		rk->copy_dev = owner >= 0 ? owner : k.dev;
		rk->reach = te_plugin_gpu_reach_of(g, rk->copy_dev);
	} else if (!p->same_host && k.kind != TE_PLUGIN_GPU_KEY_FABRIC) {
		rk->broken = TE_ERR_PEER_UNREACHABLE;
		te_plugin_gpu_fmt(
			rk->why, sizeof(rk->why),
			"%s: region [0x%llx, +%llu) of %s (%s:%d %s) is on another host and has "
			"no FABRIC handle (%s)",
			name, (unsigned long long)addr, (unsigned long long)length, p->name,
			g->v->kind, k.dev, k.pci, te_plugin_gpu_kind_name_(k.kind));
	} else {
		pthread_mutex_lock(&g->imp_lock);
		rk->broken = te_plugin_gpu_import_get_(g, p, &k, &rk->imp, rk->why);
		pthread_mutex_unlock(&g->imp_lock);
		if (rk->broken == TE_OK) {
			rk->local = rk->imp->local + (addr - k.alloc_base);
			rk->copy_dev = rk->imp->copy_dev;
			rk->reach = rk->imp->reach;
		} else {
			rk->imp = NULL;
		}
	}
	if (rk->broken != TE_OK)
		/* Kept: every slice to this region fails with the reason, which names it. */
		te_plugin_gpu_log_detail(g->host, g->ctx, name, TE_PLUGIN_LOG_WARN, rk->why);
	te_plugin_gpu_link_add(g, &g->rkeys, &rk->link);
	*rkey_out = (struct te_plugin_rkey *)rk;
	return TE_OK;
}

/* --- data path ------------------------------------------------------------------------------ */

/* Queue @s to fail with @status and the text @fmt: progress reports it (never submit). */
static inline void te_plugin_gpu_defer(struct te_plugin_gpu *g, struct te_plugin_slice *s,
				       enum te_status status, const char *fmt, ...)
	TE_PLUGIN_PRINTF(4, 5);
static inline void te_plugin_gpu_defer(struct te_plugin_gpu *g, struct te_plugin_slice *s,
				       enum te_status status, const char *fmt, ...)
{
	struct te_plugin_gpu_failed *f;
	va_list ap;

	pthread_mutex_lock(&g->defer_lock);
	if (g->n_defers == g->cap_defers) {
		uint32_t cap = g->cap_defers ? 2 * g->cap_defers : 64;
		struct te_plugin_gpu_failed *n = (struct te_plugin_gpu_failed *)realloc(
			g->defers, cap * sizeof(struct te_plugin_gpu_failed));

		if (!n) {
			/* Out of memory on a failure path: report now (the caller holds no lock). */
			pthread_mutex_unlock(&g->defer_lock);
			g->host->slice_done(g->ctx, s, status, 0,
					    "out of memory (and a failure to report)");
			return;
		}
		g->defers = n;
		g->cap_defers = cap;
	}
	f = &g->defers[g->n_defers++];
	f->s = s;
	f->status = status;
	va_start(ap, fmt);
	vsnprintf(f->text, sizeof(f->text), fmt, ap);
	va_end(ap);
	__atomic_fetch_add(&g->n_defer, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&g->defer_lock);
}

static inline uint32_t te_plugin_gpu_flush_deferred_(struct te_plugin_gpu *g)
{
	struct te_plugin_gpu_failed batch[16];
	uint32_t total = 0, n;

	while (__atomic_load_n(&g->n_defer, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&g->defer_lock);
		n = g->n_defers < 16 ? g->n_defers : 16;
		memcpy(batch, g->defers, n * sizeof(batch[0]));
		memmove(g->defers, g->defers + n, (g->n_defers - n) * sizeof(batch[0]));
		g->n_defers -= n;
		/* relaxed: n_defer is only a hint read without the lock */
		__atomic_store_n(&g->n_defer, g->n_defers, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&g->defer_lock);
		/* Reported outside the lock: slice_done may submit again (a retry). */
		for (uint32_t i = 0; i < n; i++)
			g->host->slice_done(g->ctx, batch[i].s, batch[i].status, 0, batch[i].text);
		total += n;
	}
	return total;
}

/* A stream of @d with room, locked; NULL when every ring is full (back-pressure). */
static inline struct te_plugin_gpu_stream *te_plugin_gpu_stream_take_(struct te_plugin_gpu_dev *d)
{
	/* relaxed: round robin needs no order */
	uint32_t start = __atomic_fetch_add(&d->rr, 1, __ATOMIC_RELAXED) % d->n_streams;
	struct te_plugin_gpu_stream *st;

	for (uint32_t k = 0; k < d->n_streams; k++) {
		st = &d->streams[(start + k) % d->n_streams];
		if (pthread_mutex_trylock(&st->lock) != 0)
			continue;
		if (__atomic_load_n(&st->count, __ATOMIC_RELAXED) < st->cap)
			return st;
		pthread_mutex_unlock(&st->lock);
	}
	/* All busy or full: wait for the first one's lock rather than give up at once. */
	st = &d->streams[start];
	pthread_mutex_lock(&st->lock);
	if (__atomic_load_n(&st->count, __ATOMIC_RELAXED) < st->cap)
		return st;
	pthread_mutex_unlock(&st->lock);
	return NULL;
}

/* Slices launched back to back on one stream: one event recorded after the last. */
struct te_plugin_gpu_group_ {
	struct te_plugin_gpu_stream *st; /* locked while the group is open */
	struct te_plugin_gpu_dev *d;
	uint32_t first; /* slot of its first slice */
	uint32_t n;
	uint64_t bytes;
};

/* Record the group's event and let progress see it; unlocks its stream. */
static inline void te_plugin_gpu_group_close_(struct te_plugin_gpu *g,
					      struct te_plugin_gpu_group_ *grp)
{
	struct te_plugin_gpu_stream *st = grp->st;
	uint32_t last;
	int r;

	if (!st)
		return;
	if (grp->n) {
		last = (grp->first + grp->n - 1) % st->cap;
		r = g->v->event_record(g, st->ev[last], st->s);
		if (r && !g->v->sticky(r)) {
			/* Launched but not tracked: wait for the copies here (rare), then try again. */
			int sr = g->v->stream_sync(g, st->s);

			r = sr ? sr : g->v->event_record(g, st->ev[last], st->s);
		}
		/* Still failing: the device is lost; progress fails whatever its rings hold. */
		if (r)
			te_plugin_gpu_dev_fail(g, grp->d, g->v->fn_event_record, r);
		for (uint32_t k = 0; k < grp->n; k++)
			st->gend[(grp->first + k) % st->cap] = last;
		__atomic_fetch_add(&st->count, grp->n, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&st->lock);
	grp->st = NULL;
	grp->d = NULL;
	grp->n = 0;
	grp->bytes = 0;
}

/* Check @s and find the GPU that copies it; NULL when it was queued to fail instead. */
static inline struct te_plugin_gpu_dev *
te_plugin_gpu_route_(struct te_plugin_gpu *g, struct te_plugin_slice *s, uintptr_t *remote_out)
{
	const struct te_plugin_gpu_rkey *rk = (const struct te_plugin_gpu_rkey *)s->rkey;
	const struct te_plugin_gpu_mem *m = (const struct te_plugin_gpu_mem *)s->local_mem;
	const char *name = g->v->name, *kind = g->v->kind;
	struct te_plugin_gpu_dev *d;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	char why[TE_PLUGIN_GPU_DETAIL];
	int dev;

	if (!rk || !m) {
		te_plugin_gpu_defer(g, s, TE_ERR_INTERNAL, "%s: slice without key or region", name);
		return NULL;
	}
	if (rk->broken != TE_OK) {
		/* The key outlives the slice: the core holds the segment while it is in flight. */
		te_plugin_gpu_defer(g, s, rk->broken, "%s", rk->why);
		return NULL;
	}
	if (s->remote < rk->addr || s->length > rk->length ||
	    s->remote - rk->addr > rk->length - s->length || !(rk->access & need)) {
		te_plugin_gpu_defer(
			g, s, TE_ERR_REMOTE_ACCESS,
			"%s: remote range [0x%llx, +%llu) is not inside a %s buffer "
			"[0x%llx, +%llu)",
			name, (unsigned long long)s->remote, (unsigned long long)s->length,
			s->opcode == TE_PLUGIN_OP_READ ? "remote-readable" : "remote-writable",
			(unsigned long long)rk->addr, (unsigned long long)rk->length);
		return NULL;
	}
	/* The local GPU copies; for host memory, the GPU holding the remote memory. */
	dev = m->type == g->v->mem_type ? m->dev : rk->copy_dev;
	s->device = (uint32_t)dev;
	d = te_plugin_gpu_dev_get(g, dev);
	if (!d) {
		te_plugin_gpu_defer(g, s, TE_ERR_NO_DEVICE, "%s: %s:%d is not a device here", name,
				    kind, dev);
		return NULL;
	}
	if (!(rk->reach & (1ull << dev))) {
		te_plugin_gpu_defer(g, s, TE_ERR_NO_DEVICE,
				    "%s: no path from %s:%d (%s) to the peer's memory on GPU %s "
				    "(%s:%d there): no peer access between them",
				    name, kind, dev, d->pci, rk->exporter_pci, kind,
				    rk->exporter_dev);
		return NULL;
	}
	if (te_plugin_gpu_dev_failed(d, why, sizeof(why))) {
		te_plugin_gpu_defer(g, s, TE_ERR_DEVICE_FAILED, "%s", why);
		return NULL;
	}
	*remote_out = (uintptr_t)(rk->local + (s->remote - rk->addr));
	return d;
}

/* Launch @s on the open group's stream; false when it was queued to fail instead. */
static inline bool te_plugin_gpu_launch_(struct te_plugin_gpu *g, struct te_plugin_gpu_group_ *grp,
					 struct te_plugin_slice *s, uintptr_t remote)
{
	const struct te_plugin_gpu_mem *m = (const struct te_plugin_gpu_mem *)s->local_mem;
	bool host = m->type == TE_PLUGIN_MEM_CPU, rd = s->opcode == TE_PLUGIN_OP_READ;
	enum te_plugin_gpu_dir dir = !host ? TE_PLUGIN_GPU_D2D
				     : rd  ? TE_PLUGIN_GPU_D2H
					   : TE_PLUGIN_GPU_H2D;
	char cs[128];
	int r;

	if (rd)
		r = g->v->copy_async(g, s->local, (const void *)remote, (size_t)s->length, dir,
				     grp->st->s);
	else
		r = g->v->copy_async(g, (void *)remote, s->local, (size_t)s->length, dir,
				     grp->st->s);
	if (!r)
		return true;
	if (g->v->sticky(r)) {
		te_plugin_gpu_dev_fail(g, grp->d, g->v->fn_copy_async, r);
		te_plugin_gpu_defer(g, s, TE_ERR_DEVICE_FAILED, "%s", grp->d->fail);
		return false;
	}
	te_plugin_gpu_defer(
		g, s, g->v->status(r) == TE_ERR_NOMEM ? TE_ERR_AGAIN : TE_ERR_DEVICE_FAILED,
		"%s: %s:%d (%s): %s of %llu bytes %s 0x%llx: %s", g->v->name, g->v->kind,
		grp->d->ordinal, grp->d->pci, g->v->fn_copy_async, (unsigned long long)s->length,
		rd ? "from" : "to", (unsigned long long)s->remote,
		te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
	return false;
}

static inline enum te_status te_plugin_gpu_submit(struct te_plugin_inst *inst,
						  struct te_plugin_slice **slices, uint32_t n,
						  uint32_t *accepted_out)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_group_ grp;
	char cs[128];
	uint32_t i;

	memset(&grp, 0, sizeof(grp));
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		uintptr_t remote = 0;
		struct te_plugin_gpu_dev *d = te_plugin_gpu_route_(g, s, &remote);
		int r;

		if (!d)
			continue; /* accepted; progress reports the failure */
		if (grp.st &&
		    (grp.d != d || grp.n == TE_PLUGIN_GPU_GROUP_MAX ||
		     grp.bytes + s->length > TE_PLUGIN_GPU_GROUP_BYTES ||
		     __atomic_load_n(&grp.st->count, __ATOMIC_RELAXED) + grp.n == grp.st->cap))
			te_plugin_gpu_group_close_(g, &grp);
		if (!grp.st) {
			grp.st = te_plugin_gpu_stream_take_(d);
			if (!grp.st)
				break; /* every ring of this GPU is full: back-pressure */
			grp.d = d;
			grp.first =
				(grp.st->head + __atomic_load_n(&grp.st->count, __ATOMIC_RELAXED)) %
				grp.st->cap;
			r = g->v->set_dev(g, d);
			if (r) {
				te_plugin_gpu_group_close_(g, &grp);
				te_plugin_gpu_defer(g, s, TE_ERR_DEVICE_FAILED, "%s: %s:%d: %s: %s",
						    g->v->name, g->v->kind, d->ordinal,
						    g->v->fn_set_dev,
						    te_plugin_gpu_strerror(g, r, cs, sizeof(cs)));
				continue;
			}
			/* Reaping pops whole groups: the head of a ring is a group's first. */
			/* relaxed: the order only steers the wait helper */
			grp.st->seq[grp.first] =
				__atomic_fetch_add(&g->launch_seq, 1, __ATOMIC_RELAXED);
		}
		if (!te_plugin_gpu_launch_(g, &grp, s, remote)) {
			if (__atomic_load_n(&d->failed, __ATOMIC_RELAXED))
				te_plugin_gpu_group_close_(g, &grp);
			continue;
		}
		__atomic_store_n(&grp.st->ring[(grp.first + grp.n) % grp.st->cap], s,
				 __ATOMIC_RELEASE);
		grp.n++;
		grp.bytes += s->length;
	}
	te_plugin_gpu_group_close_(g, &grp);
	*accepted_out = i;
	return TE_OK;
}

struct te_plugin_gpu_done_ {
	struct te_plugin_slice *s;
	enum te_status status;
};

/*
 * Reap the completed launch groups of @st (at most about @max slices into @out). A failed
 * device (sticky error) loses every copy queued on it: they all fail.
 */
static inline uint32_t te_plugin_gpu_reap_(struct te_plugin_gpu *g, struct te_plugin_gpu_stream *st,
					   struct te_plugin_gpu_done_ *out, uint32_t max, int *err)
{
	bool failed = __atomic_load_n(&st->dev->failed, __ATOMIC_ACQUIRE);
	uint32_t n = 0;

	while (n < max && __atomic_load_n(&st->count, __ATOMIC_RELAXED)) {
		uint32_t end = st->gend[st->head];
		uint32_t len = (end + st->cap - st->head) % st->cap + 1;

		if (!failed && !*err) {
			int r = g->v->event_query(g, st->ev[end]);

			if (r == g->v->not_ready)
				break;
			if (r)
				*err = r;
		}
		if (n + len > max && n)
			break; /* the next call takes this group whole */
		for (uint32_t k = 0; k < len; k++) {
			struct te_plugin_slice *s =
				__atomic_load_n(&st->ring[st->head], __ATOMIC_ACQUIRE);

			__atomic_store_n(&st->ring[st->head], (struct te_plugin_slice *)NULL,
					 __ATOMIC_RELAXED);
			st->head = (st->head + 1) % st->cap;
			out[n].s = s;
			out[n].status = failed || *err ? TE_ERR_DEVICE_FAILED : TE_OK;
			n++;
		}
		__atomic_fetch_sub(&st->count, len, __ATOMIC_RELEASE);
	}
	return n;
}

static inline uint32_t te_plugin_gpu_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	/* Room for a whole launch group beyond the chunk. */
	struct te_plugin_gpu_done_ done[TE_PLUGIN_GPU_REAP_CHUNK + TE_PLUGIN_GPU_GROUP_MAX];
	uint32_t total = te_plugin_gpu_flush_deferred_(g);

	for (uint32_t i = 0; i < g->n_devs && total < budget; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];
		bool dev_set = false;

		for (uint32_t k = 0; k < d->n_streams && total < budget; k++) {
			struct te_plugin_gpu_stream *st = &d->streams[k];
			char why[TE_PLUGIN_GPU_DETAIL] = "", where[64];
			uint32_t n, max = budget - total;
			int err = 0;

			if (!__atomic_load_n(&st->count, __ATOMIC_ACQUIRE))
				continue;
			if (pthread_mutex_trylock(&st->lock) != 0)
				continue;
			if (!dev_set) {
				(void)g->v->set_dev(g, d);
				dev_set = true;
			}
			n = te_plugin_gpu_reap_(
				g, st, done,
				max < TE_PLUGIN_GPU_REAP_CHUNK ? max : TE_PLUGIN_GPU_REAP_CHUNK,
				&err);
			pthread_mutex_unlock(&st->lock);
			if (err) {
				te_plugin_gpu_fmt(where, sizeof(where), "%s%s",
						  g->v->fn_event_query,
						  g->v->sticky(err) ? "" : " (unexpected)");
				te_plugin_gpu_dev_fail(g, d, where, err);
			}
			(void)te_plugin_gpu_dev_failed(d, why, sizeof(why));
			for (uint32_t j = 0; j < n; j++) {
				struct te_plugin_slice *s = done[j].s;

				if (done[j].status == TE_OK)
					g->host->slice_done(g->ctx, s, TE_OK, s->length, NULL);
				else
					g->host->slice_done(g->ctx, s, done[j].status, 0, why);
			}
			total += n;
		}
	}
	return total;
}

static inline enum te_status te_plugin_gpu_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	struct te_plugin_gpu_waiter *w = &g->waiter;
	struct timespec ts;
	uint64_t gen;

	if (__atomic_load_n(&g->n_defer, __ATOMIC_ACQUIRE))
		return TE_OK; /* failures to report: progress flushes them */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(timeout_ns / 1000000000ull);
	ts.tv_nsec += (long)(timeout_ns % 1000000000ull);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&w->lock);
	gen = w->gen;
	w->sleepers++;
	pthread_cond_signal(&w->kick);
	while (w->gen == gen && !w->stop)
		if (pthread_cond_timedwait(&w->woke, &w->lock, &ts) == ETIMEDOUT)
			break;
	w->sleepers--;
	pthread_mutex_unlock(&w->lock);
	return TE_OK;
}

static inline enum te_status te_plugin_gpu_cancel(struct te_plugin_inst *inst,
						  struct te_plugin_slice *s)
{
	struct te_plugin_gpu *g = te_plugin_gpu_of(inst);
	enum te_status st = TE_ERR_NOT_FOUND;

	/*
	 * A launched copy cannot be stopped: the slice is handed back when its event completes,
	 * with its real outcome; a queued failure is reported by the next progress. There is
	 * nothing to do but say whether the slice is ours: in a ring slot, or queued to fail.
	 */
	for (uint32_t i = 0; i < g->n_devs; i++) {
		struct te_plugin_gpu_dev *d = &g->devs[i];

		for (uint32_t k = 0; k < d->n_streams; k++) {
			struct te_plugin_gpu_stream *q = &d->streams[k];

			for (uint32_t slot = 0; slot < q->cap; slot++)
				if (__atomic_load_n(&q->ring[slot], __ATOMIC_ACQUIRE) == s)
					return TE_OK;
		}
	}
	pthread_mutex_lock(&g->defer_lock);
	for (uint32_t i = 0; i < g->n_defers; i++)
		if (g->defers[i].s == s)
			st = TE_OK;
	pthread_mutex_unlock(&g->defer_lock);
	return st;
}

static inline enum te_status te_plugin_gpu_retry_prepare(struct te_plugin_inst *inst,
							 struct te_plugin_slice *s)
{
	/*
	 * The GPU is dictated by where the memory is (caps TE_PLUGIN_CAP_FIXED_DEVICES: the core
	 * excludes none): a retry takes the same path; a GPU known to have failed refuses it in
	 * submit (te_plugin_gpu_dev_failed).
	 */
	(void)inst;
	(void)s;
	return TE_OK;
}

/*
 * The ops table of a GPU plugin whose init op is @init_fn (which calls te_plugin_gpu_init):
 *   static const struct te_plugin_ops my_ops = TE_PLUGIN_GPU_OPS(my_init);
 * C only (designated initializers).
 */
#define TE_PLUGIN_GPU_OPS(init_fn)                                                                 \
	{                                                                                          \
		.size = sizeof(struct te_plugin_ops), .init = (init_fn),                           \
		.fini = te_plugin_gpu_fini, .query_caps = te_plugin_gpu_query_caps,                \
		.query_devices = te_plugin_gpu_query_devices, .reg_mem = te_plugin_gpu_reg_mem,    \
		.dereg_mem = te_plugin_gpu_dereg_mem, .pack_key = te_plugin_gpu_pack_key,          \
		.load_peer = te_plugin_gpu_load_peer, .unload_peer = te_plugin_gpu_unload_peer,    \
		.unpack_remote_key = te_plugin_gpu_unpack_remote_key,                              \
		.release_remote_key = te_plugin_gpu_release_remote_key,                            \
		.submit = te_plugin_gpu_submit, .progress = te_plugin_gpu_progress,                \
		.cancel = te_plugin_gpu_cancel, .retry_prepare = te_plugin_gpu_retry_prepare,      \
		.wait = te_plugin_gpu_wait, .mem_query = te_plugin_gpu_mem_query,                  \
		.mem_copy = te_plugin_gpu_mem_copy, .mem_dmabuf = te_plugin_gpu_mem_dmabuf,        \
		.mem_alloc = te_plugin_gpu_mem_alloc, .mem_free = te_plugin_gpu_mem_free,          \
	}

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_GPU_H */
