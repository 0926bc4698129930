/* SPDX-License-Identifier: Apache-2.0 */
/* fakecuda.c: a fake libcuda.so.1 on host memory, the subset of the CUDA driver API nvlink uses. */

/*
 * What it models (the nvlink tests, tests/gpu/nvlink_test.c, rely on all of it):
 *
 * Devices. FAKECUDA_DEVICES GPUs (default 2; 0: cuInit fails with CUDA_ERROR_NO_DEVICE), named
 * "fakecuda GPU <n>", PCI bus id 0000:<16 + 16 n>:00.0, host NUMA node n % 2, every pair peer
 * capable unless FAKECUDA_NO_PEER=1. The driver version is FAKECUDA_DRIVER_VERSION (13000);
 * cuGetProcAddress refuses a newer version with CUDA_ERROR_INVALID_VALUE, as the real driver does.
 *
 * Memory. Every allocation is a memfd. Its "device pointer" is an address of this process
 * reserved PROT_NONE, so that a host access to device memory faults as it would on a GPU; copies
 * reach the bytes through a second, shared mapping of the same memfd (the shadow). IPC handles
 * (cuIpcGetMemHandle) and FABRIC handles name the exporting process, the memfd's descriptor
 * number there and a nonce in the memfd's name: the importer opens /proc/<pid>/fd/<n>, so both
 * processes really share the bytes, and a handle of a process that is gone fails with
 * CUDA_ERROR_INVALID_HANDLE. POSIX file descriptor handles (VMM) are the memfd itself.
 *
 * Streams and events. Each stream has a worker thread that runs its copies in order; an event
 * completes when the copies enqueued on its stream before the record are done.
 *
 * Faults, from the environment (read once, at the first cuInit):
 *   FAKECUDA_FAIL_COPY_AFTER=N   the async copy number N+1 (counted from 1 per process) fails at
 *                                launch with CUDA_ERROR_UNKNOWN; FAKECUDA_FAIL_COPY_COUNT=K (1)
 *                                copies from there fail, 0: all of them
 *   FAKECUDA_STICKY_AFTER=N      async copy N+1 raises a sticky CUDA_ERROR_ILLEGAL_ADDRESS in its
 *                                context: it and everything after fail, as on a GPU
 *   FAKECUDA_OOM_BYTES=N         allocations beyond N bytes per device fail (out of memory)
 *   FAKECUDA_IPC_OPEN_FAIL=1     cuIpcOpenMemHandle and cuMemImportFromShareableHandle fail with
 *                                CUDA_ERROR_MAP_FAILED
 *   FAKECUDA_COPY_DELAY_US=N     every async copy takes N microseconds longer
 *   FAKECUDA_FABRIC=1            devices support FABRIC handles
 *   FAKECUDA_INLINE_COPIES=1     an async copy on an idle stream runs inside cuMemcpyAsync, so
 *                                the driver costs next to nothing (te-bench overhead figures)
 *   FAKECUDA_SYNC_FAULTS=1       synchronous copies (cuMemcpy: te_mem_copy, the core's staging)
 *                                take the copy delay and count for FAKECUDA_FAIL_COPY_* too
 * Otherwise synchronous copies are not counted by the copy faults; a sticky context fails them.
 *
 * fakecuda_live() (not a CUDA call) reports what is still allocated, mapped, registered or alive,
 * so tests can assert that nothing is left behind.
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#define FK_MAX_DEV 16
#define FK_PAGE 4096ull
#define FK_GRANULARITY (2ull << 20)
#define FK_DEF_MEM (16ull << 30)
#define FK_DEF_VERSION 13000
#define FK_IPC_MAGIC "FAKEIPC1"
#define FK_FAB_MAGIC "FAKEFAB1"

/* Exported for tests (not part of CUDA): counts of what is still alive. */
struct fakecuda_live {
	int allocs;	  /* cuMemAlloc allocations */
	int ipc_maps;	  /* cuIpcOpenMemHandle mappings */
	int vmm_maps;	  /* cuMemMap mappings */
	int vmm_handles;  /* physical allocations (cuMemCreate / imported) */
	int reservations; /* cuMemAddressReserve ranges */
	int host_regs;	  /* cuMemHostRegister ranges */
	int streams;
	int events;
	int ctx_refs; /* primary context references, all devices */
};
void fakecuda_live(struct fakecuda_live *out);

/* --- state ------------------------------------------------------------------------------ */

/* One physical allocation: a memfd and its shadow mapping (what copies touch). */
struct fk_phys {
	int fd;
	size_t size;
	uint8_t *shadow;
	int refs; /* under fk.lock */
	int dev;
	bool vmm;
	bool charged; /* counts against the device's memory (allocated here, not imported) */
	CUmemAllocationProp prop;
	char nonce[24];
	struct fk_phys *next; /* live list, for handle validation */
};

enum fk_map_kind {
	FK_MAP_ALLOC = 1, /* cuMemAlloc */
	FK_MAP_IPC = 2,	  /* cuIpcOpenMemHandle */
	FK_MAP_VMM = 3,	  /* cuMemMap */
};

/* A range of device addresses backed by (the start of) a physical allocation. */
struct fk_map {
	uintptr_t va;
	size_t size;  /* bytes usable (cuMemAlloc: as requested) */
	size_t vsize; /* bytes of address space reserved for it (page multiple) */
	struct fk_phys *phys;
	enum fk_map_kind kind;
	int dev;
	int ipc_refs;	    /* FK_MAP_IPC: opens in this process */
	unsigned access_rw; /* FK_MAP_VMM: devices with read-write access (bit per device) */
	unsigned access_ro; /* FK_MAP_VMM: devices with read-only access */
};

struct fk_resv {
	uintptr_t va;
	size_t size;
};

struct fk_hostreg {
	uintptr_t p;
	size_t size;
};

struct CUctx_st {
	int dev;
	int refs;	   /* under fk.lock */
	atomic_int sticky; /* CUresult of a sticky error, 0 none */
	unsigned peers;	   /* peer access enabled towards these devices */
};

struct fk_op {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
	uint64_t seq;
	bool sticky;
};

#define FK_STREAM_MAGIC 0x5354524du

struct CUstream_st {
	uint32_t magic; /* FK_STREAM_MAGIC while the stream may be used */
	struct CUctx_st *ctx;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work;
	pthread_cond_t done;
	struct fk_op *ring;
	size_t cap, head, count;
	_Atomic uint64_t enqueued;  /* written under lock */
	_Atomic uint64_t completed; /* written under lock */
	bool stop;
	atomic_int refs; /* the creator and events recorded on it */
};

struct CUevent_st {
	struct CUctx_st *ctx;
	pthread_mutex_t lock;
	struct CUstream_st *stream; /* of the last record (a reference), NULL: none */
	uint64_t seq;
	unsigned flags;
};

static struct {
	pthread_once_t once;
	/* Everything below but the atomics; a cache line of its own, away from hot counters. */
	_Alignas(64) pthread_mutex_t lock;
	bool inited;
	int n_dev;
	int version;
	uint64_t mem_bytes;
	uint64_t oom_bytes;
	bool no_peer;
	bool fabric;
	bool ipc_open_fail;
	bool inline_copies;
	long long fail_after, fail_count, sticky_after;
	unsigned delay_us;
	bool sync_faults; /* cuMemcpy takes the delay and counts for the copy faults */
	_Alignas(64) atomic_llong copies;
	_Alignas(64) _Atomic uint64_t map_gen; /* bumped by every change of maps or their access */
	uint64_t allocated[FK_MAX_DEV];
	struct CUctx_st ctx[FK_MAX_DEV];
	struct fk_map *maps; /* sorted by va */
	size_t n_maps, cap_maps;
	struct fk_resv *resv;
	size_t n_resv, cap_resv;
	struct fk_hostreg *hregs;
	size_t n_hregs, cap_hregs;
	struct fk_phys *phys;
	int n_streams, n_events;
} fk = { .once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER };

/* initial-exec: no __tls_get_addr per call (the few bytes fit glibc's static TLS surplus). */
#define FK_TLS __thread __attribute__((tls_model("initial-exec")))

static FK_TLS struct CUctx_st *fk_current;

/* --- helpers ---------------------------------------------------------------------------- */

static long long fk_env_ll(const char *name, long long def)
{
	const char *s = getenv(name);
	char *end = NULL;
	long long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || !end || *end) {
		fprintf(stderr, "fakecuda: %s='%s' is not a number; ignored\n", name, s);
		return def;
	}
	return v;
}

static void fk_init_once(void)
{
	long long n = fk_env_ll("FAKECUDA_DEVICES", 2);

	fk.n_dev = n < 0 ? 0 : n > FK_MAX_DEV ? FK_MAX_DEV : (int)n;
	fk.version = (int)fk_env_ll("FAKECUDA_DRIVER_VERSION", FK_DEF_VERSION);
	fk.mem_bytes = (uint64_t)fk_env_ll("FAKECUDA_MEM_BYTES", (long long)FK_DEF_MEM);
	fk.oom_bytes = (uint64_t)fk_env_ll("FAKECUDA_OOM_BYTES", (long long)fk.mem_bytes);
	fk.no_peer = fk_env_ll("FAKECUDA_NO_PEER", 0) != 0;
	fk.fabric = fk_env_ll("FAKECUDA_FABRIC", 0) != 0;
	fk.ipc_open_fail = fk_env_ll("FAKECUDA_IPC_OPEN_FAIL", 0) != 0;
	fk.inline_copies = fk_env_ll("FAKECUDA_INLINE_COPIES", 0) != 0;
	fk.fail_after = fk_env_ll("FAKECUDA_FAIL_COPY_AFTER", -1);
	fk.fail_count = fk_env_ll("FAKECUDA_FAIL_COPY_COUNT", 1);
	fk.sticky_after = fk_env_ll("FAKECUDA_STICKY_AFTER", -1);
	fk.delay_us = (unsigned)fk_env_ll("FAKECUDA_COPY_DELAY_US", 0);
	fk.sync_faults = fk_env_ll("FAKECUDA_SYNC_FAULTS", 0) != 0;
	for (int i = 0; i < FK_MAX_DEV; i++)
		fk.ctx[i].dev = i;
}

static CUresult fk_ready(void)
{
	return fk.inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* The current context, or why there is none usable (sticky errors included). */
static CUresult fk_cur(struct CUctx_st **out)
{
	struct CUctx_st *c = fk_current;
	int sticky;

	if (!fk.inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	sticky = atomic_load(&c->sticky);
	if (sticky)
		return (CUresult)sticky;
	*out = c;
	return CUDA_SUCCESS;
}

static bool fk_ctx_valid(const struct CUctx_st *c)
{
	return c >= fk.ctx && c < fk.ctx + FK_MAX_DEV && c->dev < fk.n_dev;
}

static void fk_nonce(char *buf, size_t len)
{
	uint64_t r[2] = { 0, 0 };

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		r[0] = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
	snprintf(buf, len, "%016" PRIx64 "%04" PRIx64, r[0], r[1] & 0xffff);
}

static size_t fk_round(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

/* A new memfd of @size bytes for device @dev, with its shadow mapping; refs 1. */
static CUresult fk_phys_new(int dev, size_t size, struct fk_phys **out)
{
	struct fk_phys *p = calloc(1, sizeof(*p));
	char name[64];

	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fk_nonce(p->nonce, sizeof(p->nonce));
	snprintf(name, sizeof(name), "fakecuda-%d-%s", dev, p->nonce);
	p->fd = memfd_create(name, MFD_CLOEXEC);
	if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
		if (p->fd >= 0)
			close(p->fd);
		free(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->shadow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
	if (p->shadow == MAP_FAILED) {
		close(p->fd);
		free(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->size = size;
	p->dev = dev;
	p->refs = 1;
	p->charged = true;
	p->next = fk.phys;
	fk.phys = p;
	*out = p;
	return CUDA_SUCCESS;
}

/* Wrap an existing memfd (taken over) of another process or of this one; refs 1. */
static CUresult fk_phys_adopt(int fd, struct fk_phys **out)
{
	struct fk_phys *p;
	struct stat st;
	char link[64], target[256], nonce[24];
	const char *tag;
	ssize_t n;
	int dev = 0;

	if (fstat(fd, &st) != 0 || st.st_size <= 0)
		return CUDA_ERROR_INVALID_HANDLE;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return CUDA_ERROR_INVALID_HANDLE;
	target[n] = '\0';
	tag = strstr(target, "fakecuda-");
	if (!tag || sscanf(tag, "fakecuda-%d-%23[0-9a-f]", &dev, nonce) != 2 || dev < 0 ||
	    dev >= FK_MAX_DEV)
		return CUDA_ERROR_INVALID_HANDLE;
	p = calloc(1, sizeof(*p));
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->shadow = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p->shadow == MAP_FAILED) {
		free(p);
		return CUDA_ERROR_MAP_FAILED;
	}
	memcpy(p->nonce, nonce, sizeof(p->nonce));
	p->fd = fd;
	p->size = (size_t)st.st_size;
	p->dev = dev;
	p->refs = 1;
	p->next = fk.phys;
	fk.phys = p;
	*out = p;
	return CUDA_SUCCESS;
}

static bool fk_phys_live(const struct fk_phys *p)
{
	for (const struct fk_phys *q = fk.phys; q; q = q->next)
		if (q == p)
			return true;
	return false;
}

static void fk_phys_unref(struct fk_phys *p)
{
	if (--p->refs > 0)
		return;
	for (struct fk_phys **pp = &fk.phys; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (p->charged)
		fk.allocated[p->dev] -= p->size;
	munmap(p->shadow, p->size);
	close(p->fd);
	free(p);
}

/* Index of the first map with va > @va. */
static size_t fk_map_upper(uintptr_t va)
{
	size_t lo = 0, hi = fk.n_maps;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (fk.maps[mid].va <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The map holding address @va (within its reserved pages), or NULL. */
static struct fk_map *fk_map_find(uintptr_t va)
{
	size_t i = fk_map_upper(va);

	if (i == 0)
		return NULL;
	if (va - fk.maps[i - 1].va < fk.maps[i - 1].vsize)
		return &fk.maps[i - 1];
	return NULL;
}

static CUresult fk_map_insert(const struct fk_map *m)
{
	size_t i;

	if (fk.n_maps == fk.cap_maps) {
		size_t cap = fk.cap_maps ? 2 * fk.cap_maps : 16;
		struct fk_map *n = realloc(fk.maps, cap * sizeof(*n));

		if (!n)
			return CUDA_ERROR_OUT_OF_MEMORY;
		fk.maps = n;
		fk.cap_maps = cap;
	}
	i = fk_map_upper(m->va);
	memmove(&fk.maps[i + 1], &fk.maps[i], (fk.n_maps - i) * sizeof(*m));
	fk.maps[i] = *m;
	fk.n_maps++;
	atomic_fetch_add_explicit(&fk.map_gen, 1, memory_order_release);
	return CUDA_SUCCESS;
}

static void fk_map_remove(struct fk_map *m)
{
	size_t i = (size_t)(m - fk.maps);

	memmove(&fk.maps[i], &fk.maps[i + 1], (fk.n_maps - i - 1) * sizeof(*m));
	fk.n_maps--;
	atomic_fetch_add_explicit(&fk.map_gen, 1, memory_order_release);
}

static struct fk_resv *fk_resv_find(uintptr_t va, size_t len)
{
	for (size_t i = 0; i < fk.n_resv; i++)
		if (va >= fk.resv[i].va && va - fk.resv[i].va < fk.resv[i].size &&
		    len <= fk.resv[i].size - (va - fk.resv[i].va))
			return &fk.resv[i];
	return NULL;
}

static void *fk_reserve(size_t size)
{
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/*
 * Host address of the bytes [@p, +@n) that a copy on device @dev reads (@write false) or writes:
 * device memory through its shadow, anything else is host memory as is. Under fk.lock.
 */
static CUresult fk_translate(uintptr_t p, size_t n, int dev, bool write, uint8_t **out)
{
	struct fk_map *m = fk_map_find(p);

	if (!m) {
		if (fk_resv_find(p, 1))
			return CUDA_ERROR_INVALID_VALUE; /* reserved, nothing mapped there */
		*out = (uint8_t *)p;
		return CUDA_SUCCESS;
	}
	if (p - m->va > m->size || n > m->size - (p - m->va))
		return CUDA_ERROR_INVALID_VALUE;
	if (m->kind == FK_MAP_VMM && dev >= 0) {
		unsigned bit = 1u << dev;

		if (!(m->access_rw & bit) && (write || !(m->access_ro & bit)))
			return CUDA_ERROR_INVALID_VALUE;
	}
	*out = m->phys->shadow + (p - m->va);
	return CUDA_SUCCESS;
}

static CUresult fk_check_dev(CUdevice dev)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	return dev >= 0 && dev < fk.n_dev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* --- initialisation, version, errors ------------------------------------------------------ */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
	pthread_once(&fk.once, fk_init_once);
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fk.n_dev == 0)
		return CUDA_ERROR_NO_DEVICE;
	pthread_mutex_lock(&fk.lock);
	fk.inited = true;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	pthread_once(&fk.once, fk_init_once);
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = fk.version;
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} fk_errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
	{ CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
	{ CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped" },
	{ CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	  "peer access is not supported between these two devices" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	  "an illegal memory access was encountered" },
	{ CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	  "peer access is already enabled" },
	{ CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	  "peer access has not been enabled" },
	{ CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	  "part or all of the requested memory range is already mapped" },
	{ CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	  "pointer does not correspond to a registered memory region" },
	{ CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++) {
		if (fk_errors[i].code == error) {
			*pStr = fk_errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++) {
		if (fk_errors[i].code == error) {
			*pStr = fk_errors[i].name;
			return CUDA_SUCCESS;
		}
	}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* --- devices ------------------------------------------------------------------------------ */

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = fk.n_dev;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	CUresult r = fk_check_dev(ordinal);

	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "fakecuda GPU %d", dev);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!pciBusId || len < 13)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", 16 + 16 * dev);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = (size_t)fk.mem_bytes;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		*pi = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		*pi = 16 + 16 * dev;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
		*pi = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
		*pi = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
		*pi = fk.fabric;
		break;
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
		*pi = dev % 2;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	CUresult r = fk_check_dev(dev);

	if (!r)
		r = fk_check_dev(peerDev);
	if (r)
		return r;
	if (!canAccessPeer)
		return CUDA_ERROR_INVALID_VALUE;
	*canAccessPeer = dev != peerDev && !fk.no_peer;
	return CUDA_SUCCESS;
}

/* --- contexts ----------------------------------------------------------------------------- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	fk.ctx[dev].refs++;
	pthread_mutex_unlock(&fk.lock);
	*pctx = &fk.ctx[dev];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	if (fk.ctx[dev].refs <= 0) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	/* The last release destroys the context: a sticky error goes with it. */
	if (--fk.ctx[dev].refs == 0) {
		atomic_store(&fk.ctx[dev].sticky, 0);
		fk.ctx[dev].peers = 0;
	}
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (ctx && (!fk_ctx_valid(ctx) || ctx->refs <= 0))
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_current = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = fk_current;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	struct CUctx_st *c;
	CUresult r = fk_cur(&c);
	int can = 0;

	if (r)
		return r;
	if (!peerContext || !fk_ctx_valid(peerContext) || Flags)
		return CUDA_ERROR_INVALID_VALUE;
	r = cuDeviceCanAccessPeer(&can, c->dev, peerContext->dev);
	if (r)
		return r;
	if (!can)
		return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	pthread_mutex_lock(&fk.lock);
	if (c->peers & (1u << peerContext->dev)) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	}
	c->peers |= 1u << peerContext->dev;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

/* --- cuMemAlloc memory -------------------------------------------------------------------- */

static CUresult fk_charge(int dev, size_t size)
{
	if (fk.allocated[dev] + size > fk.oom_bytes || size > fk.mem_bytes)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fk.allocated[dev] += size;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct CUctx_st *c;
	struct fk_phys *p = NULL;
	struct fk_map m;
	size_t vsize;
	void *va;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	vsize = fk_round(bytesize, FK_PAGE);
	pthread_mutex_lock(&fk.lock);
	r = fk_charge(c->dev, vsize);
	if (r)
		goto out;
	r = fk_phys_new(c->dev, vsize, &p);
	if (r) {
		fk.allocated[c->dev] -= vsize;
		goto out;
	}
	va = fk_reserve(vsize);
	if (!va) {
		fk_phys_unref(p);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m = (struct fk_map){ .va = (uintptr_t)va,
			     .size = bytesize,
			     .vsize = vsize,
			     .phys = p,
			     .kind = FK_MAP_ALLOC,
			     .dev = c->dev };
	r = fk_map_insert(&m);
	if (r) {
		munmap(va, vsize);
		fk_phys_unref(p);
		goto out;
	}
	*dptr = (CUdeviceptr)(uintptr_t)va;
out:
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	struct fk_map *m;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!dptr)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)dptr);
	if (!m || m->va != (uintptr_t)dptr || m->kind != FK_MAP_ALLOC) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	munmap((void *)m->va, m->vsize);
	fk_phys_unref(m->phys);
	fk_map_remove(m);
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct fk_map *m;
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)dptr);
	if (!m || (uintptr_t)dptr - m->va >= m->size) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_NOT_FOUND;
	}
	if (pbase)
		*pbase = (CUdeviceptr)m->va;
	if (psize)
		*psize = m->size;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static struct fk_hostreg *fk_hostreg_find(uintptr_t p)
{
	for (size_t i = 0; i < fk.n_hregs; i++)
		if (p >= fk.hregs[i].p && p - fk.hregs[i].p < fk.hregs[i].size)
			return &fk.hregs[i];
	return NULL;
}

/* One attribute of @ptr into @data; @known false: not a CUDA pointer (defaults written). */
static CUresult fk_attr(void *data, CUpointer_attribute attribute, uintptr_t ptr, bool *known)
{
	struct fk_map *m = fk_map_find(ptr);
	struct fk_hostreg *h = m ? NULL : fk_hostreg_find(ptr);

	if (m && ptr - m->va >= m->size)
		m = NULL;
	*known = m || h;
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = m ? CU_MEMORYTYPE_DEVICE : h ? CU_MEMORYTYPE_HOST : 0;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = m ? m->dev : -2;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = m ? (CUdeviceptr)m->va : h ? (CUdeviceptr)h->p : 0;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = m ? m->size : h ? h->size : 0;
		break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = m && m->kind == FK_MAP_ALLOC;
		break;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = m ? &fk.ctx[m->dev] : NULL;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		*(CUdeviceptr *)data = m ? (CUdeviceptr)m->va : 0;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		*(size_t *)data = m ? m->size : 0;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = m != NULL;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	bool known;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	r = fk_attr(data, attribute, (uintptr_t)ptr, &known);
	pthread_mutex_unlock(&fk.lock);
	/* Unlike the plural call, this one refuses pointers CUDA does not know. */
	if (!r && !known)
		return CUDA_ERROR_INVALID_VALUE;
	return r;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
					void **data, CUdeviceptr ptr)
{
	bool known;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	for (unsigned i = 0; i < numAttributes && !r; i++)
		r = data[i] ? fk_attr(data[i], attributes[i], (uintptr_t)ptr, &known)
			    : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&fk.lock);
	return r;
}

/* --- legacy IPC --------------------------------------------------------------------------- */

struct fk_ipc {
	char magic[8];
	int32_t pid;
	int32_t fd;
	uint64_t size; /* usable bytes */
	int32_t dev;
	char nonce[24];
};

_Static_assert(sizeof(struct fk_ipc) <= CU_IPC_HANDLE_SIZE, "IPC handle too small");

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct fk_map *m;
	struct fk_ipc h;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!pHandle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)dptr);
	if (!m || m->kind != FK_MAP_ALLOC) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, FK_IPC_MAGIC, sizeof(h.magic));
	h.pid = (int32_t)getpid();
	h.fd = m->phys->fd;
	h.size = m->size;
	h.dev = m->dev;
	memcpy(h.nonce, m->phys->nonce, sizeof(h.nonce));
	pthread_mutex_unlock(&fk.lock);
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy(pHandle->reserved, &h, sizeof(h));
	return CUDA_SUCCESS;
}

/* Open the memfd @fd of process @pid if its name carries @nonce; -1 and why otherwise. */
static int fk_open_remote(int32_t pid, int32_t fd, const char *nonce, CUresult *why)
{
	char path[64], target[256];
	ssize_t n;
	int nfd;

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0) {
		*why = CUDA_ERROR_INVALID_HANDLE; /* the process or its allocation is gone */
		return -1;
	}
	target[n] = '\0';
	if (!strstr(target, "fakecuda-") || !strstr(target, nonce)) {
		*why = CUDA_ERROR_INVALID_HANDLE;
		return -1;
	}
	nfd = open(path, O_RDWR | O_CLOEXEC);
	if (nfd < 0)
		*why = errno == EACCES || errno == EPERM ? CUDA_ERROR_NOT_PERMITTED
							 : CUDA_ERROR_INVALID_HANDLE;
	return nfd;
}

/* Map @p (taken over) at a fresh device address; *@out the new map (in fk.maps). */
static CUresult fk_map_imported(struct fk_phys *p, size_t size, enum fk_map_kind kind, int dev,
				uintptr_t *va_out)
{
	struct fk_map m;
	size_t vsize = fk_round(p->size, FK_PAGE);
	void *va = fk_reserve(vsize);
	CUresult r;

	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m = (struct fk_map){ .va = (uintptr_t)va,
			     .size = size,
			     .vsize = vsize,
			     .phys = p,
			     .kind = kind,
			     .dev = dev,
			     .ipc_refs = 1 };
	r = fk_map_insert(&m);
	if (r) {
		munmap(va, vsize);
		return r;
	}
	*va_out = (uintptr_t)va;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	struct CUctx_st *c;
	struct fk_phys *p;
	struct fk_ipc h;
	uintptr_t va = 0;
	int fd;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	memcpy(&h, handle.reserved, sizeof(h));
	if (!pdptr || memcmp(h.magic, FK_IPC_MAGIC, sizeof(h.magic)) != 0 ||
	    Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS || h.size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	h.nonce[sizeof(h.nonce) - 1] = '\0';
	if (fk.ipc_open_fail)
		return CUDA_ERROR_MAP_FAILED;
	if (h.pid == (int32_t)getpid())
		return CUDA_ERROR_INVALID_CONTEXT; /* handles are for other processes */
	pthread_mutex_lock(&fk.lock);
	/* The same handle opened again in this process: the same mapping, counted. */
	for (size_t i = 0; i < fk.n_maps; i++) {
		struct fk_map *m = &fk.maps[i];

		if (m->kind == FK_MAP_IPC && strcmp(m->phys->nonce, h.nonce) == 0) {
			m->ipc_refs++;
			*pdptr = (CUdeviceptr)m->va;
			pthread_mutex_unlock(&fk.lock);
			return CUDA_SUCCESS;
		}
	}
	fd = fk_open_remote(h.pid, h.fd, h.nonce, &r);
	if (fd < 0)
		goto out;
	r = fk_phys_adopt(fd, &p);
	if (r) {
		close(fd);
		goto out;
	}
	if (h.size > p->size) {
		fk_phys_unref(p);
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	r = fk_map_imported(p, (size_t)h.size, FK_MAP_IPC, h.dev, &va);
	if (r) {
		fk_phys_unref(p);
		goto out;
	}
	*pdptr = (CUdeviceptr)va;
out:
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct fk_map *m;
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)dptr);
	if (!m || m->va != (uintptr_t)dptr || m->kind != FK_MAP_IPC) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (--m->ipc_refs == 0) {
		munmap((void *)m->va, m->vsize);
		fk_phys_unref(m->phys);
		fk_map_remove(m);
	}
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

/* --- virtual memory management ------------------------------------------------------------ */

static struct fk_phys *fk_handle(CUmemGenericAllocationHandle h)
{
	struct fk_phys *p = (struct fk_phys *)(uintptr_t)h;

	return p && fk_phys_live(p) && p->vmm ? p : NULL;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	*granularity = (size_t)FK_GRANULARITY;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			     const CUmemAllocationProp *prop, unsigned long long flags)
{
	struct fk_phys *p = NULL;
	unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!handle || !prop || flags || !size || size % FK_GRANULARITY ||
	    prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    (unsigned)prop->requestedHandleTypes & ~known)
		return CUDA_ERROR_INVALID_VALUE;
	r = fk_check_dev(prop->location.id);
	if (r)
		return r;
	if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && !fk.fabric)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&fk.lock);
	r = fk_charge(prop->location.id, size);
	if (!r) {
		r = fk_phys_new(prop->location.id, size, &p);
		if (r)
			fk.allocated[prop->location.id] -= size;
	}
	if (!r) {
		p->vmm = true;
		p->prop = *prop;
		*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct fk_phys *p;
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	p = fk_handle(handle);
	if (!p) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	fk_phys_unref(p);
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				     CUdeviceptr addr, unsigned long long flags)
{
	void *va;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!ptr || !size || size % FK_GRANULARITY || flags || (alignment & (alignment - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	/* Over-reserve to honour the alignment, then give back the ends. */
	va = fk_reserve(size + FK_GRANULARITY);
	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	{
		uintptr_t a =
			((uintptr_t)va + FK_GRANULARITY - 1) & ~(uintptr_t)(FK_GRANULARITY - 1);
		size_t head = a - (uintptr_t)va, tail = FK_GRANULARITY - head;

		if (head)
			munmap(va, head);
		if (tail)
			munmap((void *)(a + size), tail);
		va = (void *)a;
	}
	pthread_mutex_lock(&fk.lock);
	if (fk.n_resv == fk.cap_resv) {
		size_t cap = fk.cap_resv ? 2 * fk.cap_resv : 8;
		struct fk_resv *n = realloc(fk.resv, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&fk.lock);
			munmap(va, size);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		fk.resv = n;
		fk.cap_resv = cap;
	}
	fk.resv[fk.n_resv++] = (struct fk_resv){ (uintptr_t)va, size };
	pthread_mutex_unlock(&fk.lock);
	*ptr = (CUdeviceptr)(uintptr_t)va;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_resv; i++) {
		struct fk_resv *v = &fk.resv[i];

		if (v->va != (uintptr_t)ptr || v->size != size)
			continue;
		for (size_t k = 0; k < fk.n_maps; k++) {
			if (fk.maps[k].va >= v->va && fk.maps[k].va - v->va < v->size) {
				pthread_mutex_unlock(&fk.lock);
				return CUDA_ERROR_INVALID_VALUE; /* still mapped */
			}
		}
		munmap((void *)v->va, v->size);
		fk.resv[i] = fk.resv[--fk.n_resv];
		pthread_mutex_unlock(&fk.lock);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&fk.lock);
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	struct fk_phys *p;
	struct fk_map m;
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	p = fk_handle(handle);
	if (!p || offset || flags || !size || size > p->size ||
	    !fk_resv_find((uintptr_t)ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (fk_map_find((uintptr_t)ptr) || fk_map_find((uintptr_t)ptr + size - 1)) {
		r = CUDA_ERROR_ALREADY_MAPPED;
		goto out;
	}
	m = (struct fk_map){ .va = (uintptr_t)ptr,
			     .size = size,
			     .vsize = size,
			     .phys = p,
			     .kind = FK_MAP_VMM,
			     .dev = p->dev };
	r = fk_map_insert(&m);
	if (!r)
		p->refs++;
out:
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult r = fk_ready();
	bool any = false;

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_maps;) {
		struct fk_map *m = &fk.maps[i];

		if (m->kind == FK_MAP_VMM && m->va >= (uintptr_t)ptr &&
		    m->va - (uintptr_t)ptr < size) {
			fk_phys_unref(m->phys);
			fk_map_remove(m);
			any = true;
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&fk.lock);
	return any ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				size_t count)
{
	CUresult r = fk_ready();
	bool any = false;

	if (r)
		return r;
	if (!desc || !count)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t k = 0; k < count; k++) {
		if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return CUDA_ERROR_INVALID_VALUE;
		r = fk_check_dev(desc[k].location.id);
		if (r)
			return r;
	}
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_maps; i++) {
		struct fk_map *m = &fk.maps[i];

		if (m->kind != FK_MAP_VMM || m->va < (uintptr_t)ptr ||
		    m->va - (uintptr_t)ptr >= size)
			continue;
		any = true;
		for (size_t k = 0; k < count; k++) {
			unsigned bit = 1u << desc[k].location.id;

			m->access_rw &= ~bit;
			m->access_ro &= ~bit;
			if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
				m->access_rw |= bit;
			else if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
				m->access_ro |= bit;
		}
	}
	atomic_fetch_add_explicit(&fk.map_gen, 1, memory_order_release);
	pthread_mutex_unlock(&fk.lock);
	return any ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct fk_map *m;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)addr);
	if (!m || m->kind != FK_MAP_VMM) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	m->phys->refs++;
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							CUmemGenericAllocationHandle handle)
{
	struct fk_phys *p;
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	p = fk_handle(handle);
	if (!p || !prop)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		*prop = p->prop;
	pthread_mutex_unlock(&fk.lock);
	return r;
}

struct fk_fab {
	char magic[8];
	int32_t pid;
	int32_t fd;
	uint64_t size;
	int32_t dev;
	char nonce[24];
};

_Static_assert(sizeof(struct fk_fab) <= sizeof(CUmemFabricHandle), "fabric handle too small");

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
					      CUmemGenericAllocationHandle handle,
					      CUmemAllocationHandleType handleType,
					      unsigned long long flags)
{
	struct fk_phys *p;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!shareableHandle || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	p = fk_handle(handle);
	if (!p || !(p->prop.requestedHandleTypes & handleType)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)shareableHandle = fd;
	} else if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
		struct fk_fab f;

		memset(&f, 0, sizeof(f));
		memcpy(f.magic, FK_FAB_MAGIC, sizeof(f.magic));
		f.pid = (int32_t)getpid();
		f.fd = p->fd;
		f.size = p->size;
		f.dev = p->dev;
		memcpy(f.nonce, p->nonce, sizeof(f.nonce));
		memset(shareableHandle, 0, sizeof(CUmemFabricHandle));
		memcpy(shareableHandle, &f, sizeof(f));
	} else {
		r = CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
						void *osHandle,
						CUmemAllocationHandleType shHandleType)
{
	struct fk_phys *p = NULL;
	int fd = -1;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (fk.ipc_open_fail)
		return CUDA_ERROR_MAP_FAILED;
	if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		fd = fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return CUDA_ERROR_INVALID_HANDLE;
	} else if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC) {
		struct fk_fab f;

		if (!osHandle)
			return CUDA_ERROR_INVALID_VALUE;
		memcpy(&f, osHandle, sizeof(f));
		if (memcmp(f.magic, FK_FAB_MAGIC, sizeof(f.magic)) != 0 || !fk.fabric)
			return CUDA_ERROR_INVALID_VALUE;
		f.nonce[sizeof(f.nonce) - 1] = '\0';
		fd = fk_open_remote(f.pid, f.fd, f.nonce, &r);
		if (fd < 0)
			return r;
	} else {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_lock(&fk.lock);
	r = fk_phys_adopt(fd, &p);
	if (r) {
		close(fd);
	} else {
		p->vmm = true;
		p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p->prop.location.id = p->dev;
		p->prop.requestedHandleTypes = shHandleType;
		*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
					       CUmemRangeHandleType handleType,
					       unsigned long long flags)
{
	struct fk_map *m;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || !size ||
	    size % FK_PAGE || (uintptr_t)dptr % FK_PAGE)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	m = fk_map_find((uintptr_t)dptr);
	/* The fake's dma-buf is the memfd itself: it starts at the allocation. */
	if (!m || m->va != (uintptr_t)dptr || size > fk_round(m->size, FK_PAGE)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		int fd = fcntl(m->phys->fd, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)handle = fd;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

/* --- pinned host memory ------------------------------------------------------------------- */

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	struct CUctx_st *c;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!p || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_hregs; i++) {
		if ((uintptr_t)p < fk.hregs[i].p + fk.hregs[i].size &&
		    fk.hregs[i].p < (uintptr_t)p + bytesize) {
			pthread_mutex_unlock(&fk.lock);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	}
	if (fk_map_find((uintptr_t)p)) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (fk.n_hregs == fk.cap_hregs) {
		size_t cap = fk.cap_hregs ? 2 * fk.cap_hregs : 8;
		struct fk_hostreg *n = realloc(fk.hregs, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&fk.lock);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		fk.hregs = n;
		fk.cap_hregs = cap;
	}
	fk.hregs[fk.n_hregs++] = (struct fk_hostreg){ (uintptr_t)p, bytesize };
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_hregs; i++) {
		if (fk.hregs[i].p == (uintptr_t)p) {
			fk.hregs[i] = fk.hregs[--fk.n_hregs];
			pthread_mutex_unlock(&fk.lock);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&fk.lock);
	return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* --- streams, copies, events -------------------------------------------------------------- */

static void *fk_stream_main(void *arg)
{
	struct CUstream_st *s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct fk_op op;

		while (!s->count && !s->stop)
			pthread_cond_wait(&s->work, &s->lock);
		if (!s->count)
			break;
		op = s->ring[s->head];
		pthread_mutex_unlock(&s->lock);
		if (fk.delay_us)
			usleep(fk.delay_us);
		if (op.sticky)
			atomic_store(&s->ctx->sticky, CUDA_ERROR_ILLEGAL_ADDRESS);
		else if (!atomic_load(&s->ctx->sticky))
			memcpy(op.dst, op.src, op.n);
		pthread_mutex_lock(&s->lock);
		s->head = (s->head + 1) % s->cap;
		s->count--;
		atomic_store_explicit(&s->completed, op.seq, memory_order_release);
		pthread_cond_broadcast(&s->done);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Streams are tracked so that handles can be checked and cuCtxSynchronize finds them. */
static struct CUstream_st **fk_streams;
static size_t fk_n_streams, fk_cap_streams;

static bool fk_stream_live(const struct CUstream_st *s)
{
	for (size_t i = 0; i < fk_n_streams; i++)
		if (fk_streams[i] == s)
			return true;
	return false;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	struct CUctx_st *c;
	struct CUstream_st *s;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!phStream)
		return CUDA_ERROR_INVALID_VALUE;
	s = calloc(1, sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->magic = FK_STREAM_MAGIC;
	s->ctx = c;
	s->cap = 64;
	s->ring = calloc(s->cap, sizeof(*s->ring));
	s->refs = 1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->done, NULL);
	pthread_mutex_lock(&fk.lock);
	if (fk_n_streams == fk_cap_streams) {
		size_t cap = fk_cap_streams ? 2 * fk_cap_streams : 16;
		struct CUstream_st **n = realloc(fk_streams, cap * sizeof(*n));

		if (n) {
			fk_streams = n;
			fk_cap_streams = cap;
		}
	}
	if (!s->ring || fk_n_streams == fk_cap_streams ||
	    pthread_create(&s->thread, NULL, fk_stream_main, s) != 0) {
		pthread_mutex_unlock(&fk.lock);
		free(s->ring);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	fk_streams[fk_n_streams++] = s;
	fk.n_streams++;
	pthread_mutex_unlock(&fk.lock);
	*phStream = s;
	return CUDA_SUCCESS;
}

/* Drop a reference; the last frees the stream (its thread was joined at destroy). */
static void fk_stream_unref(struct CUstream_st *s)
{
	if (atomic_fetch_sub(&s->refs, 1) > 1)
		return;
	s->magic = 0;
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->done);
	free(s->ring);
	free(s);
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	if (!hStream || !fk_stream_live(hStream)) {
		pthread_mutex_unlock(&fk.lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	for (size_t i = 0; i < fk_n_streams; i++) {
		if (fk_streams[i] == hStream) {
			fk_streams[i] = fk_streams[--fk_n_streams];
			break;
		}
	}
	fk.n_streams--;
	pthread_mutex_unlock(&fk.lock);
	/* Work already enqueued still runs, as on a GPU. */
	pthread_mutex_lock(&hStream->lock);
	hStream->stop = true;
	pthread_cond_signal(&hStream->work);
	pthread_mutex_unlock(&hStream->lock);
	pthread_join(hStream->thread, NULL);
	fk_stream_unref(hStream);
	return CUDA_SUCCESS;
}

/* A stream handle of this driver; its context's sticky error if it has one. */
static CUresult fk_stream_check(CUstream s)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (s) {
		if (s->magic != FK_STREAM_MAGIC)
			return CUDA_ERROR_INVALID_HANDLE;
		r = (CUresult)atomic_load(&s->ctx->sticky);
	}
	return r;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	CUresult r = fk_stream_check(hStream);

	if (r || !hStream)
		return r;
	pthread_mutex_lock(&hStream->lock);
	while (atomic_load(&hStream->completed) < atomic_load(&hStream->enqueued))
		pthread_cond_wait(&hStream->done, &hStream->lock);
	pthread_mutex_unlock(&hStream->lock);
	return (CUresult)atomic_load(&hStream->ctx->sticky);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	CUresult r = fk_stream_check(hStream);
	bool idle;

	if (r || !hStream)
		return r;
	pthread_mutex_lock(&hStream->lock);
	idle = atomic_load(&hStream->completed) >= atomic_load(&hStream->enqueued);
	pthread_mutex_unlock(&hStream->lock);
	return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	struct CUctx_st *c;
	CUresult r = fk_cur(&c);
	struct CUstream_st *mine[256];
	size_t n = 0;

	if (r)
		return r;
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk_n_streams && n < 256; i++) {
		if (fk_streams[i]->ctx == c) {
			atomic_fetch_add(&fk_streams[i]->refs, 1);
			mine[n++] = fk_streams[i];
		}
	}
	pthread_mutex_unlock(&fk.lock);
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&mine[i]->lock);
		while (atomic_load(&mine[i]->completed) < atomic_load(&mine[i]->enqueued))
			pthread_cond_wait(&mine[i]->done, &mine[i]->lock);
		pthread_mutex_unlock(&mine[i]->lock);
	}
	for (size_t i = 0; i < n; i++)
		fk_stream_unref(mine[i]);
	return (CUresult)atomic_load(&c->sticky);
}

/*
 * The device map each end of this thread's last copy fell in, valid while fk.map_gen stays:
 * a copy between the same allocations as the last one needs no lock (what the driver costs
 * should not hide what te costs in te-bench's per-slice figures).
 */
struct fk_tcache {
	uint64_t gen;
	uintptr_t va;
	size_t size;
	uint8_t *base;
	int dev;
	bool ok; /* @dev may access it (read-write for the destination) */
};

static FK_TLS struct fk_tcache fk_tc[2];

static bool fk_tc_hit(const struct fk_tcache *c, uint64_t gen, uintptr_t p, size_t n, int dev,
		      uint8_t **out)
{
	if (c->gen != gen || !c->base || c->dev != dev || !c->ok || p < c->va ||
	    p - c->va > c->size || n > c->size - (p - c->va))
		return false;
	*out = c->base + (p - c->va);
	return true;
}

static void fk_tc_fill(struct fk_tcache *c, uint64_t gen, uintptr_t p, int dev)
{
	struct fk_map *m = fk_map_find(p);
	uint8_t *base;

	c->base = NULL;
	if (!m || fk_translate(m->va, 0, dev, c == &fk_tc[0], &base) != CUDA_SUCCESS)
		return;
	c->gen = gen;
	c->va = m->va;
	c->size = m->size;
	c->base = base;
	c->dev = dev;
	c->ok = true;
}

/* Resolve both ends of a copy run by device @dev (-1: no device restriction). */
static CUresult fk_copy_ends(CUdeviceptr dst, CUdeviceptr src, size_t n, int dev, uint8_t **d,
			     uint8_t **s)
{
	uint64_t gen = atomic_load_explicit(&fk.map_gen, memory_order_acquire);
	CUresult r;

	if (fk_tc_hit(&fk_tc[0], gen, (uintptr_t)dst, n, dev, d) &&
	    fk_tc_hit(&fk_tc[1], gen, (uintptr_t)src, n, dev, s))
		return CUDA_SUCCESS;
	pthread_mutex_lock(&fk.lock);
	gen = atomic_load_explicit(&fk.map_gen, memory_order_acquire);
	r = fk_translate((uintptr_t)dst, n, dev, true, d);
	if (!r)
		r = fk_translate((uintptr_t)src, n, dev, false, s);
	if (!r) {
		fk_tc_fill(&fk_tc[0], gen, (uintptr_t)dst, dev);
		fk_tc_fill(&fk_tc[1], gen, (uintptr_t)src, dev);
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	struct CUctx_st *c;
	uint8_t *d, *s;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!ByteCount)
		return CUDA_SUCCESS;
	r = fk_copy_ends(dst, src, ByteCount, c->dev, &d, &s);
	if (r)
		return r;
	if (fk.sync_faults) {
		long long k = atomic_fetch_add(&fk.copies, 1); /* this is copy number k + 1 */

		if (fk.fail_after >= 0 && k >= fk.fail_after &&
		    (fk.fail_count <= 0 || k < fk.fail_after + fk.fail_count))
			return CUDA_ERROR_UNKNOWN;
		if (fk.delay_us)
			usleep(fk.delay_us);
	}
	memmove(d, s, ByteCount);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	struct CUctx_st *c;
	struct fk_op op = { 0 };
	long long k;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!hStream)
		return cuMemcpy(dst, src, ByteCount);
	r = fk_stream_check(hStream);
	if (r)
		return r;
	if (hStream->ctx != c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!ByteCount)
		return CUDA_SUCCESS;
	r = fk_copy_ends(dst, src, ByteCount, c->dev, &op.dst, (uint8_t **)&op.src);
	if (r)
		return r;
	if (fk.fail_after >= 0 || fk.sticky_after >= 0) {
		k = atomic_fetch_add(&fk.copies, 1); /* this is copy number k + 1 */
		if (fk.fail_after >= 0 && k >= fk.fail_after &&
		    (fk.fail_count <= 0 || k < fk.fail_after + fk.fail_count))
			return CUDA_ERROR_UNKNOWN;
		op.sticky = fk.sticky_after >= 0 && k >= fk.sticky_after;
	}
	op.n = ByteCount;
	pthread_mutex_lock(&hStream->lock);
	if (fk.inline_copies && !hStream->count && !op.sticky && !fk.delay_us) {
		/* In order: nothing is queued before it. */
		memcpy(op.dst, op.src, op.n);
		op.seq = atomic_load_explicit(&hStream->enqueued, memory_order_relaxed) + 1;
		atomic_store_explicit(&hStream->enqueued, op.seq, memory_order_release);
		atomic_store_explicit(&hStream->completed, op.seq, memory_order_release);
		pthread_mutex_unlock(&hStream->lock);
		return CUDA_SUCCESS;
	}
	if (hStream->count == hStream->cap) {
		size_t cap = 2 * hStream->cap;
		struct fk_op *ring = malloc(cap * sizeof(*ring));

		if (!ring) {
			pthread_mutex_unlock(&hStream->lock);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		for (size_t i = 0; i < hStream->count; i++)
			ring[i] = hStream->ring[(hStream->head + i) % hStream->cap];
		free(hStream->ring);
		hStream->ring = ring;
		hStream->head = 0;
		hStream->cap = cap;
	}
	op.seq = atomic_load_explicit(&hStream->enqueued, memory_order_relaxed) + 1;
	atomic_store_explicit(&hStream->enqueued, op.seq, memory_order_release);
	hStream->ring[(hStream->head + hStream->count) % hStream->cap] = op;
	hStream->count++;
	pthread_cond_signal(&hStream->work);
	pthread_mutex_unlock(&hStream->lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	return cuMemcpyAsync(dstDevice, srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	struct CUctx_st *c;
	struct CUevent_st *e;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!phEvent || Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_VALUE;
	e = calloc(1, sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->ctx = c;
	e->flags = Flags;
	pthread_mutex_init(&e->lock, NULL);
	pthread_mutex_lock(&fk.lock);
	fk.n_events++;
	pthread_mutex_unlock(&fk.lock);
	*phEvent = e;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	if (hEvent->stream)
		fk_stream_unref(hEvent->stream);
	pthread_mutex_lock(&fk.lock);
	fk.n_events--;
	pthread_mutex_unlock(&fk.lock);
	pthread_mutex_destroy(&hEvent->lock);
	free(hEvent);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	struct CUstream_st *old;
	uint64_t seq = 0;
	CUresult r = fk_stream_check(hStream);

	if (r)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	if (atomic_load(&hEvent->ctx->sticky))
		return (CUresult)atomic_load(&hEvent->ctx->sticky);
	if (hStream) {
		/* What was enqueued before this call (the caller orders its own calls). */
		seq = atomic_load(&hStream->enqueued);
		atomic_fetch_add(&hStream->refs, 1);
	}
	pthread_mutex_lock(&hEvent->lock);
	old = hEvent->stream;
	hEvent->stream = hStream;
	hEvent->seq = seq;
	pthread_mutex_unlock(&hEvent->lock);
	if (old)
		fk_stream_unref(old);
	return CUDA_SUCCESS;
}

/* The stream and sequence an event waits for, with a reference on the stream (or NULL). */
static struct CUstream_st *fk_event_target(CUevent e, uint64_t *seq)
{
	struct CUstream_st *s;

	pthread_mutex_lock(&e->lock);
	s = e->stream;
	*seq = e->seq;
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&e->lock);
	return s;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	struct CUstream_st *s;
	uint64_t seq;
	bool done;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	if (atomic_load(&hEvent->ctx->sticky))
		return (CUresult)atomic_load(&hEvent->ctx->sticky);
	/* The event's own reference keeps its stream while its lock is held. */
	pthread_mutex_lock(&hEvent->lock);
	s = hEvent->stream;
	seq = hEvent->seq;
	done = !s || atomic_load_explicit(&s->completed, memory_order_acquire) >= seq;
	pthread_mutex_unlock(&hEvent->lock);
	if (atomic_load(&hEvent->ctx->sticky))
		return (CUresult)atomic_load(&hEvent->ctx->sticky);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	struct CUstream_st *s;
	uint64_t seq;
	CUresult r = fk_ready();

	if (r)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	s = fk_event_target(hEvent, &seq);
	if (s) {
		pthread_mutex_lock(&s->lock);
		while (atomic_load(&s->completed) < seq)
			pthread_cond_wait(&s->done, &s->lock);
		pthread_mutex_unlock(&s->lock);
		fk_stream_unref(s);
	}
	return (CUresult)atomic_load(&hEvent->ctx->sticky);
}

/* --- entry points ------------------------------------------------------------------------- */

/* Each entry: the base name, the CUDA version that introduced this variant, the function. */
#define FK_FN(name, ver)                                                                           \
	{                                                                                          \
#name, ver, (void *)(name)                                                         \
	}
#define FK_FN_AS(base, fn, ver)                                                                    \
	{                                                                                          \
		base, ver, (void *)(fn)                                                            \
	}

static const struct {
	const char *name;
	int version;
	void *fn;
} fk_table[] = {
	FK_FN(cuInit, 2000),
	FK_FN(cuDriverGetVersion, 2020),
	FK_FN(cuGetErrorString, 6000),
	FK_FN(cuGetErrorName, 6000),
	FK_FN(cuDeviceGetCount, 2000),
	FK_FN(cuDeviceGet, 2000),
	FK_FN(cuDeviceGetName, 2000),
	FK_FN(cuDeviceGetAttribute, 2000),
	FK_FN(cuDeviceGetPCIBusId, 4010),
	FK_FN_AS("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
	FK_FN(cuDeviceCanAccessPeer, 4000),
	FK_FN(cuDevicePrimaryCtxRetain, 7000),
	FK_FN_AS("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
	FK_FN(cuCtxSetCurrent, 4000),
	FK_FN(cuCtxGetCurrent, 4000),
	FK_FN(cuCtxEnablePeerAccess, 4000),
	FK_FN(cuCtxSynchronize, 2000),
	FK_FN_AS("cuMemAlloc", cuMemAlloc_v2, 3020),
	FK_FN_AS("cuMemFree", cuMemFree_v2, 3020),
	FK_FN_AS("cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020),
	FK_FN(cuPointerGetAttribute, 4000),
	FK_FN(cuPointerGetAttributes, 7000),
	FK_FN(cuIpcGetMemHandle, 4010),
	FK_FN_AS("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2, 11000),
	FK_FN(cuIpcCloseMemHandle, 4010),
	FK_FN(cuMemCreate, 10020),
	FK_FN(cuMemRelease, 10020),
	FK_FN(cuMemAddressReserve, 10020),
	FK_FN(cuMemAddressFree, 10020),
	FK_FN(cuMemMap, 10020),
	FK_FN(cuMemUnmap, 10020),
	FK_FN(cuMemSetAccess, 10020),
	FK_FN(cuMemGetAllocationGranularity, 10020),
	FK_FN(cuMemExportToShareableHandle, 10020),
	FK_FN(cuMemImportFromShareableHandle, 10020),
	FK_FN(cuMemRetainAllocationHandle, 11000),
	FK_FN(cuMemGetAllocationPropertiesFromHandle, 10020),
	FK_FN(cuMemGetHandleForAddressRange, 11070),
	FK_FN_AS("cuMemHostRegister", cuMemHostRegister_v2, 6050),
	FK_FN(cuMemHostUnregister, 4000),
	FK_FN(cuStreamCreate, 2000),
	FK_FN_AS("cuStreamDestroy", cuStreamDestroy_v2, 4000),
	FK_FN(cuStreamSynchronize, 2000),
	FK_FN(cuStreamQuery, 2000),
	FK_FN(cuMemcpy, 4000),
	FK_FN(cuMemcpyAsync, 4000),
	FK_FN_AS("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, 3020),
	FK_FN(cuEventCreate, 2000),
	FK_FN_AS("cuEventDestroy", cuEventDestroy_v2, 4000),
	FK_FN(cuEventRecord, 2000),
	FK_FN(cuEventQuery, 2000),
	FK_FN(cuEventSynchronize, 2000),
};

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
				  CUdriverProcAddressQueryResult *symbolStatus)
{
	bool found = false;

	pthread_once(&fk.once, fk_init_once);
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	/* A driver older than the version asked for refuses, as the real one does. */
	if (cudaVersion > fk.version) {
		if (symbolStatus)
			*symbolStatus = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; i < sizeof(fk_table) / sizeof(fk_table[0]); i++) {
		if (strcmp(fk_table[i].name, symbol) != 0)
			continue;
		found = true;
		if (fk_table[i].version <= cudaVersion) {
			*pfn = fk_table[i].fn;
			if (symbolStatus)
				*symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
			return CUDA_SUCCESS;
		}
	}
	if (symbolStatus)
		*symbolStatus = found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

/* --- for tests ---------------------------------------------------------------------------- */

__attribute__((visibility("default"))) void fakecuda_live(struct fakecuda_live *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&fk.lock);
	for (size_t i = 0; i < fk.n_maps; i++) {
		if (fk.maps[i].kind == FK_MAP_ALLOC)
			out->allocs++;
		else if (fk.maps[i].kind == FK_MAP_IPC)
			out->ipc_maps++;
		else
			out->vmm_maps++;
	}
	for (const struct fk_phys *p = fk.phys; p; p = p->next)
		out->vmm_handles += p->vmm;
	out->reservations = (int)fk.n_resv;
	out->host_regs = (int)fk.n_hregs;
	out->streams = fk.n_streams;
	out->events = fk.n_events;
	for (int i = 0; i < FK_MAX_DEV; i++)
		out->ctx_refs += fk.ctx[i].refs;
	pthread_mutex_unlock(&fk.lock);
}
