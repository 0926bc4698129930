/* SPDX-License-Identifier: Apache-2.0 */
/* nvlink.h: what the nvlink plugin's files share (driver table, instance, fd-passing socket). */
#ifndef TE_PLUGINS_NVLINK_H
#define TE_PLUGINS_NVLINK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>

#include <te/te_plugin.h>

#define NVLINK_NAME "nvlink"

/*
 * Every driver entry point is resolved through cuGetProcAddress at this CUDA version (12.0), so
 * the plugin gets the ABI variant its cuda.h prototypes describe on any newer driver, and an
 * older driver is refused at init with its version in the message.
 */
#define NVLINK_CUDA_VERSION 12000

#define NVLINK_MAX_DEV 64u
#define NVLINK_DETAIL 224u /* bytes of a failure's detail (a deferred one lives in slice->priv) */

/*
 * The driver entry points the plugin uses: member (as cuda.h names it, which may be a
 * versioned symbol such as cuMemAlloc_v2) and the base name cuGetProcAddress wants.
 */
#define NVLINK_CU_FNS(X)                                                                           \
	X(cuGetErrorString, "cuGetErrorString")                                                    \
	X(cuGetErrorName, "cuGetErrorName")                                                        \
	X(cuInit, "cuInit")                                                                        \
	X(cuDeviceGetCount, "cuDeviceGetCount")                                                    \
	X(cuDeviceGet, "cuDeviceGet")                                                              \
	X(cuDeviceGetName, "cuDeviceGetName")                                                      \
	X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                                            \
	X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")                                              \
	X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")                                          \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                                    \
	X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease")                                  \
	X(cuCtxSetCurrent, "cuCtxSetCurrent")                                                      \
	X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")                                          \
	X(cuMemAlloc, "cuMemAlloc")                                                                \
	X(cuMemFree, "cuMemFree")                                                                  \
	X(cuPointerGetAttributes, "cuPointerGetAttributes")                                        \
	X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                                                  \
	X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle")                                                \
	X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle")                                              \
	X(cuMemCreate, "cuMemCreate")                                                              \
	X(cuMemRelease, "cuMemRelease")                                                            \
	X(cuMemAddressReserve, "cuMemAddressReserve")                                              \
	X(cuMemAddressFree, "cuMemAddressFree")                                                    \
	X(cuMemMap, "cuMemMap")                                                                    \
	X(cuMemUnmap, "cuMemUnmap")                                                                \
	X(cuMemSetAccess, "cuMemSetAccess")                                                        \
	X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")                          \
	X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle")                            \
	X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle")                        \
	X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle")                              \
	X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle")        \
	X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange")                          \
	X(cuMemHostRegister, "cuMemHostRegister")                                                  \
	X(cuMemHostUnregister, "cuMemHostUnregister")                                              \
	X(cuStreamCreate, "cuStreamCreate")                                                        \
	X(cuStreamDestroy, "cuStreamDestroy")                                                      \
	X(cuStreamSynchronize, "cuStreamSynchronize")                                              \
	X(cuMemcpy, "cuMemcpy")                                                                    \
	X(cuMemcpyAsync, "cuMemcpyAsync")                                                          \
	X(cuEventCreate, "cuEventCreate")                                                          \
	X(cuEventDestroy, "cuEventDestroy")                                                        \
	X(cuEventRecord, "cuEventRecord")                                                          \
	X(cuEventQuery, "cuEventQuery")                                                            \
	X(cuEventSynchronize, "cuEventSynchronize")

#define NVLINK_CU_MEMBER(fn, name) __typeof__(fn) *fn;
struct nvlink_cu {
	NVLINK_CU_FNS(NVLINK_CU_MEMBER)
};
#undef NVLINK_CU_MEMBER

struct nvlink_inst;

/* One export served to peers over the fd socket: a VMM allocation's POSIX file descriptor. */
struct nvlink_export {
	struct nvlink_export *next;
	uint64_t id;
	int fd;
	uint64_t size; /* bytes of the allocation */
};

/* The fd-passing socket of this instance (nvlink_sock.c). */
struct nvlink_sock {
	int listen_fd;
	int stop_fd; /* eventfd */
	pthread_t thread;
	bool started;
	char name[108]; /* abstract name, without the leading NUL */
};

/* Start serving this instance's exports on its abstract socket; TE_OK or why not (set_error). */
enum te_status nvlink_sock_start(struct nvlink_inst *ni);
void nvlink_sock_stop(struct nvlink_inst *ni);

/*
 * Ask the peer instance (@pid, @nonce) on this host for the file descriptor of its export @id:
 * *fd_out (caller closes) and *size_out. Blocks up to @timeout_ms. TE_ERR_PEER_UNREACHABLE,
 * TE_ERR_AUTH, TE_ERR_PROTOCOL, the server's status; @why (NVLINK_DETAIL bytes) says why.
 */
enum te_status nvlink_sock_fetch(struct nvlink_inst *ni, uint32_t pid, uint64_t nonce, uint64_t id,
				 uint32_t timeout_ms, int *fd_out, uint64_t *size_out, char *why);

/* The abstract socket name of instance @nonce of process @pid. */
void nvlink_sock_name(uint32_t pid, uint64_t nonce, char *buf, size_t len);

/* Accessors nvlink_sock.c needs from the instance (nvlink.c). */
const struct te_plugin_host *nvlink_host(const struct nvlink_inst *ni);
struct te_plugin_host_ctx *nvlink_ctx(const struct nvlink_inst *ni);
uint64_t nvlink_nonce(const struct nvlink_inst *ni);
bool nvlink_auth(const struct nvlink_inst *ni);
struct nvlink_sock *nvlink_sock_of(struct nvlink_inst *ni);
/* The export @id: a duplicate of its fd (caller closes) and its size; false when unknown. */
bool nvlink_export_dup(struct nvlink_inst *ni, uint64_t id, int *fd_out, uint64_t *size_out);

#endif /* TE_PLUGINS_NVLINK_H */
