/* SPDX-License-Identifier: Apache-2.0 */
/* nvlink.c: the nvlink transport: CUDA copies between GPU memory of processes (CUDA driver API). */

/*
 * Shape of the plugin (README.md has the options, formats and semantics):
 *
 * Driver. init dlopens the CUDA driver (option library, default libcuda.so.1), takes only
 * cuGetProcAddress_v2 and cuDriverGetVersion from it by name and resolves every other entry
 * point through cuGetProcAddress at NVLINK_CUDA_VERSION: nothing links against libcuda. No
 * driver, an old driver or no GPU fails init with TE_ERR_NO_DEVICE and the driver's own words.
 *
 * Devices. One te device per visible GPU (its primary context retained), with a pool of
 * non-blocking streams, each with a ring of preallocated events. Peer access is enabled
 * between every pair cuDeviceCanAccessPeer allows; it decides which GPU can copy to which.
 *
 * Memory. The plugin owns memory kind CUDA (mem_query, mem_copy, mem_dmabuf, mem_alloc). A
 * registered cuda:N region publishes how a peer maps its allocation: a legacy IPC handle
 * (cuMemAlloc memory), a FABRIC handle (VMM memory that allows it, where the driver supports
 * it: peers on other hosts of the NVLink domain) or a POSIX file descriptor (other VMM memory),
 * which the peer fetches over this instance's unix socket (nvlink_sock.c). The importing side
 * maps each remote allocation once per peer instance (the import cache) and unmaps it when the
 * last key using it is released. Host regions are the local side only, pinned with
 * cuMemHostRegister (option pin_host). A peer in the same process needs no import: its device
 * pointers are valid here.
 *
 * Data path. submit launches one cuMemcpyAsync per slice on a stream of the copying GPU (the
 * local GPU, or for a host buffer the GPU owning the remote memory); slices launched back to
 * back on one stream form a launch group whose last slot's event is recorded after them.
 * progress (MANUAL: the core's waiting thread, or its workers) queries each stream's oldest
 * group and hands its slices back. wait parks the caller on a condition that a helper thread
 * signals when the oldest group's event completes (cuEventSynchronize on blocking-sync events),
 * so no core spins while copies run. Failures found in submit are queued (nvlink_defer) and
 * reported by the next progress, never from inside submit. slice->priv is not used.
 *
 * Failures. A sticky context error (CUDA_ERROR_ILLEGAL_ADDRESS and the like) marks the GPU
 * failed: its slices in flight and every later one fail with TE_ERR_DEVICE_FAILED and the
 * driver's text, and the core is told the device is down. Cancel cannot stop a launched copy:
 * the slice is handed back when its event completes, with its real outcome.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin_opts.h>

#include "nvlink.h"

#define NVLINK_KEY_MAGIC 0x314b564eu  /* "NVK1" */
#define NVLINK_BLOB_MAGIC 0x3142564eu /* "NVB1" */
#define NVLINK_KEY_VERSION 1u
#define NVLINK_BLOB_VERSION 1u
#define NVLINK_PAGE 4096ull
#define NVLINK_REAP_CHUNK 64u
#define NVLINK_DEF_SLICE (8ull << 20)

enum nvlink_kind {
	NVLINK_KIND_NONE = 0,	/* host memory, or local only: no key */
	NVLINK_KIND_IPC = 1,	/* legacy IPC handle (cuMemAlloc) */
	NVLINK_KIND_FD = 2,	/* VMM allocation, POSIX fd over the unix socket */
	NVLINK_KIND_FABRIC = 3, /* VMM allocation, FABRIC handle */
};

static const char *const nvlink_kind_names[] = { "none", "ipc", "fd", "fabric" };

enum nvlink_alloc_mode {
	NVLINK_ALLOC_LEGACY = 0,
	NVLINK_ALLOC_VMM = 1,
};

enum nvlink_fabric_mode {
	NVLINK_FABRIC_AUTO = 0,
	NVLINK_FABRIC_OFF = 1,
};

/* --- wire formats (little-endian, as te runs on) -------------------------------------------- */

/* Published blob: who this instance is, so peers can tell process, host and liveness. */
struct nvlink_blob {
	uint32_t magic;
	uint8_t version;
	uint8_t flags; /* bit 0: FABRIC handles usable */
	uint16_t reserved;
	uint8_t host[16]; /* boot id */
	uint64_t pidns;	  /* inode of /proc/self/ns/pid */
	uint32_t pid;
	uint32_t reserved2;
	uint64_t starttime; /* of the process, clock ticks after boot */
	uint64_t nonce;	    /* of this instance */
};

/* Region key: what a peer needs to map the region's allocation. */
struct nvlink_key {
	uint32_t magic;
	uint8_t version;
	uint8_t kind;	/* enum nvlink_kind */
	uint8_t access; /* TE_PLUGIN_ACCESS_* */
	uint8_t reserved;
	int32_t dev; /* exporter's device ordinal */
	uint32_t reserved2;
	uint64_t addr; /* the region */
	uint64_t length;
	uint64_t alloc_base; /* the allocation holding it, exporter's address */
	uint64_t alloc_size;
	uint64_t export_id; /* NVLINK_KIND_FD */
	char pci[32];	    /* the exporter's GPU */
	uint8_t handle[64]; /* CUipcMemHandle or CUmemFabricHandle */
};

_Static_assert(sizeof(CUipcMemHandle) == 64, "IPC handle size");
_Static_assert(sizeof(CUmemFabricHandle) == 64, "fabric handle size");

/* --- objects ------------------------------------------------------------------------------- */

struct nvlink_dev;

struct nvlink_stream {
	pthread_mutex_t lock;
	struct nvlink_dev *dev;
	CUstream s;
	CUevent *ev; /* per slot; recorded at the last slot of each launch group */
	_Atomic(struct te_plugin_slice *) *ring;
	uint32_t *gend; /* per slot: the slot ending its launch group (whose event tells) */
	uint64_t *seq;	/* per slot: launch order, for the wait helper */
	uint32_t cap;
	uint32_t head;
	atomic_uint count; /* written under lock; read without it to skip idle streams */
};

struct nvlink_dev {
	int ordinal;
	CUdevice cudev;
	CUcontext ctx;
	bool ctx_retained;
	char gpu[64];
	char pci[32];
	int numa;
	bool fabric;
	bool dmabuf;
	uint64_t peers; /* devices this one reaches with peer access enabled */
	atomic_bool failed;
	pthread_mutex_t fail_lock;
	char fail[NVLINK_DETAIL];
	struct nvlink_stream *streams;
	uint32_t n_streams;
	atomic_uint rr;
};

/* A remote allocation mapped here, shared by the keys of one peer instance. */
struct nvlink_import {
	struct nvlink_import *next;
	int refs; /* under imp_lock */
	uint64_t peer_nonce;
	uint8_t kind;
	uint64_t alloc_base;
	uint64_t alloc_size;
	CUdeviceptr local; /* where the allocation starts here */
	size_t map_size;   /* VMM: bytes reserved and mapped */
	int owner;	   /* local ordinal of the GPU holding it, -1 not visible here */
	int copy_dev;	   /* GPU that copies for a host buffer */
	uint64_t reach;	   /* local GPUs that can copy to and from it */
};

/* Membership of the instance's lists of what the core holds (fini frees what is left). */
struct nvlink_link {
	struct nvlink_link *prev, *next;
};

struct te_plugin_rkey {
	struct nvlink_link link;
	uint64_t addr;
	uint64_t length;
	uint32_t access;
	uint64_t local;		   /* this process's address of addr */
	int copy_dev;		   /* GPU that copies for a host buffer */
	uint64_t reach;		   /* GPUs that can copy to and from it */
	struct nvlink_import *imp; /* NULL: same process, or broken */
	int exporter_dev;
	char exporter_pci[32];
	enum te_status broken; /* TE_OK, or why every slice using it fails */
	char why[NVLINK_DETAIL];
};

struct te_plugin_peer {
	struct nvlink_link link;
	char name[128];
	struct nvlink_blob blob;
	bool same_process;
	bool same_host;
};

struct te_plugin_mem {
	struct nvlink_link link;
	void *addr;
	uint64_t length;
	uint32_t type;
	int32_t dev;
	uint32_t access;
	bool pinned;
	struct nvlink_key key; /* kind NONE: nothing published */
};

/* Allocations of mem_alloc, to tell legacy from VMM at mem_free and to free leftovers. */
struct nvlink_alloc {
	struct nvlink_alloc *next;
	CUdeviceptr ptr;
	size_t size; /* VMM: reserved and mapped bytes */
	bool vmm;
	int dev;
};

/* Why a slice queued to fail does (its detail is written when it is reported). */
enum nvlink_why {
	NVLINK_WHY_TEXT,     /* @text: a key's or a failed device's reason, stable while queued */
	NVLINK_WHY_RANGE,    /* remote range or access outside the key */
	NVLINK_WHY_NODEV,    /* the copying GPU is not a device here */
	NVLINK_WHY_NOPATH,   /* no peer access from the copying GPU to the remote memory */
	NVLINK_WHY_COPY,     /* cuMemcpyAsync failed (@cu) */
	NVLINK_WHY_CTX,	     /* cuCtxSetCurrent failed (@cu) */
	NVLINK_WHY_INTERNAL, /* no key or region */
};

/*
 * A slice queued to fail (found in submit, reported by progress). The plugin keeps no state in
 * slice->priv (slice_priv_size 0: the core's slice arrays stay as small as they can): a slice in
 * flight is known by its ring slot, a failing one by this entry.
 */
struct nvlink_failed {
	struct te_plugin_slice *s;
	const char *text;
	int32_t status;
	int32_t why; /* enum nvlink_why */
	int32_t cu;  /* CUresult */
};

struct nvlink_waiter {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t kick;
	pthread_cond_t woke;
	unsigned sleepers;
	uint64_t gen;
	bool stop;
};

struct nvlink_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	void *dl;
	struct nvlink_cu cu;
	int driver_version;
	/* options */
	char library[256];
	uint32_t streams_per_dev;
	uint32_t window;
	uint64_t slice_size;
	bool pin_host;
	unsigned alloc_mode;
	unsigned fabric_mode;
	uint32_t fetch_timeout_ms;
	/* identity */
	uint64_t nonce;
	struct nvlink_blob blob;
	bool auth;
	bool fabric; /* every device can export and import FABRIC handles */
	/* devices */
	struct nvlink_dev *devs;
	uint32_t n_devs;
	atomic_uint_fast64_t launch_seq;
	/* failures found in submit, reported by progress */
	pthread_mutex_t defer_lock;
	struct nvlink_failed *defers; /* grows on failures only, never on the data path */
	uint32_t n_defers, cap_defers;
	atomic_uint n_defer;
	/* imports, exports, allocations */
	pthread_mutex_t imp_lock;
	struct nvlink_import *imports;
	pthread_mutex_t exp_lock;
	struct nvlink_export *exports;
	uint64_t next_export;
	pthread_mutex_t alloc_lock;
	struct nvlink_alloc *allocs;
	/* Registrations, peers and keys the core holds; under obj_lock. */
	pthread_mutex_t obj_lock;
	struct nvlink_link mems, peers, rkeys;
	struct nvlink_sock sock;
	struct nvlink_waiter waiter;
};

static void nvlink_link_add(struct nvlink_inst *ni, struct nvlink_link *head, struct nvlink_link *l)
{
	pthread_mutex_lock(&ni->obj_lock);
	l->next = head->next;
	l->prev = head;
	head->next->prev = l;
	head->next = l;
	pthread_mutex_unlock(&ni->obj_lock);
}

static void nvlink_link_del(struct nvlink_inst *ni, struct nvlink_link *l)
{
	pthread_mutex_lock(&ni->obj_lock);
	l->prev->next = l->next;
	l->next->prev = l->prev;
	l->next = l->prev = l;
	pthread_mutex_unlock(&ni->obj_lock);
}

static inline struct nvlink_inst *nvlink_of(struct te_plugin_inst *inst)
{
	return (struct nvlink_inst *)inst;
}


/* --- accessors for nvlink_sock.c ------------------------------------------------------------- */

const struct te_plugin_host *nvlink_host(const struct nvlink_inst *ni)
{
	return ni->host;
}

struct te_plugin_host_ctx *nvlink_ctx(const struct nvlink_inst *ni)
{
	return ni->ctx;
}

uint64_t nvlink_nonce(const struct nvlink_inst *ni)
{
	return ni->nonce;
}

bool nvlink_auth(const struct nvlink_inst *ni)
{
	return ni->auth;
}

struct nvlink_sock *nvlink_sock_of(struct nvlink_inst *ni)
{
	return &ni->sock;
}

bool nvlink_export_dup(struct nvlink_inst *ni, uint64_t id, int *fd_out, uint64_t *size_out)
{
	bool found = false;

	pthread_mutex_lock(&ni->exp_lock);
	for (struct nvlink_export *x = ni->exports; x; x = x->next) {
		if (x->id != id)
			continue;
		*fd_out = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
		*size_out = x->size;
		found = *fd_out >= 0;
		break;
	}
	pthread_mutex_unlock(&ni->exp_lock);
	return found;
}

/* --- errors --------------------------------------------------------------------------------- */

/* Log @text, a detail that starts with "nvlink: " (the host prefixes the plugin name itself). */
static void nvlink_log_detail(struct nvlink_inst *ni, enum te_plugin_log_level level,
			      const char *text)
{
	static const char prefix[] = NVLINK_NAME ": ";

	if (strncmp(text, prefix, sizeof(prefix) - 1) == 0)
		text += sizeof(prefix) - 1;
	ni->host->log(ni->ctx, level, "%s", text);
}

static void nvlink_error(struct nvlink_inst *ni, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);
static void nvlink_error(struct nvlink_inst *ni, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	ni->host->set_error(ni->ctx, "%s", buf);
	nvlink_log_detail(ni, TE_PLUGIN_LOG_DEBUG, buf);
}

/* "CUDA_ERROR_X: driver text" for @r into @buf. */
static const char *nvlink_cu_str(const struct nvlink_inst *ni, CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (ni->cu.cuGetErrorName)
		(void)ni->cu.cuGetErrorName(r, &name);
	if (ni->cu.cuGetErrorString)
		(void)ni->cu.cuGetErrorString(r, &text);
	if (name && text)
		snprintf(buf, len, "%s: %s", name, text);
	else
		snprintf(buf, len, "CUresult %d", (int)r);
	return buf;
}

/* Errors after which the context (and so the GPU, for this process) is unusable. */
static bool nvlink_cu_sticky(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_NVLINK_UNCORRECTABLE:
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
		return true;
	default:
		return false;
	}
}

/* Mark @d failed for good (a sticky error): its slices fail from now on, the core is told. */
static void nvlink_dev_fail(struct nvlink_inst *ni, struct nvlink_dev *d, const char *where,
			    CUresult r)
{
	char why[NVLINK_DETAIL], cs[128];
	bool first;

	pthread_mutex_lock(&d->fail_lock);
	first = !atomic_load_explicit(&d->failed, memory_order_relaxed);
	if (first) {
		snprintf(d->fail, sizeof(d->fail), NVLINK_NAME ": cuda:%d (%s): %s: %s", d->ordinal,
			 d->pci, where, nvlink_cu_str(ni, r, cs, sizeof(cs)));
		atomic_store_explicit(&d->failed, true, memory_order_release);
	}
	snprintf(why, sizeof(why), "%s", d->fail);
	pthread_mutex_unlock(&d->fail_lock);
	if (first) {
		ni->host->log(ni->ctx, TE_PLUGIN_LOG_ERROR,
			      "%s; the GPU is unusable in this process",
			      why + strlen(NVLINK_NAME ": "));
		ni->host->device_event(ni->ctx, (uint32_t)d->ordinal, TE_PLUGIN_EVENT_DOWN, why);
	}
}

/* The failure text of a failed device (copied: the device may be failing concurrently). */
static void nvlink_dev_why(struct nvlink_dev *d, char *buf, size_t len)
{
	pthread_mutex_lock(&d->fail_lock);
	snprintf(buf, len, "%s", d->fail);
	pthread_mutex_unlock(&d->fail_lock);
}

static CUresult nvlink_set_dev(struct nvlink_inst *ni, const struct nvlink_dev *d)
{
	return ni->cu.cuCtxSetCurrent(d->ctx);
}

static struct nvlink_dev *nvlink_dev_get(struct nvlink_inst *ni, int32_t dev)
{
	return dev >= 0 && (uint32_t)dev < ni->n_devs ? &ni->devs[dev] : NULL;
}

/* --- identity -------------------------------------------------------------------------------- */

static int nvlink_hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The boot id as 16 bytes (what the core calls the host id), zeros if unreadable. */
static void nvlink_host_id(uint8_t out[16])
{
	char buf[64] = { 0 };
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	size_t k = 0;

	memset(out, 0, 16);
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f)) {
		for (size_t i = 0; buf[i] && k < 32; i++) {
			int v = nvlink_hex(buf[i]);

			if (v < 0)
				continue;
			out[k / 2] = (uint8_t)(out[k / 2] | (k % 2 ? v : v << 4));
			k++;
		}
	}
	fclose(f);
}

/* Start time of process @pid (clock ticks after boot), 0 when it does not exist. */
static uint64_t nvlink_starttime(uint32_t pid)
{
	char path[64], buf[1024];
	const char *p;
	FILE *f;
	size_t n;
	unsigned long long v = 0;

	snprintf(path, sizeof(path), "/proc/%" PRIu32 "/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!p)
		return 0;
	/* Fields after the name start with the state (field 3); starttime is field 22. */
	if (sscanf(p + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
		   "%*d %llu",
		   &v) != 1)
		return 0;
	return v;
}

static uint64_t nvlink_pidns(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* --- options --------------------------------------------------------------------------------- */

static const char *const nvlink_option_names[] = {
	"library",  "streams", "window", "slice_size",
	"pin_host", "alloc",   "fabric", "fetch_timeout_ms",
};

static enum te_status nvlink_opt_u64(struct nvlink_inst *ni, const char *key, uint64_t def,
				     uint64_t min, uint64_t max, bool size_suffix, uint64_t *out)
{
	const char *s = ni->host->config_get(ni->ctx, key);

	if (!s || !*s) {
		*out = def;
		return TE_OK;
	}
	if (te_plugin_parse_u64(s, size_suffix, min, max, out))
		return TE_OK;
	nvlink_error(ni,
		     NVLINK_NAME ": option '%s': expected an integer%s in [%" PRIu64 ", %" PRIu64
				 "], got '%s'",
		     key, size_suffix ? " (optional " TE_PLUGIN_SIZE_SUFFIXES " suffix)" : "", min,
		     max, s);
	return TE_ERR_CONFIG;
}

static enum te_status nvlink_opt_enum(struct nvlink_inst *ni, const char *key,
				      const char *const *choices, unsigned def, unsigned *out)
{
	const char *s = ni->host->config_get(ni->ctx, key);
	char list[128];
	size_t n = 0;
	int i;

	if (!s || !*s) {
		*out = def;
		return TE_OK;
	}
	i = te_plugin_parse_enum(s, choices);
	if (i >= 0) {
		*out = (unsigned)i;
		return TE_OK;
	}
	while (choices[n])
		n++;
	nvlink_error(ni, NVLINK_NAME ": option '%s': '%s' is not one of %s", key, s,
		     te_plugin_join(choices, n, list, sizeof(list)));
	return TE_ERR_CONFIG;
}

static enum te_status nvlink_options(struct nvlink_inst *ni)
{
	static const char *const alloc_modes[] = { "legacy", "vmm", NULL };
	static const char *const fabric_modes[] = { "auto", "off", NULL };
	const char *s;
	char bad[64];
	uint64_t v;
	enum te_status st;

	if (te_plugin_unknown_option(ni->host, ni->ctx, nvlink_option_names,
				     TE_PLUGIN_ARRAY_LEN(nvlink_option_names), bad, sizeof(bad))) {
		char list[256];

		nvlink_error(ni, NVLINK_NAME ": unknown option '%s' (known: %s)", bad,
			     te_plugin_join(nvlink_option_names,
					    TE_PLUGIN_ARRAY_LEN(nvlink_option_names), list,
					    sizeof(list)));
		return TE_ERR_CONFIG;
	}
	s = ni->host->config_get(ni->ctx, "library");
	if (s && (!*s || strlen(s) >= sizeof(ni->library))) {
		nvlink_error(ni,
			     NVLINK_NAME ": option 'library': expected a file name of 1..%zu "
					 "bytes",
			     sizeof(ni->library) - 1);
		return TE_ERR_CONFIG;
	}
	snprintf(ni->library, sizeof(ni->library), "%s", s ? s : "libcuda.so.1");
	st = nvlink_opt_u64(ni, "streams", 4, 1, 64, false, &v);
	if (st != TE_OK)
		return st;
	ni->streams_per_dev = (uint32_t)v;
	st = nvlink_opt_u64(ni, "window", 256, 1, 4096, false, &v);
	if (st != TE_OK)
		return st;
	ni->window = (uint32_t)v;
	st = nvlink_opt_u64(ni, "slice_size", NVLINK_DEF_SLICE, 4096, 1ull << 40, true,
			    &ni->slice_size);
	if (st != TE_OK)
		return st;
	s = ni->host->config_get(ni->ctx, "pin_host");
	ni->pin_host = true;
	if (s && !te_plugin_parse_bool(s, &ni->pin_host)) {
		nvlink_error(
			ni, NVLINK_NAME ": option 'pin_host': expected true or false, got '%s'", s);
		return TE_ERR_CONFIG;
	}
	st = nvlink_opt_enum(ni, "alloc", alloc_modes, NVLINK_ALLOC_LEGACY, &ni->alloc_mode);
	if (st != TE_OK)
		return st;
	st = nvlink_opt_enum(ni, "fabric", fabric_modes, NVLINK_FABRIC_AUTO, &ni->fabric_mode);
	if (st != TE_OK)
		return st;
	st = nvlink_opt_u64(ni, "fetch_timeout_ms", 5000, 10, 600000, false, &v);
	if (st != TE_OK)
		return st;
	ni->fetch_timeout_ms = (uint32_t)v;
	return TE_OK;
}

/* --- driver -------------------------------------------------------------------------------- */

typedef CUresult (*nvlink_getproc_fn)(const char *symbol, void **pfn, int cudaVersion,
				      cuuint64_t flags, CUdriverProcAddressQueryResult *status);
typedef CUresult (*nvlink_version_fn)(int *version);

static enum te_status nvlink_driver_open(struct nvlink_inst *ni)
{
	nvlink_getproc_fn getproc;
	nvlink_version_fn version;
	char cs[128];
	CUresult r;

	dlerror();
	ni->dl = dlopen(ni->library, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!ni->dl) {
		const char *e = dlerror();

		nvlink_error(ni, NVLINK_NAME ": no CUDA driver: cannot load %s: %s", ni->library,
			     e ? e : "unknown error");
		return TE_ERR_NO_DEVICE;
	}
	*(void **)&version = dlsym(ni->dl, "cuDriverGetVersion");
	*(void **)&getproc = dlsym(ni->dl, "cuGetProcAddress_v2");
	if (!version) {
		nvlink_error(ni, NVLINK_NAME ": %s is not a CUDA driver (no cuDriverGetVersion)",
			     ni->library);
		return TE_ERR_NO_DEVICE;
	}
	if (version(&ni->driver_version) != CUDA_SUCCESS)
		ni->driver_version = 0;
	if (!getproc || ni->driver_version < NVLINK_CUDA_VERSION) {
		nvlink_error(ni,
			     NVLINK_NAME ": the CUDA driver %s is version %d.%d (%d); nvlink needs "
					 "%d.%d (%d) or newer",
			     ni->library, ni->driver_version / 1000, ni->driver_version % 1000 / 10,
			     ni->driver_version, NVLINK_CUDA_VERSION / 1000,
			     NVLINK_CUDA_VERSION % 1000 / 10, NVLINK_CUDA_VERSION);
		return TE_ERR_NO_DEVICE;
	}
#define NVLINK_CU_RESOLVE(fn, name)                                                                \
	do {                                                                                       \
		CUdriverProcAddressQueryResult qs = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;          \
		void *p = NULL;                                                                    \
		r = getproc(name, &p, NVLINK_CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM,      \
			    &qs);                                                                  \
		if (r != CUDA_SUCCESS || !p) {                                                     \
			nvlink_error(                                                              \
				ni,                                                                \
				NVLINK_NAME ": the CUDA driver %s (version %d) has no " name       \
					    " for CUDA %d: %s%s",                                  \
				ni->library, ni->driver_version, NVLINK_CUDA_VERSION,              \
				r != CUDA_SUCCESS ? nvlink_cu_str(ni, r, cs, sizeof(cs)) : "",     \
				qs == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT                   \
					? "version not sufficient"                                 \
				: qs == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ? "symbol not found"  \
									     : "");                \
			return TE_ERR_NO_DEVICE;                                                   \
		}                                                                                  \
		*(void **)&ni->cu.fn = p;                                                          \
	} while (0);
	NVLINK_CU_FNS(NVLINK_CU_RESOLVE)
#undef NVLINK_CU_RESOLVE
	r = ni->cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni, NVLINK_NAME ": cuInit: %s", nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	return TE_OK;
}

/* --- devices ------------------------------------------------------------------------------- */

static int nvlink_dev_attr(struct nvlink_inst *ni, struct nvlink_dev *d, CUdevice_attribute a,
			   int def)
{
	int v = def;

	if (ni->cu.cuDeviceGetAttribute(&v, a, d->cudev) != CUDA_SUCCESS)
		return def;
	return v;
}

static int nvlink_sysfs_numa(const char *pci)
{
	char path[128], low[32];
	FILE *f;
	int v = -1;
	size_t i;

	for (i = 0; pci[i] && i + 1 < sizeof(low); i++)
		low[i] = (char)(pci[i] >= 'A' && pci[i] <= 'F' ? pci[i] - 'A' + 'a' : pci[i]);
	low[i] = '\0';
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", low);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static enum te_status nvlink_stream_init(struct nvlink_inst *ni, struct nvlink_stream *st)
{
	char cs[128];
	CUresult r;

	st->cap = ni->window;
	pthread_mutex_init(&st->lock, NULL);
	st->ev = calloc(st->cap, sizeof(*st->ev));
	st->ring = calloc(st->cap, sizeof(*st->ring));
	st->seq = calloc(st->cap, sizeof(*st->seq));
	st->gend = calloc(st->cap, sizeof(*st->gend));
	if (!st->ev || !st->ring || !st->seq || !st->gend) {
		nvlink_error(ni, NVLINK_NAME ": out of memory for stream rings");
		return TE_ERR_NOMEM;
	}
	r = ni->cu.cuStreamCreate(&st->s, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		st->s = NULL;
		nvlink_error(ni, NVLINK_NAME ": cuda:%d: cuStreamCreate: %s", st->dev->ordinal,
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	for (uint32_t i = 0; i < st->cap; i++) {
		/* Blocking sync: the wait helper sleeps in cuEventSynchronize instead of spinning. */
		r = ni->cu.cuEventCreate(&st->ev[i],
					 CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
		if (r != CUDA_SUCCESS) {
			st->ev[i] = NULL;
			nvlink_error(ni, NVLINK_NAME ": cuda:%d: cuEventCreate: %s",
				     st->dev->ordinal, nvlink_cu_str(ni, r, cs, sizeof(cs)));
			return TE_ERR_NO_DEVICE;
		}
	}
	return TE_OK;
}

static enum te_status nvlink_dev_open(struct nvlink_inst *ni, struct nvlink_dev *d, int ordinal)
{
	char cs[128];
	CUresult r;
	enum te_status st;

	d->ordinal = ordinal;
	d->numa = -1;
	pthread_mutex_init(&d->fail_lock, NULL);
	r = ni->cu.cuDeviceGet(&d->cudev, ordinal);
	if (r == CUDA_SUCCESS)
		r = ni->cu.cuDeviceGetName(d->gpu, sizeof(d->gpu), d->cudev);
	if (r == CUDA_SUCCESS)
		r = ni->cu.cuDeviceGetPCIBusId(d->pci, sizeof(d->pci), d->cudev);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d: %s", ordinal,
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	if (!nvlink_dev_attr(ni, d, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0)) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d (%s): no unified addressing", ordinal,
			     d->pci);
		return TE_ERR_NO_DEVICE;
	}
	d->numa = nvlink_dev_attr(ni, d, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
	if (d->numa < 0)
		d->numa = nvlink_sysfs_numa(d->pci);
	d->fabric =
		nvlink_dev_attr(ni, d, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0) &&
		nvlink_dev_attr(ni, d, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
	d->dmabuf = nvlink_dev_attr(ni, d, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0);
	r = ni->cu.cuDevicePrimaryCtxRetain(&d->ctx, d->cudev);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d (%s): cuDevicePrimaryCtxRetain: %s",
			     ordinal, d->pci, nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	d->ctx_retained = true;
	r = nvlink_set_dev(ni, d);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d (%s): cuCtxSetCurrent: %s", ordinal, d->pci,
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	d->n_streams = ni->streams_per_dev;
	d->streams = calloc(d->n_streams, sizeof(*d->streams));
	if (!d->streams) {
		nvlink_error(ni, NVLINK_NAME ": out of memory");
		return TE_ERR_NOMEM;
	}
	for (uint32_t i = 0; i < d->n_streams; i++) {
		d->streams[i].dev = d;
		st = nvlink_stream_init(ni, &d->streams[i]);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

/* Enable peer access between every pair of GPUs that allows it. */
static void nvlink_peers_enable(struct nvlink_inst *ni)
{
	char cs[128];

	for (uint32_t i = 0; i < ni->n_devs; i++) {
		struct nvlink_dev *d = &ni->devs[i];

		for (uint32_t j = 0; j < ni->n_devs; j++) {
			int can = 0;
			CUresult r;

			if (i == j ||
			    ni->cu.cuDeviceCanAccessPeer(&can, d->cudev, ni->devs[j].cudev) !=
				    CUDA_SUCCESS ||
			    !can)
				continue;
			if (nvlink_set_dev(ni, d) != CUDA_SUCCESS)
				continue;
			r = ni->cu.cuCtxEnablePeerAccess(ni->devs[j].ctx, 0);
			if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
				d->peers |= 1ull << j;
			else
				ni->host->log(ni->ctx, TE_PLUGIN_LOG_WARN,
					      "cuda:%u -> cuda:%u: cuCtxEnablePeerAccess: %s", i, j,
					      nvlink_cu_str(ni, r, cs, sizeof(cs)));
		}
	}
}

/* GPUs that can copy to and from memory of local GPU @owner: itself and its peers. */
static uint64_t nvlink_reach_of(const struct nvlink_inst *ni, int owner)
{
	uint64_t m = 0;

	if (owner < 0)
		return 0;
	m |= 1ull << owner;
	for (uint32_t j = 0; j < ni->n_devs; j++)
		if (ni->devs[j].peers & (1ull << owner))
			m |= 1ull << j;
	return m;
}

static int nvlink_dev_by_pci(const struct nvlink_inst *ni, const char *pci)
{
	for (uint32_t i = 0; i < ni->n_devs; i++)
		if (strncasecmp(ni->devs[i].pci, pci, sizeof(ni->devs[i].pci)) == 0)
			return (int)i;
	return -1;
}

/* --- the wait helper ----------------------------------------------------------------------- */

/* The in-flight stream whose oldest copy was launched first, or NULL. */
static struct nvlink_stream *nvlink_oldest(struct nvlink_inst *ni, uint32_t *slot_out)
{
	struct nvlink_stream *best = NULL;
	uint64_t best_seq = UINT64_MAX;

	for (uint32_t i = 0; i < ni->n_devs; i++) {
		struct nvlink_dev *d = &ni->devs[i];

		if (atomic_load_explicit(&d->failed, memory_order_relaxed))
			continue;
		for (uint32_t k = 0; k < d->n_streams; k++) {
			struct nvlink_stream *st = &d->streams[k];
			uint32_t head;

			if (!atomic_load_explicit(&st->count, memory_order_acquire))
				continue;
			if (pthread_mutex_trylock(&st->lock) != 0)
				continue;
			head = st->head;
			if (atomic_load_explicit(&st->count, memory_order_relaxed) &&
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
 * Sleeps until a thread waits in nvlink_wait, then blocks in cuEventSynchronize on the oldest
 * copy's event and wakes the waiters. The event may be recorded again meanwhile (its slice
 * completed and the slot was reused): then it waits for a later copy, which the waiters'
 * timeouts bound. Events live until fini, which stops this thread first.
 */
static void *nvlink_waiter_main(void *arg)
{
	struct nvlink_inst *ni = arg;
	struct nvlink_waiter *w = &ni->waiter;

	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		struct nvlink_stream *st;
		uint32_t slot = 0;
		uint64_t gen = w->gen;

		if (!w->sleepers) {
			pthread_cond_wait(&w->kick, &w->lock);
			continue;
		}
		pthread_mutex_unlock(&w->lock);
		st = nvlink_oldest(ni, &slot);
		if (st && nvlink_set_dev(ni, st->dev) == CUDA_SUCCESS)
			(void)ni->cu.cuEventSynchronize(st->ev[slot]);
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

static enum te_status nvlink_waiter_start(struct nvlink_inst *ni)
{
	struct nvlink_waiter *w = &ni->waiter;
	int err;

	err = pthread_create(&w->thread, NULL, nvlink_waiter_main, ni);
	if (err) {
		nvlink_error(ni, NVLINK_NAME ": cannot start the wait helper: %s", strerror(err));
		return TE_ERR_SYSTEM;
	}
	w->started = true;
	return TE_OK;
}

static void nvlink_waiter_stop(struct nvlink_inst *ni)
{
	struct nvlink_waiter *w = &ni->waiter;

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

/* --- init and fini --------------------------------------------------------------------------- */

static void nvlink_release_import(struct nvlink_inst *ni, struct nvlink_import *imp);
static void nvlink_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rk);
static void nvlink_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer);
static enum te_status nvlink_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *m);
static const char *nvlink_defer_text(struct nvlink_inst *ni, const struct nvlink_failed *f,
				     char *buf, size_t len);

static void nvlink_destroy(struct nvlink_inst *ni)
{
	char cs[128];

	nvlink_waiter_stop(ni);
	nvlink_sock_stop(ni);
	/* Launched copies cannot be stopped: wait for them, then hand their slices back. */
	for (uint32_t i = 0; ni->devs && i < ni->n_devs; i++) {
		struct nvlink_dev *d = &ni->devs[i];

		for (uint32_t k = 0; d->streams && k < d->n_streams; k++) {
			struct nvlink_stream *st = &d->streams[k];

			if (!st->s)
				continue;
			if (nvlink_set_dev(ni, d) == CUDA_SUCCESS)
				(void)ni->cu.cuStreamSynchronize(st->s);
			while (atomic_load(&st->count)) {
				struct te_plugin_slice *s = atomic_load(&st->ring[st->head]);

				atomic_store(&st->ring[st->head], NULL);
				st->head = (st->head + 1) % st->cap;
				atomic_fetch_sub(&st->count, 1);
				ni->host->slice_done(ni->ctx, s, TE_ERR_CANCELED, 0,
						     NVLINK_NAME ": engine shutting down (the copy "
								 "had run to its end)");
			}
		}
	}
	for (uint32_t i = 0; i < ni->n_defers; i++) {
		char buf[NVLINK_DETAIL];
		const char *text = nvlink_defer_text(ni, &ni->defers[i], buf, sizeof(buf));

		ni->host->slice_done(ni->ctx, ni->defers[i].s, (enum te_status)ni->defers[i].status,
				     0, text);
	}
	free(ni->defers);
	ni->defers = NULL;
	ni->n_defers = 0;
	/* What the core did not release: keys, peers, registrations, imports, allocations. */
	while (ni->rkeys.next && ni->rkeys.next != &ni->rkeys)
		nvlink_release_remote_key((struct te_plugin_inst *)ni,
					  (struct te_plugin_rkey *)ni->rkeys.next);
	while (ni->peers.next && ni->peers.next != &ni->peers)
		nvlink_unload_peer((struct te_plugin_inst *)ni,
				   (struct te_plugin_peer *)ni->peers.next);
	while (ni->mems.next && ni->mems.next != &ni->mems)
		(void)nvlink_dereg_mem((struct te_plugin_inst *)ni,
				       (struct te_plugin_mem *)ni->mems.next);
	while (ni->imports) {
		struct nvlink_import *imp = ni->imports;

		imp->refs = 1;
		nvlink_release_import(ni, imp);
	}
	while (ni->exports) {
		struct nvlink_export *x = ni->exports;

		ni->exports = x->next;
		close(x->fd);
		free(x);
	}
	while (ni->allocs) {
		struct nvlink_alloc *a = ni->allocs;
		struct nvlink_dev *d = nvlink_dev_get(ni, a->dev);
		CUresult r = d ? nvlink_set_dev(ni, d) : CUDA_ERROR_INVALID_DEVICE;

		ni->allocs = a->next;
		if (r == CUDA_SUCCESS && a->vmm) {
			r = ni->cu.cuMemUnmap(a->ptr, a->size);
			if (r == CUDA_SUCCESS)
				r = ni->cu.cuMemAddressFree(a->ptr, a->size);
		} else if (r == CUDA_SUCCESS) {
			r = ni->cu.cuMemFree(a->ptr);
		}
		if (r != CUDA_SUCCESS)
			ni->host->log(ni->ctx, TE_PLUGIN_LOG_WARN,
				      "freeing leftover cuda:%d memory 0x%llx: %s", a->dev,
				      (unsigned long long)a->ptr,
				      nvlink_cu_str(ni, r, cs, sizeof(cs)));
		free(a);
	}
	for (uint32_t i = 0; ni->devs && i < ni->n_devs; i++) {
		struct nvlink_dev *d = &ni->devs[i];

		for (uint32_t k = 0; d->streams && k < d->n_streams; k++) {
			struct nvlink_stream *st = &d->streams[k];

			if (d->ctx_retained)
				(void)nvlink_set_dev(ni, d);
			for (uint32_t e = 0; st->ev && e < st->cap; e++)
				if (st->ev[e])
					(void)ni->cu.cuEventDestroy(st->ev[e]);
			if (st->s)
				(void)ni->cu.cuStreamDestroy(st->s);
			free(st->ev);
			free(st->ring);
			free(st->seq);
			free(st->gend);
			pthread_mutex_destroy(&st->lock);
		}
		free(d->streams);
		if (d->ctx_retained)
			(void)ni->cu.cuDevicePrimaryCtxRelease(d->cudev);
		pthread_mutex_destroy(&d->fail_lock);
	}
	if (ni->cu.cuCtxSetCurrent)
		(void)ni->cu.cuCtxSetCurrent(NULL);
	free(ni->devs);
	pthread_cond_destroy(&ni->waiter.kick);
	pthread_cond_destroy(&ni->waiter.woke);
	pthread_mutex_destroy(&ni->waiter.lock);
	pthread_mutex_destroy(&ni->defer_lock);
	pthread_mutex_destroy(&ni->imp_lock);
	pthread_mutex_destroy(&ni->exp_lock);
	pthread_mutex_destroy(&ni->alloc_lock);
	pthread_mutex_destroy(&ni->obj_lock);
	if (ni->dl)
		dlclose(ni->dl); /* RTLD_NODELETE: the driver stays mapped, as drivers must */
	free(ni);
}

static enum te_status nvlink_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				  struct te_plugin_inst **inst_out)
{
	struct nvlink_inst *ni;
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
	char list[512];
	size_t at = 0;
	int count = 0;
	CUresult r;
	enum te_status st;

	if (!host || host->abi_major != TE_PLUGIN_ABI_MAJOR ||
	    !TE_PLUGIN_HAS(host, struct te_plugin_host, mem_dmabuf))
		return TE_ERR_ABI_MISMATCH;
	ni = calloc(1, sizeof(*ni));
	if (!ni)
		return TE_ERR_NOMEM;
	ni->host = host;
	ni->ctx = ctx;
	ni->sock.listen_fd = ni->sock.stop_fd = -1;
	pthread_mutex_init(&ni->defer_lock, NULL);
	pthread_mutex_init(&ni->imp_lock, NULL);
	pthread_mutex_init(&ni->exp_lock, NULL);
	pthread_mutex_init(&ni->alloc_lock, NULL);
	pthread_mutex_init(&ni->obj_lock, NULL);
	ni->mems.next = ni->mems.prev = &ni->mems;
	ni->peers.next = ni->peers.prev = &ni->peers;
	ni->rkeys.next = ni->rkeys.prev = &ni->rkeys;
	pthread_mutex_init(&ni->waiter.lock, NULL);
	pthread_cond_init(&ni->waiter.kick, NULL);
	{
		pthread_condattr_t ca;

		/* nvlink_wait's deadline is on the monotonic clock. */
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&ni->waiter.woke, &ca);
		pthread_condattr_destroy(&ca);
	}
	st = nvlink_options(ni);
	if (st != TE_OK)
		goto err;
	st = nvlink_driver_open(ni);
	if (st != TE_OK)
		goto err;
	r = ni->cu.cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count <= 0) {
		char cs[128];

		nvlink_error(ni, NVLINK_NAME ": no CUDA device: %s",
			     r != CUDA_SUCCESS ? nvlink_cu_str(ni, r, cs, sizeof(cs))
					       : "cuDeviceGetCount returned 0");
		st = TE_ERR_NO_DEVICE;
		goto err;
	}
	ni->n_devs = (uint32_t)count > NVLINK_MAX_DEV ? NVLINK_MAX_DEV : (uint32_t)count;
	ni->devs = calloc(ni->n_devs, sizeof(*ni->devs));
	if (!ni->devs) {
		st = TE_ERR_NOMEM;
		goto err;
	}
	ni->fabric = ni->fabric_mode != NVLINK_FABRIC_OFF;
	for (uint32_t i = 0; i < ni->n_devs; i++) {
		st = nvlink_dev_open(ni, &ni->devs[i], (int)i);
		if (st != TE_OK)
			goto err;
		ni->fabric = ni->fabric && ni->devs[i].fabric;
	}
	nvlink_peers_enable(ni);
	/* Identity: peers tell process, host and liveness from it. */
	if (getrandom(&ni->nonce, sizeof(ni->nonce), 0) != (ssize_t)sizeof(ni->nonce) || !ni->nonce)
		ni->nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ 1u;
	ni->blob.magic = NVLINK_BLOB_MAGIC;
	ni->blob.version = NVLINK_BLOB_VERSION;
	ni->blob.flags = ni->fabric ? 1u : 0u;
	nvlink_host_id(ni->blob.host);
	ni->blob.pidns = nvlink_pidns();
	ni->blob.pid = (uint32_t)getpid();
	ni->blob.starttime = nvlink_starttime((uint32_t)getpid());
	ni->blob.nonce = ni->nonce;
	ni->auth = host->auth_mac(ctx, "probe", 5, mac) == TE_OK;
	st = nvlink_sock_start(ni);
	if (st != TE_OK)
		goto err;
	st = nvlink_waiter_start(ni);
	if (st != TE_OK)
		goto err;
	st = host->publish(ctx, &ni->blob, sizeof(ni->blob));
	if (st != TE_OK) {
		nvlink_error(ni, NVLINK_NAME ": publish: %d", st);
		goto err;
	}
	for (uint32_t i = 0; i < ni->n_devs && at < sizeof(list); i++) {
		const struct nvlink_dev *d = &ni->devs[i];
		int k = snprintf(list + at, sizeof(list) - at,
				 "%scuda:%u %s (%s, NUMA %d, peers 0x%" PRIx64 ")", i ? "; " : "",
				 i, d->gpu, d->pci, d->numa, d->peers);

		if (k < 0)
			break;
		at += (size_t)k;
	}
	host->log(ctx, TE_PLUGIN_LOG_INFO,
		  "CUDA driver %d.%d via %s; %u GPU(s): %s; fabric handles %s; fd socket @%s%s",
		  ni->driver_version / 1000, ni->driver_version % 1000 / 10, ni->library,
		  ni->n_devs, list, ni->fabric ? "on" : "off", ni->sock.name,
		  ni->auth ? " (authenticated)" : "");
	*inst_out = (struct te_plugin_inst *)ni;
	return TE_OK;
err:
	nvlink_destroy(ni);
	return st;
}

static void nvlink_fini(struct te_plugin_inst *inst)
{
	if (inst)
		nvlink_destroy(nvlink_of(inst));
}

static enum te_status nvlink_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct nvlink_inst *ni = nvlink_of(inst);

	caps->mem_types = TE_PLUGIN_MEM_CPU | TE_PLUGIN_MEM_CUDA;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_MANUAL;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	/* FABRIC handles reach GPUs of other hosts in the NVLink domain; nothing else does. */
	caps->flags = ni->fabric ? 0 : TE_PLUGIN_CAP_SAME_HOST_ONLY;
	caps->max_slice_size = 0;
	caps->default_slice_size = ni->slice_size;
	caps->slice_priv_size = 0;
	caps->max_devices = ni->n_devs;
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, owned_mem_types))
		caps->owned_mem_types = TE_PLUGIN_MEM_CUDA;
	return TE_OK;
}

static enum te_status nvlink_query_devices(struct te_plugin_inst *inst,
					   struct te_plugin_device *devices, uint32_t max,
					   uint32_t *n_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	uint32_t n = ni->n_devs < max ? ni->n_devs : max;

	for (uint32_t i = 0; i < n; i++) {
		const struct nvlink_dev *d = &ni->devs[i];

		snprintf(devices[i].name, sizeof(devices[i].name), "cuda:%u %s", i, d->gpu);
		devices[i].numa_node = d->numa;
		snprintf(devices[i].pci, sizeof(devices[i].pci), "%s", d->pci);
		devices[i].link_speed_mbps = 0;
		devices[i].mem_types = TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_CPU;
	}
	*n_out = n;
	return TE_OK;
}

/* --- memory kinds (owned: CUDA) ------------------------------------------------------------- */

struct nvlink_ptr {
	unsigned int type; /* CUmemorytype; 0: not CUDA's */
	int dev;
	CUdeviceptr base;
	size_t size;
	int ipc; /* legacy IPC capable */
};

static CUresult nvlink_ptr_info(struct nvlink_inst *ni, const void *addr, struct nvlink_ptr *out)
{
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	};
	void *data[] = { &out->type, &out->dev, &out->base, &out->size, &out->ipc };

	memset(out, 0, sizeof(*out));
	out->dev = -1;
	return ni->cu.cuPointerGetAttributes(5, attrs, data, (CUdeviceptr)(uintptr_t)addr);
}

static enum te_status nvlink_mem_query(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				       uint32_t *mem_type_out, int32_t *dev_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_ptr pi;

	if (nvlink_ptr_info(ni, addr, &pi) != CUDA_SUCCESS || pi.type != CU_MEMORYTYPE_DEVICE ||
	    pi.dev < 0)
		return TE_ERR_NOT_FOUND;
	if ((uintptr_t)addr < pi.base || len > pi.size ||
	    (uintptr_t)addr - pi.base > pi.size - len) {
		nvlink_error(ni,
			     NVLINK_NAME ": [%p, +%" PRIu64 ") runs past the end of its cuda:%d "
					 "allocation [0x%llx, +%zu)",
			     addr, len, pi.dev, (unsigned long long)pi.base, pi.size);
		return TE_ERR_OUT_OF_RANGE;
	}
	*mem_type_out = TE_PLUGIN_MEM_CUDA;
	*dev_out = pi.dev;
	return TE_OK;
}

static enum te_status nvlink_cu_status(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return TE_OK;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return TE_ERR_NOMEM;
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_NO_DEVICE:
		return TE_ERR_NO_DEVICE;
	case CUDA_ERROR_NOT_SUPPORTED:
		return TE_ERR_UNSUPPORTED;
	case CUDA_ERROR_INVALID_VALUE:
		return TE_ERR_INVALID_ARG;
	default:
		return nvlink_cu_sticky(r) ? TE_ERR_DEVICE_FAILED : TE_ERR_SYSTEM;
	}
}

static enum te_status nvlink_mem_copy(struct te_plugin_inst *inst, void *dst, const void *src,
				      uint64_t len, uint32_t mem_type, int32_t dev,
				      enum te_plugin_copy_dir dir)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_dev *d = nvlink_dev_get(ni, dev);
	char cs[128];
	CUresult r;

	if (mem_type != TE_PLUGIN_MEM_CUDA || !d) {
		nvlink_error(ni,
			     NVLINK_NAME ": mem_copy: cuda:%d is not a device here (%u visible)",
			     dev, ni->n_devs);
		return mem_type != TE_PLUGIN_MEM_CUDA ? TE_ERR_MEMORY_TYPE : TE_ERR_NO_DEVICE;
	}
	if (atomic_load_explicit(&d->failed, memory_order_acquire)) {
		char why[NVLINK_DETAIL];

		nvlink_dev_why(d, why, sizeof(why));
		nvlink_error(ni, "%s", why);
		return TE_ERR_DEVICE_FAILED;
	}
	r = nvlink_set_dev(ni, d);
	if (r == CUDA_SUCCESS)
		r = ni->cu.cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
				    (size_t)len);
	if (r == CUDA_SUCCESS)
		return TE_OK;
	if (nvlink_cu_sticky(r))
		nvlink_dev_fail(ni, d, "cuMemcpy", r);
	nvlink_error(ni, NVLINK_NAME ": cuda:%d: cuMemcpy of %" PRIu64 " bytes %s: %s", dev, len,
		     dir == TE_PLUGIN_COPY_TO_HOST ? "to host" : "from host",
		     nvlink_cu_str(ni, r, cs, sizeof(cs)));
	return nvlink_cu_status(r);
}

static enum te_status nvlink_mem_dmabuf(struct te_plugin_inst *inst, const void *addr, uint64_t len,
					int *fd_out, uint64_t *offset_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_ptr pi;
	struct nvlink_dev *d;
	uintptr_t start, end;
	char cs[128];
	int fd = -1;
	CUresult r;

	if (nvlink_ptr_info(ni, addr, &pi) != CUDA_SUCCESS || pi.type != CU_MEMORYTYPE_DEVICE ||
	    !(d = nvlink_dev_get(ni, pi.dev))) {
		nvlink_error(ni, NVLINK_NAME ": mem_dmabuf: %p is not CUDA device memory", addr);
		return TE_ERR_INVALID_ARG;
	}
	if (!d->dmabuf) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d (%s): the driver offers no dma-buf export",
			     pi.dev, d->pci);
		return TE_ERR_UNSUPPORTED;
	}
	start = (uintptr_t)addr & ~(uintptr_t)(NVLINK_PAGE - 1);
	end = ((uintptr_t)addr + (uintptr_t)len + NVLINK_PAGE - 1) & ~(uintptr_t)(NVLINK_PAGE - 1);
	r = ni->cu.cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)start, end - start,
						 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni,
			     NVLINK_NAME ": cuda:%d: cuMemGetHandleForAddressRange([0x%lx, +%lu)): "
					 "%s",
			     pi.dev, (unsigned long)start, (unsigned long)(end - start),
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return r == CUDA_ERROR_NOT_SUPPORTED ? TE_ERR_UNSUPPORTED : nvlink_cu_status(r);
	}
	*fd_out = fd;
	*offset_out = (uintptr_t)addr - start;
	return TE_OK;
}

/* A VMM allocation of @len on @d, mapped read-write for @d and its peers. */
static CUresult nvlink_vmm_alloc(struct nvlink_inst *ni, struct nvlink_dev *d, uint64_t len,
				 CUdeviceptr *ptr_out, size_t *size_out, const char **step)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc[NVLINK_MAX_DEV];
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr ptr = 0;
	size_t gran = 0, size;
	uint64_t reach = nvlink_reach_of(ni, d->ordinal);
	size_t n = 0;
	CUresult r;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = d->ordinal;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (ni->fabric_mode != NVLINK_FABRIC_OFF && d->fabric)
		prop.requestedHandleTypes =
			(CUmemAllocationHandleType)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
						    CU_MEM_HANDLE_TYPE_FABRIC);
	*step = "cuMemGetAllocationGranularity";
	r = ni->cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return r;
	size = (size_t)((len + gran - 1) / gran * gran);
	*step = "cuMemCreate";
	r = ni->cu.cuMemCreate(&h, size, &prop, 0);
	if (r != CUDA_SUCCESS && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
		/* FABRIC needs the fabric manager (IMEX) as well: fall back to fds. */
		prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		r = ni->cu.cuMemCreate(&h, size, &prop, 0);
	}
	if (r != CUDA_SUCCESS)
		return r;
	*step = "cuMemAddressReserve";
	r = ni->cu.cuMemAddressReserve(&ptr, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		goto err_release;
	*step = "cuMemMap";
	r = ni->cu.cuMemMap(ptr, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto err_free;
	for (uint32_t i = 0; i < ni->n_devs; i++) {
		if (!(reach & (1ull << i)))
			continue;
		acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[n].location.id = (int)i;
		acc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	*step = "cuMemSetAccess";
	r = ni->cu.cuMemSetAccess(ptr, size, acc, n);
	if (r != CUDA_SUCCESS)
		goto err_unmap;
	(void)ni->cu.cuMemRelease(h); /* the mapping keeps the memory */
	*ptr_out = ptr;
	*size_out = size;
	return CUDA_SUCCESS;
err_unmap:
	(void)ni->cu.cuMemUnmap(ptr, size);
err_free:
	(void)ni->cu.cuMemAddressFree(ptr, size);
err_release:
	(void)ni->cu.cuMemRelease(h);
	return r;
}

static enum te_status nvlink_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
				       uint64_t len, void **ptr_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_dev *d = nvlink_dev_get(ni, dev);
	struct nvlink_alloc *a;
	const char *step = "cuMemAlloc";
	CUdeviceptr ptr = 0;
	size_t size = (size_t)len;
	char cs[128];
	CUresult r;

	if (mem_type != TE_PLUGIN_MEM_CUDA) {
		nvlink_error(ni, NVLINK_NAME ": mem_alloc: only cuda memory");
		return TE_ERR_MEMORY_TYPE;
	}
	if (!d) {
		nvlink_error(ni,
			     NVLINK_NAME ": cuda:%d: no such CUDA device (%u visible: cuda:0..%u)",
			     dev, ni->n_devs, ni->n_devs - 1);
		return TE_ERR_NO_DEVICE;
	}
	if (atomic_load_explicit(&d->failed, memory_order_acquire)) {
		char why[NVLINK_DETAIL];

		nvlink_dev_why(d, why, sizeof(why));
		nvlink_error(ni, "%s", why);
		return TE_ERR_DEVICE_FAILED;
	}
	a = calloc(1, sizeof(*a));
	if (!a)
		return TE_ERR_NOMEM;
	r = nvlink_set_dev(ni, d);
	if (r == CUDA_SUCCESS) {
		if (ni->alloc_mode == NVLINK_ALLOC_VMM)
			r = nvlink_vmm_alloc(ni, d, len, &ptr, &size, &step);
		else
			r = ni->cu.cuMemAlloc(&ptr, (size_t)len);
	}
	if (r != CUDA_SUCCESS) {
		free(a);
		if (nvlink_cu_sticky(r))
			nvlink_dev_fail(ni, d, step, r);
		nvlink_error(ni, NVLINK_NAME ": cuda:%d (%s): %s of %" PRIu64 " bytes: %s", dev,
			     d->pci, step, len, nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return nvlink_cu_status(r);
	}
	a->ptr = ptr;
	a->size = size;
	a->vmm = ni->alloc_mode == NVLINK_ALLOC_VMM;
	a->dev = dev;
	pthread_mutex_lock(&ni->alloc_lock);
	a->next = ni->allocs;
	ni->allocs = a;
	pthread_mutex_unlock(&ni->alloc_lock);
	*ptr_out = (void *)(uintptr_t)ptr;
	return TE_OK;
}

static enum te_status nvlink_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_alloc *a = NULL;
	struct nvlink_dev *d;
	char cs[128];
	CUresult r;

	pthread_mutex_lock(&ni->alloc_lock);
	for (struct nvlink_alloc **pa = &ni->allocs; *pa; pa = &(*pa)->next) {
		if ((*pa)->ptr == (CUdeviceptr)(uintptr_t)ptr) {
			a = *pa;
			*pa = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&ni->alloc_lock);
	if (!a) {
		nvlink_error(ni, NVLINK_NAME ": mem_free: %p did not come from mem_alloc", ptr);
		return TE_ERR_NOT_FOUND;
	}
	d = nvlink_dev_get(ni, a->dev);
	r = nvlink_set_dev(ni, d);
	if (r == CUDA_SUCCESS && a->vmm) {
		r = ni->cu.cuMemUnmap(a->ptr, a->size);
		if (r == CUDA_SUCCESS)
			r = ni->cu.cuMemAddressFree(a->ptr, a->size);
	} else if (r == CUDA_SUCCESS) {
		r = ni->cu.cuMemFree(a->ptr);
	}
	free(a);
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni, NVLINK_NAME ": cuda:%d: freeing %p: %s", d->ordinal, ptr,
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return nvlink_cu_status(r);
	}
	return TE_OK;
}

/* --- registration and keys ------------------------------------------------------------------- */

/* What a peer needs to map the VMM allocation holding @pi (its fd or FABRIC handle). */
static enum te_status nvlink_export_vmm(struct nvlink_inst *ni, struct te_plugin_mem *m,
					const struct nvlink_ptr *pi, const struct nvlink_dev *d)
{
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	char cs[128];
	CUresult r;

	r = ni->cu.cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)pi->base);
	if (r == CUDA_SUCCESS) {
		r = ni->cu.cuMemGetAllocationPropertiesFromHandle(&prop, h);
		if (r != CUDA_SUCCESS)
			(void)ni->cu.cuMemRelease(h);
	}
	if (r != CUDA_SUCCESS) {
		nvlink_error(ni,
			     NVLINK_NAME ": region [%p, +%" PRIu64 ") on cuda:%d (%s): neither a "
					 "cuMemAlloc allocation nor a VMM one "
					 "(cuMemRetainAllocationHandle: %s): peers cannot map it",
			     m->addr, m->length, d->ordinal, d->pci,
			     nvlink_cu_str(ni, r, cs, sizeof(cs)));
		return TE_ERR_MEMORY_TYPE;
	}
	if (ni->fabric && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
		CUmemFabricHandle fh;

		r = ni->cu.cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
		if (r == CUDA_SUCCESS) {
			m->key.kind = NVLINK_KIND_FABRIC;
			memcpy(m->key.handle, &fh, sizeof(fh));
			(void)ni->cu.cuMemRelease(h);
			return TE_OK;
		}
		ni->host->log(ni->ctx, TE_PLUGIN_LOG_INFO,
			      "cuda:%d: FABRIC export of [%p, +%" PRIu64
			      ") failed (%s); using a file "
			      "descriptor",
			      d->ordinal, m->addr, m->length, nvlink_cu_str(ni, r, cs, sizeof(cs)));
	}
	if (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		struct nvlink_export *x = calloc(1, sizeof(*x));
		int fd = -1;

		r = x ? ni->cu.cuMemExportToShareableHandle(
				&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
		      : CUDA_ERROR_OUT_OF_MEMORY;
		(void)ni->cu.cuMemRelease(h);
		if (r != CUDA_SUCCESS) {
			free(x);
			nvlink_error(ni,
				     NVLINK_NAME ": region [%p, +%" PRIu64 ") on cuda:%d: "
						 "cuMemExportToShareableHandle(fd): %s",
				     m->addr, m->length, d->ordinal,
				     nvlink_cu_str(ni, r, cs, sizeof(cs)));
			return nvlink_cu_status(r);
		}
		x->fd = fd;
		x->size = pi->size;
		pthread_mutex_lock(&ni->exp_lock);
		x->id = ni->nonce ^ (++ni->next_export * 0x9e3779b97f4a7c15ull);
		x->next = ni->exports;
		ni->exports = x;
		pthread_mutex_unlock(&ni->exp_lock);
		m->key.kind = NVLINK_KIND_FD;
		m->key.export_id = x->id;
		return TE_OK;
	}
	(void)ni->cu.cuMemRelease(h);
	nvlink_error(ni,
		     NVLINK_NAME
		     ": region [%p, +%" PRIu64 ") on cuda:%d (%s) was created without a "
		     "shareable handle type (cuMemCreate requestedHandleTypes 0x%x): peers "
		     "cannot map it",
		     m->addr, m->length, d->ordinal, d->pci, (unsigned)prop.requestedHandleTypes);
	return TE_ERR_MEMORY_TYPE;
}

static void nvlink_unexport(struct nvlink_inst *ni, uint64_t id)
{
	struct nvlink_export *x = NULL;

	pthread_mutex_lock(&ni->exp_lock);
	for (struct nvlink_export **px = &ni->exports; *px; px = &(*px)->next) {
		if ((*px)->id == id) {
			x = *px;
			*px = x->next;
			break;
		}
	}
	pthread_mutex_unlock(&ni->exp_lock);
	if (x) {
		close(x->fd);
		free(x);
	}
}

static enum te_status nvlink_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				     uint32_t mem_type, int32_t dev, uint32_t access,
				     struct te_plugin_mem **mem_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct te_plugin_mem *m;
	struct nvlink_ptr pi;
	struct nvlink_dev *d;
	char cs[128];
	CUresult r;
	enum te_status st;

	if (mem_type != TE_PLUGIN_MEM_CPU && mem_type != TE_PLUGIN_MEM_CUDA)
		return TE_ERR_MEMORY_TYPE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = addr;
	m->length = length;
	m->type = mem_type;
	m->dev = dev;
	m->access = access;
	if (mem_type == TE_PLUGIN_MEM_CPU) {
		/* The GPU reaches host memory directly only when it is pinned. */
		if (ni->pin_host && ni->n_devs) {
			r = nvlink_set_dev(ni, &ni->devs[0]);
			if (r == CUDA_SUCCESS)
				r = ni->cu.cuMemHostRegister(addr, (size_t)length,
							     CU_MEMHOSTREGISTER_PORTABLE);
			if (r == CUDA_SUCCESS)
				m->pinned = true;
			else if (r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
				ni->host->log(ni->ctx, TE_PLUGIN_LOG_INFO,
					      "cuMemHostRegister([%p, +%" PRIu64 ")): %s; copies "
					      "use it pageable (slower)",
					      addr, length, nvlink_cu_str(ni, r, cs, sizeof(cs)));
		}
		nvlink_link_add(ni, &ni->mems, &m->link);
		*mem_out = m;
		return TE_OK;
	}
	d = nvlink_dev_get(ni, dev);
	if (!d) {
		nvlink_error(ni,
			     NVLINK_NAME ": region [%p, +%" PRIu64
					 ") at cuda:%d: no such CUDA device "
					 "(%u visible)",
			     addr, length, dev, ni->n_devs);
		free(m);
		return TE_ERR_NO_DEVICE;
	}
	r = nvlink_ptr_info(ni, addr, &pi);
	if (r != CUDA_SUCCESS || pi.type != CU_MEMORYTYPE_DEVICE || pi.dev != dev) {
		nvlink_error(ni,
			     NVLINK_NAME ": region [%p, +%" PRIu64
					 ") is not memory of cuda:%d (%s)%s%s",
			     addr, length, dev, d->pci, r != CUDA_SUCCESS ? ": " : "",
			     r != CUDA_SUCCESS ? nvlink_cu_str(ni, r, cs, sizeof(cs)) : "");
		free(m);
		return TE_ERR_MEMORY_TYPE;
	}
	if ((uintptr_t)addr < pi.base || length > pi.size ||
	    (uintptr_t)addr - pi.base > pi.size - length) {
		nvlink_error(ni,
			     NVLINK_NAME ": region [%p, +%" PRIu64
					 ") on cuda:%d (%s) crosses the end "
					 "of its allocation [0x%llx, +%zu)",
			     addr, length, dev, d->pci, (unsigned long long)pi.base, pi.size);
		free(m);
		return TE_ERR_OUT_OF_RANGE;
	}
	m->key.magic = NVLINK_KEY_MAGIC;
	m->key.version = NVLINK_KEY_VERSION;
	m->key.access = (uint8_t)access;
	if (!pi.ipc) {
		/*
		 * VMM memory: the allocation a peer maps is the mapping the region lies in, which
		 * may be smaller than the address range reserved around it (CUDA 12.x attributes;
		 * an older driver leaves the range as it is).
		 */
		CUpointer_attribute ma[] = { CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
					     CU_POINTER_ATTRIBUTE_MAPPING_SIZE };
		CUdeviceptr mbase = 0;
		size_t msize = 0;
		void *md[] = { &mbase, &msize };

		if (ni->cu.cuPointerGetAttributes(2, ma, md, (CUdeviceptr)(uintptr_t)addr) ==
			    CUDA_SUCCESS &&
		    msize && (uintptr_t)addr >= mbase && length <= msize &&
		    (uintptr_t)addr - mbase <= msize - length) {
			pi.base = mbase;
			pi.size = msize;
		}
	}
	m->key.dev = dev;
	m->key.addr = (uint64_t)(uintptr_t)addr;
	m->key.length = length;
	m->key.alloc_base = pi.base;
	m->key.alloc_size = pi.size;
	snprintf(m->key.pci, sizeof(m->key.pci), "%s", d->pci);
	m->key.kind = NVLINK_KIND_NONE;
	if (access & (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)) {
		if (pi.ipc) {
			CUipcMemHandle h;

			r = ni->cu.cuIpcGetMemHandle(&h, pi.base);
			if (r != CUDA_SUCCESS) {
				nvlink_error(ni,
					     NVLINK_NAME ": region [%p, +%" PRIu64 ") on cuda:%d "
							 "(%s): cuIpcGetMemHandle: %s",
					     addr, length, dev, d->pci,
					     nvlink_cu_str(ni, r, cs, sizeof(cs)));
				free(m);
				return nvlink_cu_status(r);
			}
			m->key.kind = NVLINK_KIND_IPC;
			memcpy(m->key.handle, &h, sizeof(h));
		} else {
			st = nvlink_export_vmm(ni, m, &pi, d);
			if (st != TE_OK) {
				free(m);
				return st;
			}
		}
	}
	nvlink_link_add(ni, &ni->mems, &m->link);
	*mem_out = m;
	return TE_OK;
}

static enum te_status nvlink_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *m)
{
	struct nvlink_inst *ni = nvlink_of(inst);

	if (!m)
		return TE_OK;
	nvlink_link_del(ni, &m->link);
	if (m->pinned && ni->n_devs) {
		(void)nvlink_set_dev(ni, &ni->devs[0]);
		(void)ni->cu.cuMemHostUnregister(m->addr);
	}
	if (m->key.kind == NVLINK_KIND_FD)
		nvlink_unexport(ni, m->key.export_id);
	free(m);
	return TE_OK;
}

static enum te_status nvlink_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *m,
				      void *buf, size_t cap, size_t *len_out)
{
	if (m->type != TE_PLUGIN_MEM_CUDA || m->key.kind == NVLINK_KIND_NONE) {
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

static enum te_status nvlink_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				       const void *blob, size_t len,
				       struct te_plugin_peer **peer_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct te_plugin_peer *p;
	struct nvlink_blob b;

	if (len != sizeof(b)) {
		nvlink_error(ni, NVLINK_NAME ": peer %s: blob of %zu bytes, expected %zu",
			     peer_name, len, sizeof(b));
		return TE_ERR_PROTOCOL;
	}
	memcpy(&b, blob, sizeof(b));
	if (b.magic != NVLINK_BLOB_MAGIC || b.version != NVLINK_BLOB_VERSION) {
		nvlink_error(ni, NVLINK_NAME ": peer %s: not an nvlink blob of version %u",
			     peer_name, NVLINK_BLOB_VERSION);
		return TE_ERR_PROTOCOL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return TE_ERR_NOMEM;
	snprintf(p->name, sizeof(p->name), "%s", peer_name);
	p->blob = b;
	p->same_host = memcmp(b.host, ni->blob.host, sizeof(b.host)) == 0;
	p->same_process = p->same_host && b.pidns == ni->blob.pidns && b.pid == ni->blob.pid &&
			  b.starttime == ni->blob.starttime;
	if (!p->same_host && !(ni->fabric && (b.flags & 1u))) {
		nvlink_error(ni,
			     NVLINK_NAME ": peer %s is on another host, and %s FABRIC handles "
					 "(only they reach GPUs of other hosts)",
			     peer_name,
			     !ni->fabric ? "this driver offers no" : "the peer offers no");
		free(p);
		return TE_ERR_PEER_UNREACHABLE;
	}
	/* A process that is gone left only dead handles: say so now, not at the first copy. */
	if (p->same_host && b.pidns == ni->blob.pidns && !p->same_process &&
	    nvlink_starttime(b.pid) != b.starttime) {
		nvlink_error(ni,
			     NVLINK_NAME ": peer %s: process %" PRIu32 " of this host is gone: its "
					 "CUDA memory handles are dead",
			     peer_name, b.pid);
		free(p);
		return TE_ERR_PEER_UNREACHABLE;
	}
	nvlink_link_add(ni, &ni->peers, &p->link);
	*peer_out = p;
	return TE_OK;
}

static void nvlink_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
	/* Imports belong to the keys (released before their peer); nothing else is held. */
	if (!peer)
		return;
	nvlink_link_del(nvlink_of(inst), &peer->link);
	free(peer);
}

static void nvlink_release_import(struct nvlink_inst *ni, struct nvlink_import *imp)
{
	struct nvlink_dev *d;

	if (--imp->refs > 0)
		return;
	for (struct nvlink_import **pp = &ni->imports; *pp; pp = &(*pp)->next) {
		if (*pp == imp) {
			*pp = imp->next;
			break;
		}
	}
	d = nvlink_dev_get(ni, imp->copy_dev);
	if (d)
		(void)nvlink_set_dev(ni, d);
	if (imp->kind == NVLINK_KIND_IPC) {
		(void)ni->cu.cuIpcCloseMemHandle(imp->local);
	} else {
		(void)ni->cu.cuMemUnmap(imp->local, imp->map_size);
		(void)ni->cu.cuMemAddressFree(imp->local, imp->map_size);
	}
	free(imp);
}

/* Map a VMM allocation (@h, imported) here for every local GPU in @reach. */
static CUresult nvlink_map_vmm(struct nvlink_inst *ni, CUmemGenericAllocationHandle h, size_t size,
			       uint64_t reach, CUdeviceptr *ptr_out, const char **step)
{
	CUmemAccessDesc acc[NVLINK_MAX_DEV];
	CUdeviceptr ptr = 0;
	size_t n = 0;
	CUresult r;

	*step = "cuMemAddressReserve";
	r = ni->cu.cuMemAddressReserve(&ptr, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	*step = "cuMemMap";
	r = ni->cu.cuMemMap(ptr, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto err_free;
	for (uint32_t i = 0; i < ni->n_devs; i++) {
		if (!(reach & (1ull << i)))
			continue;
		acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[n].location.id = (int)i;
		acc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	*step = "cuMemSetAccess";
	r = n ? ni->cu.cuMemSetAccess(ptr, size, acc, n) : CUDA_ERROR_INVALID_DEVICE;
	if (r != CUDA_SUCCESS)
		goto err_unmap;
	*ptr_out = ptr;
	return CUDA_SUCCESS;
err_unmap:
	(void)ni->cu.cuMemUnmap(ptr, size);
err_free:
	(void)ni->cu.cuMemAddressFree(ptr, size);
	return r;
}

/*
 * The mapping of the allocation @k names, from the cache or mapped now (under imp_lock).
 * TE_OK with a reference, or a status and @why naming the region, GPU and driver text.
 */
static enum te_status nvlink_import_get(struct nvlink_inst *ni, const struct te_plugin_peer *peer,
					const struct nvlink_key *k, struct nvlink_import **out,
					char *why)
{
	struct nvlink_import *imp;
	const char *step = "";
	char cs[128];
	enum te_status st = TE_OK;
	CUresult r = CUDA_SUCCESS;
	int owner = nvlink_dev_by_pci(ni, k->pci);
	int fd = -1;

	for (imp = ni->imports; imp; imp = imp->next) {
		if (imp->peer_nonce == peer->blob.nonce && imp->kind == k->kind &&
		    imp->alloc_base == k->alloc_base && imp->alloc_size == k->alloc_size) {
			imp->refs++;
			*out = imp;
			return TE_OK;
		}
	}
	imp = calloc(1, sizeof(*imp));
	if (!imp) {
		snprintf(why, NVLINK_DETAIL, NVLINK_NAME ": out of memory");
		return TE_ERR_NOMEM;
	}
	imp->refs = 1;
	imp->peer_nonce = peer->blob.nonce;
	imp->kind = k->kind;
	imp->alloc_base = k->alloc_base;
	imp->alloc_size = k->alloc_size;
	imp->owner = owner;
	/* A GPU not visible here (other host, CUDA_VISIBLE_DEVICES): GPU 0 copies. */
	imp->copy_dev = owner >= 0 ? owner : 0;
	imp->reach = owner >= 0 ? nvlink_reach_of(ni, owner) : (1ull << ni->n_devs) - 1;
	if (ni->n_devs >= 64 && owner < 0)
		imp->reach = UINT64_MAX;
	if (nvlink_set_dev(ni, &ni->devs[imp->copy_dev]) != CUDA_SUCCESS) {
		snprintf(why, NVLINK_DETAIL,
			 NVLINK_NAME ": cuda:%d: cannot make its context current", imp->copy_dev);
		free(imp);
		return TE_ERR_DEVICE_FAILED;
	}
	if (k->kind == NVLINK_KIND_IPC) {
		CUipcMemHandle h;

		memcpy(&h, k->handle, sizeof(h));
		step = "cuIpcOpenMemHandle";
		r = ni->cu.cuIpcOpenMemHandle(&imp->local, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	} else {
		CUmemGenericAllocationHandle h = 0;
		uint64_t size = 0;

		if (k->kind == NVLINK_KIND_FD) {
			char fwhy[NVLINK_DETAIL];

			st = nvlink_sock_fetch(ni, peer->blob.pid, peer->blob.nonce, k->export_id,
					       ni->fetch_timeout_ms, &fd, &size, fwhy);
			if (st != TE_OK) {
				snprintf(why, NVLINK_DETAIL,
					 NVLINK_NAME ": cannot map region [0x%llx, +%llu) of %s "
						     "(cuda:%d %s): %s",
					 (unsigned long long)k->addr, (unsigned long long)k->length,
					 peer->name, k->dev, k->pci, fwhy);
				free(imp);
				return st;
			}
			step = "cuMemImportFromShareableHandle(fd)";
			r = ni->cu.cuMemImportFromShareableHandle(
				&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
			close(fd);
		} else {
			CUmemFabricHandle fh;

			memcpy(&fh, k->handle, sizeof(fh));
			step = "cuMemImportFromShareableHandle(fabric)";
			r = ni->cu.cuMemImportFromShareableHandle(&h, &fh,
								  CU_MEM_HANDLE_TYPE_FABRIC);
			size = k->alloc_size;
		}
		if (r == CUDA_SUCCESS) {
			imp->map_size = (size_t)(size ? size : k->alloc_size);
			r = nvlink_map_vmm(ni, h, imp->map_size, imp->reach, &imp->local, &step);
			(void)ni->cu.cuMemRelease(h); /* the mapping keeps it */
		}
	}
	if (r != CUDA_SUCCESS) {
		snprintf(why, NVLINK_DETAIL,
			 NVLINK_NAME ": cannot map region [0x%llx, +%llu) of %s (cuda:%d %s, pid "
				     "%" PRIu32 "): %s: %s",
			 (unsigned long long)k->addr, (unsigned long long)k->length, peer->name,
			 k->dev, k->pci, peer->blob.pid, step,
			 nvlink_cu_str(ni, r, cs, sizeof(cs)));
		free(imp);
		return r == CUDA_ERROR_OUT_OF_MEMORY ? TE_ERR_NOMEM : TE_ERR_PEER_UNREACHABLE;
	}
	imp->next = ni->imports;
	ni->imports = imp;
	*out = imp;
	return TE_OK;
}

static enum te_status nvlink_unpack_remote_key(struct te_plugin_inst *inst,
					       struct te_plugin_peer *peer, const void *blob,
					       size_t len, uint64_t addr, uint64_t length,
					       struct te_plugin_rkey **rkey_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct te_plugin_rkey *rk;
	struct nvlink_key k;

	if (len != sizeof(k)) {
		nvlink_error(ni, NVLINK_NAME ": key of %zu bytes, expected %zu", len, sizeof(k));
		return TE_ERR_PROTOCOL;
	}
	memcpy(&k, blob, sizeof(k));
	k.pci[sizeof(k.pci) - 1] = '\0';
	if (k.magic != NVLINK_KEY_MAGIC || k.version != NVLINK_KEY_VERSION ||
	    k.kind < NVLINK_KIND_IPC || k.kind > NVLINK_KIND_FABRIC) {
		nvlink_error(ni, NVLINK_NAME ": not an nvlink key of version %u",
			     NVLINK_KEY_VERSION);
		return TE_ERR_PROTOCOL;
	}
	if (k.addr != addr || k.length != length || k.addr < k.alloc_base ||
	    k.length > k.alloc_size || k.addr - k.alloc_base > k.alloc_size - k.length) {
		nvlink_error(ni,
			     NVLINK_NAME
			     ": key of [0x%llx, +%llu) (allocation [0x%llx, +%llu)) does "
			     "not describe buffer [0x%llx, +%llu)",
			     (unsigned long long)k.addr, (unsigned long long)k.length,
			     (unsigned long long)k.alloc_base, (unsigned long long)k.alloc_size,
			     (unsigned long long)addr, (unsigned long long)length);
		return TE_ERR_PROTOCOL;
	}
	rk = calloc(1, sizeof(*rk));
	if (!rk)
		return TE_ERR_NOMEM;
	rk->addr = addr;
	rk->length = length;
	rk->access = k.access;
	rk->exporter_dev = k.dev;
	snprintf(rk->exporter_pci, sizeof(rk->exporter_pci), "%s", k.pci);
	if (peer->same_process) {
		/* Its device pointers are valid here: no import. */
		int owner = nvlink_dev_by_pci(ni, k.pci);

		rk->local = addr;
		rk->copy_dev = owner >= 0 ? owner : k.dev;
		rk->reach = nvlink_reach_of(ni, rk->copy_dev);
	} else if (!peer->same_host && k.kind != NVLINK_KIND_FABRIC) {
		rk->broken = TE_ERR_PEER_UNREACHABLE;
		snprintf(rk->why, sizeof(rk->why),
			 NVLINK_NAME
			 ": region [0x%llx, +%llu) of %s (cuda:%d %s) is on another host "
			 "and has no FABRIC handle (%s)",
			 (unsigned long long)addr, (unsigned long long)length, peer->name, k.dev,
			 k.pci, nvlink_kind_names[k.kind]);
	} else {
		pthread_mutex_lock(&ni->imp_lock);
		rk->broken = nvlink_import_get(ni, peer, &k, &rk->imp, rk->why);
		pthread_mutex_unlock(&ni->imp_lock);
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
		nvlink_log_detail(ni, TE_PLUGIN_LOG_WARN, rk->why);
	nvlink_link_add(ni, &ni->rkeys, &rk->link);
	*rkey_out = rk;
	return TE_OK;
}

static void nvlink_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rk)
{
	struct nvlink_inst *ni = nvlink_of(inst);

	if (!rk)
		return;
	nvlink_link_del(ni, &rk->link);
	if (rk->imp) {
		pthread_mutex_lock(&ni->imp_lock);
		nvlink_release_import(ni, rk->imp);
		pthread_mutex_unlock(&ni->imp_lock);
	}
	free(rk);
}

/* --- data path ------------------------------------------------------------------------------ */

/* Queue @s to fail with @status: progress reports it (never from inside submit). */
static void nvlink_defer(struct nvlink_inst *ni, struct te_plugin_slice *s, enum te_status status,
			 enum nvlink_why why, CUresult cu, const char *text)
{
	struct nvlink_failed f = { s, text, status, why, cu };

	pthread_mutex_lock(&ni->defer_lock);
	if (ni->n_defers == ni->cap_defers) {
		uint32_t cap = ni->cap_defers ? 2 * ni->cap_defers : 64;
		struct nvlink_failed *n = realloc(ni->defers, cap * sizeof(*n));

		if (!n) {
			/* Out of memory on a failure path: report now (the caller holds no lock). */
			pthread_mutex_unlock(&ni->defer_lock);
			ni->host->slice_done(ni->ctx, s, status, 0,
					     NVLINK_NAME
					     ": out of memory (and a failure to report)");
			return;
		}
		ni->defers = n;
		ni->cap_defers = cap;
	}
	ni->defers[ni->n_defers++] = f;
	atomic_fetch_add_explicit(&ni->n_defer, 1, memory_order_release);
	pthread_mutex_unlock(&ni->defer_lock);
}

/* The detail of a queued failure, into @buf. */
static const char *nvlink_defer_text(struct nvlink_inst *ni, const struct nvlink_failed *f,
				     char *buf, size_t len)
{
	const struct te_plugin_slice *s = f->s;
	const struct te_plugin_rkey *rk = s->rkey;
	struct nvlink_dev *d = nvlink_dev_get(ni, (int32_t)s->device);
	char cs[128];

	switch ((enum nvlink_why)f->why) {
	case NVLINK_WHY_TEXT:
		return f->text;
	case NVLINK_WHY_RANGE:
		snprintf(buf, len,
			 NVLINK_NAME ": remote range [0x%llx, +%llu) is not inside a %s buffer "
				     "[0x%llx, +%llu)",
			 (unsigned long long)s->remote, (unsigned long long)s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "remote-readable" : "remote-writable",
			 (unsigned long long)rk->addr, (unsigned long long)rk->length);
		break;
	case NVLINK_WHY_NODEV:
		snprintf(buf, len, NVLINK_NAME ": cuda:%d is not a device here", (int)s->device);
		break;
	case NVLINK_WHY_NOPATH:
		snprintf(buf, len,
			 NVLINK_NAME ": no path from cuda:%d (%s) to the peer's memory on GPU %s "
				     "(cuda:%d there): no peer access between them",
			 (int)s->device, d ? d->pci : "?", rk->exporter_pci, rk->exporter_dev);
		break;
	case NVLINK_WHY_COPY:
		snprintf(buf, len,
			 NVLINK_NAME ": cuda:%d (%s): cuMemcpyAsync of %llu bytes %s 0x%llx: %s",
			 (int)s->device, d ? d->pci : "?", (unsigned long long)s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "from" : "to",
			 (unsigned long long)s->remote,
			 nvlink_cu_str(ni, (CUresult)f->cu, cs, sizeof(cs)));
		break;
	case NVLINK_WHY_CTX:
		snprintf(buf, len, NVLINK_NAME ": cuda:%d: cuCtxSetCurrent: %s", (int)s->device,
			 nvlink_cu_str(ni, (CUresult)f->cu, cs, sizeof(cs)));
		break;
	default:
		snprintf(buf, len, NVLINK_NAME ": slice without key or region");
		break;
	}
	return buf;
}

static uint32_t nvlink_flush_deferred(struct nvlink_inst *ni)
{
	struct nvlink_failed batch[32];
	uint32_t total = 0, n;

	while (atomic_load_explicit(&ni->n_defer, memory_order_acquire)) {
		pthread_mutex_lock(&ni->defer_lock);
		n = ni->n_defers < 32 ? ni->n_defers : 32;
		memcpy(batch, ni->defers, n * sizeof(batch[0]));
		memmove(ni->defers, ni->defers + n, (ni->n_defers - n) * sizeof(batch[0]));
		ni->n_defers -= n;
		atomic_store_explicit(&ni->n_defer, ni->n_defers, memory_order_relaxed);
		pthread_mutex_unlock(&ni->defer_lock);
		/* Reported outside the lock: slice_done may submit again (a retry). */
		for (uint32_t i = 0; i < n; i++) {
			char buf[NVLINK_DETAIL];
			const char *text = nvlink_defer_text(ni, &batch[i], buf, sizeof(buf));

			ni->host->slice_done(ni->ctx, batch[i].s, (enum te_status)batch[i].status,
					     0, text);
		}
		total += n;
	}
	return total;
}

/* A stream of @d with room, locked; NULL when every ring is full (back-pressure). */
static struct nvlink_stream *nvlink_stream_take(struct nvlink_dev *d)
{
	uint32_t start = atomic_fetch_add_explicit(&d->rr, 1, memory_order_relaxed) % d->n_streams;
	struct nvlink_stream *st;

	for (uint32_t k = 0; k < d->n_streams; k++) {
		st = &d->streams[(start + k) % d->n_streams];
		if (pthread_mutex_trylock(&st->lock) != 0)
			continue;
		if (atomic_load_explicit(&st->count, memory_order_relaxed) < st->cap)
			return st;
		pthread_mutex_unlock(&st->lock);
	}
	/* All busy or full: wait for the first one's lock rather than give up at once. */
	st = &d->streams[start];
	pthread_mutex_lock(&st->lock);
	if (atomic_load_explicit(&st->count, memory_order_relaxed) < st->cap)
		return st;
	pthread_mutex_unlock(&st->lock);
	return NULL;
}

/*
 * Slices launched back to back on one stream form a launch group: one event, recorded after
 * the group's last copy, tells when all of them are done (copies on a stream run in order).
 * That is one cuEventRecord and one cuEventQuery per group instead of per slice. Groups stay
 * small in bytes, so that large copies spread over the streams (and copy engines) instead of
 * queueing on one: a slice of NVLINK_GROUP_BYTES or more is a group of its own.
 */
#define NVLINK_GROUP_MAX 32u
#define NVLINK_GROUP_BYTES (256u << 10)

struct nvlink_group {
	struct nvlink_stream *st; /* locked while the group is open */
	struct nvlink_dev *d;
	uint32_t first; /* slot of its first slice */
	uint32_t n;
	uint64_t bytes;
};

/* Record the group's event and let progress see it; unlocks its stream. */
static void nvlink_group_close(struct nvlink_inst *ni, struct nvlink_group *g)
{
	struct nvlink_stream *st = g->st;
	uint32_t last;
	CUresult r;

	if (!st)
		return;
	if (g->n) {
		last = (g->first + g->n - 1) % st->cap;
		r = ni->cu.cuEventRecord(st->ev[last], st->s);
		if (r != CUDA_SUCCESS && !nvlink_cu_sticky(r)) {
			/* Launched but not tracked: wait for the copies here (rare), then try again. */
			CUresult sr = ni->cu.cuStreamSynchronize(st->s);

			r = sr != CUDA_SUCCESS ? sr : ni->cu.cuEventRecord(st->ev[last], st->s);
		}
		/* Still failing: the device is lost; progress fails whatever its rings hold. */
		if (r != CUDA_SUCCESS)
			nvlink_dev_fail(ni, g->d, "cuEventRecord", r);
		for (uint32_t k = 0; k < g->n; k++)
			st->gend[(g->first + k) % st->cap] = last;
		atomic_fetch_add_explicit(&st->count, g->n, memory_order_release);
	}
	pthread_mutex_unlock(&st->lock);
	g->st = NULL;
	g->d = NULL;
	g->n = 0;
	g->bytes = 0;
}

/* Check @s and find the GPU that copies it; NULL when it was queued to fail instead. */
static struct nvlink_dev *nvlink_route(struct nvlink_inst *ni, struct te_plugin_slice *s,
				       CUdeviceptr *remote_out)
{
	const struct te_plugin_rkey *rk = s->rkey;
	const struct te_plugin_mem *m = s->local_mem;
	struct nvlink_dev *d;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	int dev;

	if (!rk || !m) {
		nvlink_defer(ni, s, TE_ERR_INTERNAL, NVLINK_WHY_INTERNAL, CUDA_SUCCESS, NULL);
		return NULL;
	}
	if (rk->broken != TE_OK) {
		/* The key outlives the slice: the core holds the segment while it is in flight. */
		nvlink_defer(ni, s, rk->broken, NVLINK_WHY_TEXT, CUDA_SUCCESS, rk->why);
		return NULL;
	}
	if (s->remote < rk->addr || s->length > rk->length ||
	    s->remote - rk->addr > rk->length - s->length || !(rk->access & need)) {
		nvlink_defer(ni, s, TE_ERR_REMOTE_ACCESS, NVLINK_WHY_RANGE, CUDA_SUCCESS, NULL);
		return NULL;
	}
	/* The local GPU copies; for host memory, the GPU holding the remote memory. */
	dev = m->type == TE_PLUGIN_MEM_CUDA ? m->dev : rk->copy_dev;
	s->device = (uint32_t)dev;
	d = nvlink_dev_get(ni, dev);
	if (!d) {
		nvlink_defer(ni, s, TE_ERR_NO_DEVICE, NVLINK_WHY_NODEV, CUDA_SUCCESS, NULL);
		return NULL;
	}
	if (!(rk->reach & (1ull << dev))) {
		nvlink_defer(ni, s, TE_ERR_NO_DEVICE, NVLINK_WHY_NOPATH, CUDA_SUCCESS, NULL);
		return NULL;
	}
	if (atomic_load_explicit(&d->failed, memory_order_acquire)) {
		/* Written once, before failed was set; never changes afterwards. */
		nvlink_defer(ni, s, TE_ERR_DEVICE_FAILED, NVLINK_WHY_TEXT, CUDA_SUCCESS, d->fail);
		return NULL;
	}
	*remote_out = (CUdeviceptr)(rk->local + (s->remote - rk->addr));
	return d;
}

static enum te_status nvlink_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				    uint32_t n, uint32_t *accepted_out)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_group g = { 0 };
	uint32_t i;

	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		CUdeviceptr remote = 0, local = (CUdeviceptr)(uintptr_t)s->local;
		struct nvlink_dev *d = nvlink_route(ni, s, &remote);
		uint32_t slot;
		CUresult r;

		if (!d)
			continue; /* accepted; progress reports the failure */
		if (g.st &&
		    (g.d != d || g.n == NVLINK_GROUP_MAX ||
		     g.bytes + s->length > NVLINK_GROUP_BYTES ||
		     atomic_load_explicit(&g.st->count, memory_order_relaxed) + g.n == g.st->cap))
			nvlink_group_close(ni, &g);
		if (!g.st) {
			g.st = nvlink_stream_take(d);
			if (!g.st)
				break; /* every ring of this GPU is full: back-pressure */
			g.d = d;
			g.first = (g.st->head +
				   atomic_load_explicit(&g.st->count, memory_order_relaxed)) %
				  g.st->cap;
			r = nvlink_set_dev(ni, d);
			if (r != CUDA_SUCCESS) {
				nvlink_group_close(ni, &g);
				nvlink_defer(ni, s, TE_ERR_DEVICE_FAILED, NVLINK_WHY_CTX, r, NULL);
				continue;
			}
			/* Reaping pops whole groups: the head of a ring is a group's first. */
			g.st->seq[g.first] =
				atomic_fetch_add_explicit(&ni->launch_seq, 1, memory_order_relaxed);
		}
		if (s->opcode == TE_PLUGIN_OP_READ)
			r = ni->cu.cuMemcpyAsync(local, remote, (size_t)s->length, g.st->s);
		else
			r = ni->cu.cuMemcpyAsync(remote, local, (size_t)s->length, g.st->s);
		if (r != CUDA_SUCCESS) {
			if (nvlink_cu_sticky(r)) {
				nvlink_dev_fail(ni, d, "cuMemcpyAsync", r);
				nvlink_defer(ni, s, TE_ERR_DEVICE_FAILED, NVLINK_WHY_TEXT, r,
					     d->fail);
				nvlink_group_close(ni, &g);
				continue;
			}
			nvlink_defer(ni, s,
				     r == CUDA_ERROR_OUT_OF_MEMORY ? TE_ERR_AGAIN
								   : TE_ERR_DEVICE_FAILED,
				     NVLINK_WHY_COPY, r, NULL);
			continue;
		}
		slot = (g.first + g.n) % g.st->cap;
		atomic_store_explicit(&g.st->ring[slot], s, memory_order_release);
		g.n++;
		g.bytes += s->length;
	}
	nvlink_group_close(ni, &g);
	*accepted_out = i;
	return TE_OK;
}

struct nvlink_done {
	struct te_plugin_slice *s;
	enum te_status status;
};

/*
 * Reap the completed launch groups of @st (at most about @max slices into @out). A failed
 * device (sticky error) loses every copy queued on it: they all fail.
 */
static uint32_t nvlink_reap(struct nvlink_inst *ni, struct nvlink_stream *st,
			    struct nvlink_done *out, uint32_t max, CUresult *err)
{
	bool failed = atomic_load_explicit(&st->dev->failed, memory_order_acquire);
	uint32_t n = 0;

	while (n < max && atomic_load_explicit(&st->count, memory_order_relaxed)) {
		uint32_t end = st->gend[st->head];
		uint32_t len = (end + st->cap - st->head) % st->cap + 1;
		CUresult r = CUDA_SUCCESS;

		if (!failed && !*err) {
			r = ni->cu.cuEventQuery(st->ev[end]);
			if (r == CUDA_ERROR_NOT_READY)
				break;
			if (r != CUDA_SUCCESS)
				*err = r;
		}
		if (n + len > max && n)
			break; /* the next call takes this group whole */
		for (uint32_t k = 0; k < len; k++) {
			struct te_plugin_slice *s =
				atomic_load_explicit(&st->ring[st->head], memory_order_acquire);

			atomic_store_explicit(&st->ring[st->head], NULL, memory_order_relaxed);
			st->head = (st->head + 1) % st->cap;
			out[n].s = s;
			out[n].status = failed || *err ? TE_ERR_DEVICE_FAILED : TE_OK;
			n++;
		}
		atomic_fetch_sub_explicit(&st->count, len, memory_order_release);
	}
	return n;
}

static uint32_t nvlink_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	/* Room for a whole launch group beyond the chunk. */
	struct nvlink_done done[NVLINK_REAP_CHUNK + NVLINK_GROUP_MAX];
	uint32_t total = nvlink_flush_deferred(ni);

	for (uint32_t i = 0; i < ni->n_devs && total < budget; i++) {
		struct nvlink_dev *d = &ni->devs[i];
		bool ctx_set = false;

		for (uint32_t k = 0; k < d->n_streams && total < budget; k++) {
			struct nvlink_stream *st = &d->streams[k];
			CUresult err = CUDA_SUCCESS;
			char why[NVLINK_DETAIL] = "";
			uint32_t n, max = budget - total;

			if (!atomic_load_explicit(&st->count, memory_order_acquire))
				continue;
			if (pthread_mutex_trylock(&st->lock) != 0)
				continue;
			if (!ctx_set) {
				(void)nvlink_set_dev(ni, d);
				ctx_set = true;
			}
			n = nvlink_reap(ni, st, done,
					max < NVLINK_REAP_CHUNK ? max : NVLINK_REAP_CHUNK, &err);
			pthread_mutex_unlock(&st->lock);
			if (err != CUDA_SUCCESS)
				nvlink_dev_fail(ni, d,
						nvlink_cu_sticky(err) ? "cuEventQuery"
								      : "cuEventQuery (unexpected)",
						err);
			if (atomic_load_explicit(&d->failed, memory_order_acquire))
				nvlink_dev_why(d, why, sizeof(why));
			for (uint32_t j = 0; j < n; j++) {
				struct te_plugin_slice *s = done[j].s;

				if (done[j].status == TE_OK)
					ni->host->slice_done(ni->ctx, s, TE_OK, s->length, NULL);
				else
					ni->host->slice_done(ni->ctx, s, done[j].status, 0, why);
			}
			total += n;
		}
	}
	return total;
}

static enum te_status nvlink_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	struct nvlink_waiter *w = &ni->waiter;
	struct timespec ts;
	uint64_t gen;

	if (atomic_load_explicit(&ni->n_defer, memory_order_acquire))
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

static enum te_status nvlink_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct nvlink_inst *ni = nvlink_of(inst);
	enum te_status st = TE_ERR_NOT_FOUND;

	/*
	 * A launched copy cannot be stopped: the slice is handed back when its event completes,
	 * with its real outcome; a queued failure is reported by the next progress. There is
	 * nothing to do but say whether the slice is ours: in a ring slot, or queued to fail.
	 */
	for (uint32_t i = 0; i < ni->n_devs; i++) {
		struct nvlink_dev *d = &ni->devs[i];

		for (uint32_t k = 0; k < d->n_streams; k++) {
			struct nvlink_stream *q = &d->streams[k];

			for (uint32_t slot = 0; slot < q->cap; slot++)
				if (atomic_load_explicit(&q->ring[slot], memory_order_acquire) == s)
					return TE_OK;
		}
	}
	pthread_mutex_lock(&ni->defer_lock);
	for (uint32_t i = 0; i < ni->n_defers; i++)
		if (ni->defers[i].s == s)
			st = TE_OK;
	pthread_mutex_unlock(&ni->defer_lock);
	return st;
}

static enum te_status nvlink_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	/* The GPU is dictated by where the memory is: a retry takes the same path. */
	return TE_OK;
}

static const struct te_plugin_ops nvlink_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = nvlink_init,
	.fini = nvlink_fini,
	.query_caps = nvlink_query_caps,
	.query_devices = nvlink_query_devices,
	.reg_mem = nvlink_reg_mem,
	.dereg_mem = nvlink_dereg_mem,
	.pack_key = nvlink_pack_key,
	.load_peer = nvlink_load_peer,
	.unload_peer = nvlink_unload_peer,
	.unpack_remote_key = nvlink_unpack_remote_key,
	.release_remote_key = nvlink_release_remote_key,
	.submit = nvlink_submit,
	.progress = nvlink_progress,
	.cancel = nvlink_cancel,
	.retry_prepare = nvlink_retry_prepare,
	.wait = nvlink_wait,
	.mem_query = nvlink_mem_query,
	.mem_copy = nvlink_mem_copy,
	.mem_dmabuf = nvlink_mem_dmabuf,
	.mem_alloc = nvlink_mem_alloc,
	.mem_free = nvlink_mem_free,
};

static const struct te_plugin_desc nvlink_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = NVLINK_NAME,
	.version = "1.0",
	.description =
		"CUDA copies between GPU memory of processes (IPC, VMM fds, FABRIC handles); "
		"owns memory kind cuda",
	.ops = &nvlink_ops,
};

TE_PLUGIN_DEFINE(&nvlink_desc)
