/* SPDX-License-Identifier: Apache-2.0 */
/* fakehip.c: a fake libamdhip64.so on host memory, the subset of the HIP runtime API hip uses. */

/*
 * The HIP face of the fake GPU runtime of tests/gpu/fakedev (fakedev.h: devices, memfd memory
 * shared by IPC handles, streams, events, faults from FAKEHIP_* variables, fakedev_live()).
 * What is HIP's own is here: lazy initialisation (FAKEHIP_DEVICES=0: hipGetDeviceCount fails
 * with hipErrorNoDevice), the current device per thread (hipSetDevice; device 0 before any),
 * error codes and texts, pointer attributes, copy kinds, and what changed between ROCm 5 and 6.
 *
 * FAKEHIP_RUNTIME_VERSION (HIP_VERSION encoding, default 50731921: ROCm 5.7) is what
 * hipRuntimeGetVersion and hipDriverGetVersion report, and it decides, as in ROCm:
 * - hipPointerAttribute_t.type: ROCm 5 numbers hipMemoryTypeHost 0, Device 1 and refuses
 *   memory it does not know (hipErrorInvalidValue); ROCm 6 numbers Unregistered 0, Host 1,
 *   Device 2 and answers Unregistered for unknown memory.
 * - hipGetErrorString: ROCm 5 gives the error's name, ROCm 6 a sentence.
 * - hipIpcOpenMemHandle's only flag hipIpcMemLazyEnablePeerAccess: 0 in ROCm 5, 1 in ROCm 6.
 * Copies check their hipMemcpyKind against where the pointers are (hipErrorInvalidValue).
 */

#include "../fakedev/fakedev.h"

#include <stdio.h>
#include <string.h>

#include <hip/hip_runtime_api.h>

#define FH_DEF_VERSION 50731921
#define FH_ROCM6 60000000
#define FH_IPC_MAGIC "FAKEHIP1"

_Static_assert(sizeof(struct fdev_handle) <= sizeof(hipIpcMemHandle_t), "IPC handle too small");

static pthread_once_t fh_once = PTHREAD_ONCE_INIT;
static int fh_version;

static void fh_init_once(void)
{
	static const struct fdev_config cfg = { .prefix = "FAKEHIP", .default_dev0 = true };

	fdev_configure(&cfg);
	fh_version = (int)fdev_env_ll("RUNTIME_VERSION", FH_DEF_VERSION);
	if (fdev.n_dev > 0)
		fdev_set_inited();
}

/* HIP initialises on first use: every entry point starts here. */
static hipError_t fh_init(void)
{
	pthread_once(&fh_once, fh_init_once);
	return fdev.n_dev > 0 ? hipSuccess : hipErrorNoDevice;
}

/* --- errors ------------------------------------------------------------------------------- */

static const struct {
	hipError_t code;
	enum fdev_err from; /* the fakedev error it stands for (FDEV_E_COUNT: none) */
	const char *name;
	const char *text; /* ROCm 6's */
} fh_errors[] = {
	{ hipSuccess, FDEV_OK, "hipSuccess", "no error" },
	{ hipErrorInvalidValue, FDEV_E_INVALID_VALUE, "hipErrorInvalidValue", "invalid argument" },
	{ hipErrorOutOfMemory, FDEV_E_OUT_OF_MEMORY, "hipErrorOutOfMemory", "out of memory" },
	{ hipErrorNotInitialized, FDEV_E_NOT_INITIALIZED, "hipErrorNotInitialized",
	  "initialization error" },
	{ hipErrorNoDevice, FDEV_E_NO_DEVICE, "hipErrorNoDevice",
	  "no ROCm-capable device is detected" },
	{ hipErrorInvalidDevice, FDEV_E_INVALID_DEVICE, "hipErrorInvalidDevice",
	  "invalid device ordinal" },
	{ hipErrorInvalidContext, FDEV_E_INVALID_CONTEXT, "hipErrorInvalidContext",
	  "invalid device context" },
	{ hipErrorMapFailed, FDEV_E_MAP_FAILED, "hipErrorMapFailed",
	  "mapping of buffer object failed" },
	{ hipErrorAlreadyMapped, FDEV_E_ALREADY_MAPPED, "hipErrorAlreadyMapped",
	  "resource already mapped" },
	{ hipErrorPeerAccessUnsupported, FDEV_E_PEER_UNSUPPORTED, "hipErrorPeerAccessUnsupported",
	  "peer access is not supported between these two devices" },
	{ hipErrorInvalidHandle, FDEV_E_INVALID_HANDLE, "hipErrorInvalidHandle",
	  "invalid resource handle" },
	{ hipErrorNotFound, FDEV_E_NOT_FOUND, "hipErrorNotFound", "named symbol not found" },
	{ hipErrorNotReady, FDEV_E_NOT_READY, "hipErrorNotReady", "device not ready" },
	{ hipErrorIllegalAddress, FDEV_E_ILLEGAL_ADDRESS, "hipErrorIllegalAddress",
	  "an illegal memory access was encountered" },
	{ hipErrorPeerAccessAlreadyEnabled, FDEV_E_PEER_ALREADY_ENABLED,
	  "hipErrorPeerAccessAlreadyEnabled", "peer access is already enabled" },
	{ hipErrorHostMemoryAlreadyRegistered, FDEV_E_HOST_ALREADY_REGISTERED,
	  "hipErrorHostMemoryAlreadyRegistered",
	  "part or all of the requested memory range is already mapped" },
	{ hipErrorHostMemoryNotRegistered, FDEV_E_HOST_NOT_REGISTERED,
	  "hipErrorHostMemoryNotRegistered",
	  "pointer does not correspond to a registered memory region" },
	{ hipErrorNotSupported, FDEV_E_NOT_SUPPORTED, "hipErrorNotSupported",
	  "operation not supported" },
	{ hipErrorUnknown, FDEV_E_UNKNOWN, "hipErrorUnknown", "unknown error" },
};

static hipError_t fh_res(enum fdev_err e)
{
	if (e == FDEV_E_NOT_PERMITTED)
		return hipErrorInvalidValue; /* ROCm 5 has no hipErrorNotPermitted */
	for (size_t i = 0; i < sizeof(fh_errors) / sizeof(fh_errors[0]); i++)
		if (fh_errors[i].from == e)
			return fh_errors[i].code;
	return hipErrorUnknown;
}

const char *hipGetErrorName(hipError_t hip_error)
{
	for (size_t i = 0; i < sizeof(fh_errors) / sizeof(fh_errors[0]); i++)
		if (fh_errors[i].code == hip_error)
			return fh_errors[i].name;
	return "hipErrorUnknown";
}

const char *hipGetErrorString(hipError_t hipError)
{
	pthread_once(&fh_once, fh_init_once);
	for (size_t i = 0; i < sizeof(fh_errors) / sizeof(fh_errors[0]); i++)
		if (fh_errors[i].code == hipError)
			return fh_version >= FH_ROCM6 ? fh_errors[i].text : fh_errors[i].name;
	return fh_version >= FH_ROCM6 ? "unknown error" : "hipErrorUnknown";
}

/* --- versions, devices -------------------------------------------------------------------- */

hipError_t hipRuntimeGetVersion(int *runtimeVersion)
{
	pthread_once(&fh_once, fh_init_once);
	if (!runtimeVersion)
		return hipErrorInvalidValue;
	*runtimeVersion = fh_version;
	return hipSuccess;
}

hipError_t hipDriverGetVersion(int *driverVersion)
{
	return hipRuntimeGetVersion(driverVersion);
}

hipError_t hipGetDeviceCount(int *count)
{
	hipError_t r = fh_init();

	if (!count)
		return hipErrorInvalidValue;
	*count = fdev.n_dev;
	return r;
}

static hipError_t fh_dev(int dev)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_check_dev(dev));
}

hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device)
{
	hipError_t r = fh_dev(device);

	if (r)
		return r;
	if (!name || len <= 0)
		return hipErrorInvalidValue;
	snprintf(name, (size_t)len, "fakehip GPU %d", device);
	return hipSuccess;
}

hipError_t hipDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
	hipError_t r = fh_dev(device);

	if (r)
		return r;
	if (!pciBusId || len < 13)
		return hipErrorInvalidValue;
	fdev_pci_bus_id(device, pciBusId, (size_t)len);
	return hipSuccess;
}

hipError_t hipSetDevice(int deviceId)
{
	hipError_t r = fh_dev(deviceId);

	if (r)
		return r;
	fdev_current = &fdev.ctx[deviceId];
	return hipSuccess;
}

hipError_t hipDeviceCanAccessPeer(int *canAccessPeer, int deviceId, int peerDeviceId)
{
	hipError_t r = fh_dev(deviceId);

	if (!r)
		r = fh_dev(peerDeviceId);
	if (r)
		return r;
	if (!canAccessPeer)
		return hipErrorInvalidValue;
	*canAccessPeer = fdev_can_access_peer(deviceId, peerDeviceId);
	return hipSuccess;
}

hipError_t hipDeviceEnablePeerAccess(int peerDeviceId, unsigned int flags)
{
	struct fdev_ctx *c;
	hipError_t r = fh_init();

	if (r)
		return r;
	r = fh_res(fdev_cur(&c));
	if (r)
		return r;
	if (flags)
		return hipErrorInvalidValue;
	return fh_res(fdev_enable_peer(c, peerDeviceId));
}

/* --- memory ------------------------------------------------------------------------------- */

hipError_t hipMalloc(void **ptr, size_t size)
{
	uintptr_t p = 0;
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!ptr)
		return hipErrorInvalidValue;
	r = fh_res(fdev_alloc(size, &p));
	if (!r)
		*ptr = (void *)p;
	return r;
}

hipError_t hipFree(void *ptr)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_free((uintptr_t)ptr));
}

hipError_t hipMemGetAddressRange(hipDeviceptr_t *pbase, size_t *psize, hipDeviceptr_t dptr)
{
	uintptr_t base = 0;
	hipError_t r = fh_init();

	if (r)
		return r;
	r = fh_res(fdev_address_range((uintptr_t)dptr, &base, psize));
	if (!r && pbase)
		*pbase = (hipDeviceptr_t)base;
	return r;
}

hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr)
{
	bool rocm6 = fh_version >= FH_ROCM6;
	struct fdev_hostreg *h;
	int dev = -1;
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!attributes || !ptr)
		return hipErrorInvalidValue;
	memset(attributes, 0, sizeof(*attributes));
	attributes->device = -1;
	if (fdev_is_device((uintptr_t)ptr, &dev)) {
		attributes->memoryType = (enum hipMemoryType)(rocm6 ? 2 : 1);
		attributes->device = dev;
		attributes->devicePointer = (void *)ptr;
		return hipSuccess;
	}
	pthread_mutex_lock(&fdev.lock);
	h = fdev_hostreg_find((uintptr_t)ptr);
	pthread_mutex_unlock(&fdev.lock);
	if (h) {
		attributes->memoryType = (enum hipMemoryType)(rocm6 ? 1 : 0);
		attributes->device = fdev_current ? fdev_current->dev : 0;
		attributes->hostPointer = (void *)ptr;
		attributes->devicePointer = (void *)ptr;
		return hipSuccess;
	}
	/* ROCm 6: hipMemoryTypeUnregistered; ROCm 5 refuses what it does not know. */
	return rocm6 ? hipSuccess : hipErrorInvalidValue;
}

hipError_t hipHostRegister(void *hostPtr, size_t sizeBytes, unsigned int flags)
{
	hipError_t r = fh_init();

	(void)flags;
	return r ? r : fh_res(fdev_host_register(hostPtr, sizeBytes));
}

hipError_t hipHostUnregister(void *hostPtr)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_host_unregister(hostPtr));
}

/* ROCm 6's dma-buf export (not in ROCm 5 headers): hipMemRangeHandleTypeDmaBufFd is 1. */
hipError_t hipMemGetHandleForAddressRange(void *handle, hipDeviceptr_t dptr, size_t size,
					  int handleType, unsigned long long flags);
hipError_t hipMemGetHandleForAddressRange(void *handle, hipDeviceptr_t dptr, size_t size,
					  int handleType, unsigned long long flags)
{
	hipError_t r = fh_init();

	if (r)
		return r;
	if (handleType != 1 || flags)
		return hipErrorInvalidValue;
	return fh_res(fdev_dmabuf((uintptr_t)dptr, size, handle));
}

/* --- IPC ---------------------------------------------------------------------------------- */

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *devPtr)
{
	hipError_t r = fh_init();

	if (r)
		return r;
	return fh_res(fdev_ipc_get((uintptr_t)devPtr, FH_IPC_MAGIC, handle,
				   handle ? sizeof(*handle) : 0));
}

hipError_t hipIpcOpenMemHandle(void **devPtr, hipIpcMemHandle_t handle, unsigned int flags)
{
	unsigned lazy = fh_version >= FH_ROCM6 ? 1 : 0; /* hipIpcMemLazyEnablePeerAccess */
	uintptr_t p = 0;
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!devPtr || flags != lazy)
		return hipErrorInvalidValue;
	r = fh_res(fdev_ipc_open(handle.reserved, FH_IPC_MAGIC, &p));
	if (!r)
		*devPtr = (void *)p;
	return r;
}

hipError_t hipIpcCloseMemHandle(void *devPtr)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_ipc_close((uintptr_t)devPtr));
}

/* --- streams, events, copies -------------------------------------------------------------- */

/* hipStream_t and hipEvent_t are fakedev's streams and events. */
#define FH_STREAM(s) ((struct fdev_stream *)(void *)(s))
#define FH_EVENT(e) ((struct fdev_event *)(void *)(e))

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
	struct fdev_stream *s = NULL;
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!stream || flags & ~(unsigned)hipStreamNonBlocking)
		return hipErrorInvalidValue;
	r = fh_res(fdev_stream_create(&s));
	if (!r)
		*stream = (hipStream_t)(void *)s;
	return r;
}

hipError_t hipStreamDestroy(hipStream_t stream)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_stream_destroy(FH_STREAM(stream)));
}

hipError_t hipStreamSynchronize(hipStream_t stream)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_stream_sync(FH_STREAM(stream)));
}

hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
	struct fdev_event *e = NULL;
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!event || flags & ~(unsigned)(hipEventBlockingSync | hipEventDisableTiming))
		return hipErrorInvalidValue;
	r = fh_res(fdev_event_create(flags, &e));
	if (!r)
		*event = (hipEvent_t)(void *)e;
	return r;
}

hipError_t hipEventDestroy(hipEvent_t event)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_event_destroy(FH_EVENT(event)));
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_event_record(FH_EVENT(event), FH_STREAM(stream)));
}

hipError_t hipEventQuery(hipEvent_t event)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_event_query(FH_EVENT(event)));
}

hipError_t hipEventSynchronize(hipEvent_t event)
{
	hipError_t r = fh_init();

	return r ? r : fh_res(fdev_event_sync(FH_EVENT(event)));
}

/* Whether @kind says where @dst and @src are (hipMemcpyDefault: anything). */
static bool fh_kind_ok(void *dst, const void *src, hipMemcpyKind kind)
{
	bool d = fdev_is_device((uintptr_t)dst, NULL), s = fdev_is_device((uintptr_t)src, NULL);

	switch (kind) {
	case hipMemcpyHostToHost:
		return !d && !s;
	case hipMemcpyHostToDevice:
		return d && !s;
	case hipMemcpyDeviceToHost:
		return !d && s;
	case hipMemcpyDeviceToDevice:
		return d && s;
	case hipMemcpyDefault:
		return true;
	default:
		return false;
	}
}

hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!fh_kind_ok(dst, src, kind))
		return hipErrorInvalidValue;
	return fh_res(fdev_copy((uintptr_t)dst, (uintptr_t)src, sizeBytes));
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
			  hipStream_t stream)
{
	hipError_t r = fh_init();

	if (r)
		return r;
	if (!fh_kind_ok(dst, src, kind))
		return hipErrorInvalidValue;
	return fh_res(
		fdev_copy_async((uintptr_t)dst, (uintptr_t)src, sizeBytes, FH_STREAM(stream)));
}
