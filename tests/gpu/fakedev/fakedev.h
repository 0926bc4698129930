/* SPDX-License-Identifier: Apache-2.0 */
/* fakedev.h: the vendor-neutral core of the fake GPU runtimes (fakecuda, fakehip) on host memory. */

/*
 * What it models (tests/gpu/gpu_test.c relies on all of it), whatever the API over it:
 *
 * Devices. <P>_DEVICES GPUs (default 2; 0: the runtime finds none), named "<name> GPU <n>", PCI
 * bus id 0000:<16 + 16 n>:00.0, every pair peer capable unless <P>_NO_PEER=1. <P> is the
 * shim's prefix (FAKECUDA, FAKEHIP). Each device has a context: a sticky error, peers enabled.
 *
 * Memory. Every allocation is a memfd. Its "device pointer" is an address of this process
 * reserved PROT_NONE, so that a host access to device memory faults as it would on a GPU; copies
 * reach the bytes through a second, shared mapping of the same memfd (the shadow). IPC handles
 * name the exporting process, the memfd's descriptor number there and a nonce in the memfd's
 * name: the importer opens /proc/<pid>/fd/<n>, so both processes really share the bytes, and a
 * handle of a process that is gone fails with FDEV_E_INVALID_HANDLE.
 *
 * Streams and events. Each stream has a worker thread that runs its copies in order; an event
 * completes when the copies enqueued on its stream before the record are done.
 *
 * Faults, from the environment (read once, at the runtime's initialisation):
 *   <P>_FAIL_COPY_AFTER=N   the async copy number N+1 (counted from 1 per process) fails at
 *                           launch with FDEV_E_UNKNOWN; <P>_FAIL_COPY_COUNT=K (1) copies from
 *                           there fail, 0: all of them
 *   <P>_STICKY_AFTER=N      async copy N+1 raises a sticky FDEV_E_ILLEGAL_ADDRESS in its
 *                           context: it and everything after fail, as on a GPU
 *   <P>_OOM_BYTES=N         allocations beyond N bytes per device fail (out of memory)
 *   <P>_MEM_BYTES=N         the devices' memory (16 GiB)
 *   <P>_IPC_OPEN_FAIL=1     opening an IPC (or other shareable) handle fails with
 *                           FDEV_E_MAP_FAILED
 *   <P>_COPY_DELAY_US=N     every async copy takes N microseconds longer
 *   <P>_FABRIC=1            devices support FABRIC handles (CUDA)
 *   <P>_INLINE_COPIES=1     an async copy on an idle stream runs inside the launch call, so
 *                           the runtime costs next to nothing (te-bench overhead figures)
 *   <P>_SYNC_FAULTS=1       synchronous copies (te_mem_copy, the core's staging) take the copy
 *                           delay and count for <P>_FAIL_COPY_* too
 * Otherwise synchronous copies are not counted by the copy faults; a sticky context fails them.
 *
 * Errors are enum fdev_err; each shim turns them into its runtime's codes and texts. Everything
 * here is hidden in the shim's shared library but fakedev_live(), which the tests call.
 */
#ifndef FAKEDEV_H
#define FAKEDEV_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FDEV_MAX_DEV 16
#define FDEV_PAGE 4096ull

/* Runtime-neutral errors; a shim maps each to its runtime's code. */
enum fdev_err {
	FDEV_OK = 0,
	FDEV_E_INVALID_VALUE,
	FDEV_E_OUT_OF_MEMORY,
	FDEV_E_NOT_INITIALIZED,
	FDEV_E_NO_DEVICE,
	FDEV_E_INVALID_DEVICE,
	FDEV_E_INVALID_CONTEXT,
	FDEV_E_MAP_FAILED,
	FDEV_E_ALREADY_MAPPED,
	FDEV_E_PEER_UNSUPPORTED,
	FDEV_E_INVALID_HANDLE,
	FDEV_E_NOT_FOUND,
	FDEV_E_NOT_READY,
	FDEV_E_ILLEGAL_ADDRESS,
	FDEV_E_PEER_ALREADY_ENABLED,
	FDEV_E_HOST_ALREADY_REGISTERED,
	FDEV_E_HOST_NOT_REGISTERED,
	FDEV_E_NOT_PERMITTED,
	FDEV_E_NOT_SUPPORTED,
	FDEV_E_UNKNOWN,
	FDEV_E_COUNT
};

/* Exported for tests (not part of any runtime): counts of what is still alive. */
struct fakedev_live {
	int allocs;	  /* device allocations (cuMemAlloc, hipMalloc) */
	int ipc_maps;	  /* IPC handles opened */
	int vmm_maps;	  /* cuMemMap mappings */
	int vmm_handles;  /* physical allocations (cuMemCreate / imported) */
	int reservations; /* cuMemAddressReserve ranges */
	int host_regs;	  /* registered (pinned) host ranges */
	int streams;
	int events;
	int ctx_refs; /* primary context references, all devices (CUDA) */
};
__attribute__((visibility("default"))) void fakedev_live(struct fakedev_live *out);

/* The rest is internal to the shim's library. */
#pragma GCC visibility push(hidden)

/* One physical allocation: a memfd and its shadow mapping (what copies touch). */
struct fdev_phys {
	int fd;
	size_t size;
	uint8_t *shadow;
	int refs; /* under fdev.lock */
	int dev;
	bool vmm;
	bool charged; /* counts against the device's memory (allocated here, not imported) */
	unsigned long long prop[8]; /* the shim's allocation properties (CUmemAllocationProp) */
	char nonce[24];
	struct fdev_phys *next; /* live list, for handle validation */
};

enum fdev_map_kind {
	FDEV_MAP_ALLOC = 1, /* cuMemAlloc, hipMalloc */
	FDEV_MAP_IPC = 2,   /* an opened IPC handle */
	FDEV_MAP_VMM = 3,   /* cuMemMap */
};

/* A range of device addresses backed by (the start of) a physical allocation. */
struct fdev_map {
	uintptr_t va;
	size_t size;  /* bytes usable (allocations: as requested) */
	size_t vsize; /* bytes of address space reserved for it (page multiple) */
	struct fdev_phys *phys;
	enum fdev_map_kind kind;
	int dev;
	int ipc_refs;	    /* FDEV_MAP_IPC: opens in this process */
	unsigned access_rw; /* FDEV_MAP_VMM: devices with read-write access (bit per device) */
	unsigned access_ro; /* FDEV_MAP_VMM: devices with read-only access */
};

struct fdev_resv {
	uintptr_t va;
	size_t size;
};

struct fdev_hostreg {
	uintptr_t p;
	size_t size;
};

/* A device's context (CUDA's primary context; HIP's device state). */
struct fdev_ctx {
	int dev;
	int refs;	   /* under fdev.lock (CUDA's retains) */
	atomic_int sticky; /* enum fdev_err of a sticky error, 0 none */
	unsigned peers;	   /* peer access enabled towards these devices */
};

struct fdev_stream;
struct fdev_event;

/* The shim's configuration of the core (before fdev_configure). */
struct fdev_config {
	const char *prefix; /* of the environment variables: "FAKECUDA" */
	bool default_dev0;  /* no current context means device 0 (HIP), else an error (CUDA) */
};

struct fdev_state {
	/* Everything below but the atomics; a cache line of its own, away from hot counters. */
	_Alignas(64) pthread_mutex_t lock;
	struct fdev_config cfg;
	bool inited;
	int n_dev;
	uint64_t mem_bytes;
	uint64_t oom_bytes;
	bool no_peer;
	bool fabric;
	bool ipc_open_fail;
	bool inline_copies;
	long long fail_after, fail_count, sticky_after;
	unsigned delay_us;
	bool sync_faults; /* synchronous copies take the delay and count for the copy faults */
	_Alignas(64) atomic_llong copies;
	_Alignas(64) _Atomic uint64_t map_gen; /* bumped by every change of maps or their access */
	uint64_t allocated[FDEV_MAX_DEV];
	struct fdev_ctx ctx[FDEV_MAX_DEV];
	struct fdev_map *maps; /* sorted by va */
	size_t n_maps, cap_maps;
	struct fdev_resv *resv;
	size_t n_resv, cap_resv;
	struct fdev_hostreg *hregs;
	size_t n_hregs, cap_hregs;
	struct fdev_phys *phys;
	struct fdev_stream **streams;
	size_t n_streams, cap_streams;
	int n_events;
};

extern struct fdev_state fdev;

/* initial-exec: no __tls_get_addr per call (the few bytes fit glibc's static TLS surplus). */
#define FDEV_TLS __thread __attribute__((tls_model("initial-exec")))

/* This thread's current context (NULL: none). */
extern FDEV_TLS struct fdev_ctx *fdev_current;

/* --- setup, helpers ---------------------------------------------------------------------- */

/* "<prefix>_<name>" of the environment as a number, else @def. */
long long fdev_env_ll(const char *name, long long def);
/* Read the environment (once, from the shim's initialisation). */
void fdev_configure(const struct fdev_config *cfg);
/* The runtime initialised (the shim's init succeeded). */
void fdev_set_inited(void);
enum fdev_err fdev_ready(void);
enum fdev_err fdev_check_dev(int dev);
/* The current context, or why there is none usable (sticky errors included). */
enum fdev_err fdev_cur(struct fdev_ctx **out);
bool fdev_ctx_valid(const struct fdev_ctx *c);
size_t fdev_round(size_t n, size_t to);
void fdev_pci_bus_id(int dev, char *buf, size_t len);
/* Peer access from @c to device @peer; FDEV_E_PEER_ALREADY_ENABLED the second time. */
enum fdev_err fdev_enable_peer(struct fdev_ctx *c, int peer);
bool fdev_can_access_peer(int dev, int peer);

/* --- physical allocations and maps (under fdev.lock) ------------------------------------- */

enum fdev_err fdev_phys_new(int dev, size_t size, struct fdev_phys **out);
/* Wrap an existing memfd (taken over) of another process or of this one; refs 1. */
enum fdev_err fdev_phys_adopt(int fd, struct fdev_phys **out);
bool fdev_phys_live(const struct fdev_phys *p);
void fdev_phys_unref(struct fdev_phys *p);
enum fdev_err fdev_charge(int dev, size_t size);
struct fdev_map *fdev_map_find(uintptr_t va);
enum fdev_err fdev_map_insert(const struct fdev_map *m);
void fdev_map_remove(struct fdev_map *m);
struct fdev_resv *fdev_resv_find(uintptr_t va, size_t len);
void *fdev_reserve(size_t size);
/* Open the memfd @fd of process @pid if its name carries @nonce; -1 and why otherwise. */
int fdev_open_remote(int32_t pid, int32_t fd, const char *nonce, enum fdev_err *why);

/* --- the calls runtimes share (they lock) ------------------------------------------------- */

/* A device allocation of @size bytes on the current context's device. */
enum fdev_err fdev_alloc(size_t size, uintptr_t *out);
enum fdev_err fdev_free(uintptr_t p);
enum fdev_err fdev_address_range(uintptr_t p, uintptr_t *base, size_t *size);
/* Whether @p is device memory (in a map); *@dev its device. */
bool fdev_is_device(uintptr_t p, int *dev);
struct fdev_hostreg *fdev_hostreg_find(uintptr_t p);
enum fdev_err fdev_host_register(void *p, size_t size);
enum fdev_err fdev_host_unregister(void *p);
/* A dmabuf descriptor of [@p, +@size): the allocation's memfd (it must start there). */
enum fdev_err fdev_dmabuf(uintptr_t p, size_t size, int *fd_out);

/* Shareable handles (IPC, FABRIC): what names an allocation's memfd to another process. */
struct fdev_handle {
	char magic[8];
	int32_t pid;
	int32_t fd;
	uint64_t size; /* usable bytes */
	int32_t dev;
	char nonce[24];
};
void fdev_handle_fill(struct fdev_handle *h, const char *magic, const struct fdev_phys *p,
		      uint64_t size, int dev);
/* The IPC handle of the allocation at @p (@magic: the shim's) into @out (at most @len bytes). */
enum fdev_err fdev_ipc_get(uintptr_t p, const char *magic, void *out, size_t len);
/* Map the IPC handle @h (of another process) here; the same handle again: the same mapping. */
enum fdev_err fdev_ipc_open(const void *h, const char *magic, uintptr_t *out);
enum fdev_err fdev_ipc_close(uintptr_t p);

/* --- streams, copies, events -------------------------------------------------------------- */

enum fdev_err fdev_stream_create(struct fdev_stream **out);
enum fdev_err fdev_stream_destroy(struct fdev_stream *s);
enum fdev_err fdev_stream_sync(struct fdev_stream *s);
enum fdev_err fdev_stream_query(struct fdev_stream *s);
struct fdev_ctx *fdev_stream_ctx(struct fdev_stream *s);
/* Wait for every stream of @c. */
enum fdev_err fdev_ctx_sync(struct fdev_ctx *c);
/* A synchronous copy by the current device (faults: <P>_SYNC_FAULTS). */
enum fdev_err fdev_copy(uintptr_t dst, uintptr_t src, size_t n);
/* An async copy on @s (NULL: synchronous). */
enum fdev_err fdev_copy_async(uintptr_t dst, uintptr_t src, size_t n, struct fdev_stream *s);
enum fdev_err fdev_event_create(unsigned flags, struct fdev_event **out);
enum fdev_err fdev_event_destroy(struct fdev_event *e);
enum fdev_err fdev_event_record(struct fdev_event *e, struct fdev_stream *s);
enum fdev_err fdev_event_query(struct fdev_event *e);
enum fdev_err fdev_event_sync(struct fdev_event *e);

#pragma GCC visibility pop

#endif
