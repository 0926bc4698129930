/* SPDX-License-Identifier: Apache-2.0 */
/* fakecuda.c: a fake libcuda.so.1 on host memory, the subset of the CUDA driver API nvlink uses. */

/*
 * The CUDA face of the fake GPU runtime of tests/gpu/fakedev (fakedev.h: devices, memfd memory
 * shared by IPC handles, streams, events, faults from FAKECUDA_* variables, fakedev_live()).
 * What is CUDA's own is here: error codes and texts, primary contexts (cuInit, retain, release:
 * the last release clears a sticky error), pointer attributes, VMM (cuMemCreate, reservations,
 * cuMemMap with access bits, POSIX fd and FABRIC handles), cuGetProcAddress with versions.
 *
 * The driver version is FAKECUDA_DRIVER_VERSION (13000); cuGetProcAddress refuses a newer
 * version with CUDA_ERROR_INVALID_VALUE, as the real driver does. Devices are named
 * "fakecuda GPU <n>" with host NUMA node n % 2. FAKECUDA_FABRIC=1: devices support FABRIC
 * handles. IPC open failures (FAKECUDA_IPC_OPEN_FAIL) hit cuMemImportFromShareableHandle too.
 */

#include "../fakedev/fakedev.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#define FK_GRANULARITY (2ull << 20)
#define FK_DEF_VERSION 13000
#define FK_IPC_MAGIC "FAKEIPC1"
#define FK_FAB_MAGIC "FAKEFAB1"

_Static_assert(sizeof(struct fdev_handle) <= CU_IPC_HANDLE_SIZE, "IPC handle too small");
_Static_assert(sizeof(CUmemAllocationProp) <= sizeof(((struct fdev_phys *)0)->prop),
	       "allocation properties");

static pthread_once_t fk_once = PTHREAD_ONCE_INIT;
static int fk_version;

/* The CUDA code of each fakedev error. */
static const CUresult fk_codes[FDEV_E_COUNT] = {
	[FDEV_OK] = CUDA_SUCCESS,
	[FDEV_E_INVALID_VALUE] = CUDA_ERROR_INVALID_VALUE,
	[FDEV_E_OUT_OF_MEMORY] = CUDA_ERROR_OUT_OF_MEMORY,
	[FDEV_E_NOT_INITIALIZED] = CUDA_ERROR_NOT_INITIALIZED,
	[FDEV_E_NO_DEVICE] = CUDA_ERROR_NO_DEVICE,
	[FDEV_E_INVALID_DEVICE] = CUDA_ERROR_INVALID_DEVICE,
	[FDEV_E_INVALID_CONTEXT] = CUDA_ERROR_INVALID_CONTEXT,
	[FDEV_E_MAP_FAILED] = CUDA_ERROR_MAP_FAILED,
	[FDEV_E_ALREADY_MAPPED] = CUDA_ERROR_ALREADY_MAPPED,
	[FDEV_E_PEER_UNSUPPORTED] = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
	[FDEV_E_INVALID_HANDLE] = CUDA_ERROR_INVALID_HANDLE,
	[FDEV_E_NOT_FOUND] = CUDA_ERROR_NOT_FOUND,
	[FDEV_E_NOT_READY] = CUDA_ERROR_NOT_READY,
	[FDEV_E_ILLEGAL_ADDRESS] = CUDA_ERROR_ILLEGAL_ADDRESS,
	[FDEV_E_PEER_ALREADY_ENABLED] = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
	[FDEV_E_HOST_ALREADY_REGISTERED] = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
	[FDEV_E_HOST_NOT_REGISTERED] = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
	[FDEV_E_NOT_PERMITTED] = CUDA_ERROR_NOT_PERMITTED,
	[FDEV_E_NOT_SUPPORTED] = CUDA_ERROR_NOT_SUPPORTED,
	[FDEV_E_UNKNOWN] = CUDA_ERROR_UNKNOWN,
};

static CUresult fk_res(enum fdev_err e)
{
	return (unsigned)e < FDEV_E_COUNT ? fk_codes[e] : CUDA_ERROR_UNKNOWN;
}

static CUmemAllocationProp *fk_prop(struct fdev_phys *p)
{
	return (CUmemAllocationProp *)(void *)p->prop;
}

static CUresult fk_check_dev(CUdevice dev)
{
	return fk_res(fdev_check_dev(dev));
}

/* The current context, as CUDA's type. */
static CUresult fk_cur(struct fdev_ctx **out)
{
	return fk_res(fdev_cur(out));
}

static void fk_init_once(void)
{
	static const struct fdev_config cfg = { .prefix = "FAKECUDA", .default_dev0 = false };

	fdev_configure(&cfg);
	fk_version = (int)fdev_env_ll("DRIVER_VERSION", FK_DEF_VERSION);
}

/* --- initialisation, version, errors ------------------------------------------------------ */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
	pthread_once(&fk_once, fk_init_once);
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fdev.n_dev == 0)
		return CUDA_ERROR_NO_DEVICE;
	fdev_set_inited();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	pthread_once(&fk_once, fk_init_once);
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = fk_version;
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
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = fdev.n_dev;
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
	fdev_pci_bus_id(dev, pciBusId, (size_t)len);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = (size_t)fdev.mem_bytes;
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
		*pi = fdev.fabric;
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
	*canAccessPeer = fdev_can_access_peer(dev, peerDev);
	return CUDA_SUCCESS;
}

/* --- contexts ----------------------------------------------------------------------------- */

/* CUcontext is fakedev's context of the device. */
static CUcontext fk_ctx(struct fdev_ctx *c)
{
	return (CUcontext)(void *)c;
}

static struct fdev_ctx *fk_of(CUcontext c)
{
	return (struct fdev_ctx *)(void *)c;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	fdev.ctx[dev].refs++;
	pthread_mutex_unlock(&fdev.lock);
	*pctx = fk_ctx(&fdev.ctx[dev]);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	CUresult r = fk_check_dev(dev);

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	if (fdev.ctx[dev].refs <= 0) {
		pthread_mutex_unlock(&fdev.lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	/* The last release destroys the context: a sticky error goes with it. */
	if (--fdev.ctx[dev].refs == 0) {
		atomic_store(&fdev.ctx[dev].sticky, 0);
		fdev.ctx[dev].peers = 0;
	}
	pthread_mutex_unlock(&fdev.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (ctx && (!fdev_ctx_valid(fk_of(ctx)) || fk_of(ctx)->refs <= 0))
		return CUDA_ERROR_INVALID_CONTEXT;
	fdev_current = fk_of(ctx);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = fk_ctx(fdev_current);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	struct fdev_ctx *c;
	CUresult r = fk_cur(&c);

	if (r)
		return r;
	if (!peerContext || !fdev_ctx_valid(fk_of(peerContext)) || Flags)
		return CUDA_ERROR_INVALID_VALUE;
	return fk_res(fdev_enable_peer(c, fk_of(peerContext)->dev));
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	struct fdev_ctx *c;
	CUresult r = fk_cur(&c);

	return r ? r : fk_res(fdev_ctx_sync(c));
}

/* --- cuMemAlloc memory, pointer attributes, legacy IPC ------------------------------------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	uintptr_t p = 0;
	CUresult r = fk_res(fdev_alloc(bytesize, dptr ? &p : NULL));

	if (!r)
		*dptr = (CUdeviceptr)p;
	return r;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	return fk_res(fdev_free((uintptr_t)dptr));
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	uintptr_t base = 0;
	CUresult r = fk_res(fdev_address_range((uintptr_t)dptr, &base, psize));

	if (!r && pbase)
		*pbase = (CUdeviceptr)base;
	return r;
}

/* One attribute of @ptr into @data; @known false: not a CUDA pointer (defaults written). */
static CUresult fk_attr(void *data, CUpointer_attribute attribute, uintptr_t ptr, bool *known)
{
	struct fdev_map *m = fdev_map_find(ptr);
	struct fdev_hostreg *h = m ? NULL : fdev_hostreg_find(ptr);

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
		*(int *)data = m && m->kind == FDEV_MAP_ALLOC;
		break;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = m ? fk_ctx(&fdev.ctx[m->dev]) : NULL;
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
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	r = fk_attr(data, attribute, (uintptr_t)ptr, &known);
	pthread_mutex_unlock(&fdev.lock);
	/* Unlike the plural call, this one refuses pointers CUDA does not know. */
	if (!r && !known)
		return CUDA_ERROR_INVALID_VALUE;
	return r;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
					void **data, CUdeviceptr ptr)
{
	bool known;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	for (unsigned i = 0; i < numAttributes && !r; i++)
		r = data[i] ? fk_attr(data[i], attributes[i], (uintptr_t)ptr, &known)
			    : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	return fk_res(fdev_ipc_get((uintptr_t)dptr, FK_IPC_MAGIC, pHandle,
				   pHandle ? sizeof(*pHandle) : 0));
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	uintptr_t p = 0;
	CUresult r;

	if (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return CUDA_ERROR_INVALID_VALUE;
	r = fk_res(fdev_ipc_open(handle.reserved, FK_IPC_MAGIC, pdptr ? &p : NULL));
	if (!r)
		*pdptr = (CUdeviceptr)p;
	return r;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	return fk_res(fdev_ipc_close((uintptr_t)dptr));
}

/* --- virtual memory management ------------------------------------------------------------ */

static struct fdev_phys *fk_handle(CUmemGenericAllocationHandle h)
{
	struct fdev_phys *p = (struct fdev_phys *)(uintptr_t)h;

	return p && fdev_phys_live(p) && p->vmm ? p : NULL;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	CUresult r = fk_res(fdev_ready());

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
	struct fdev_phys *p = NULL;
	unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
	CUresult r = fk_res(fdev_ready());

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
	if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && !fdev.fabric)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&fdev.lock);
	r = fk_res(fdev_charge(prop->location.id, size));
	if (!r) {
		r = fk_res(fdev_phys_new(prop->location.id, size, &p));
		if (r)
			fdev.allocated[prop->location.id] -= size;
	}
	if (!r) {
		p->vmm = true;
		*fk_prop(p) = *prop;
		*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	}
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct fdev_phys *p;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	p = fk_handle(handle);
	if (!p) {
		pthread_mutex_unlock(&fdev.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	fdev_phys_unref(p);
	pthread_mutex_unlock(&fdev.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				     CUdeviceptr addr, unsigned long long flags)
{
	void *va;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!ptr || !size || size % FK_GRANULARITY || flags || (alignment & (alignment - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	/* Over-reserve to honour the alignment, then give back the ends. */
	va = fdev_reserve(size + FK_GRANULARITY);
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
	pthread_mutex_lock(&fdev.lock);
	if (fdev.n_resv == fdev.cap_resv) {
		size_t cap = fdev.cap_resv ? 2 * fdev.cap_resv : 8;
		struct fdev_resv *n = realloc(fdev.resv, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&fdev.lock);
			munmap(va, size);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		fdev.resv = n;
		fdev.cap_resv = cap;
	}
	fdev.resv[fdev.n_resv++] = (struct fdev_resv){ (uintptr_t)va, size };
	pthread_mutex_unlock(&fdev.lock);
	*ptr = (CUdeviceptr)(uintptr_t)va;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_resv; i++) {
		struct fdev_resv *v = &fdev.resv[i];

		if (v->va != (uintptr_t)ptr || v->size != size)
			continue;
		for (size_t k = 0; k < fdev.n_maps; k++) {
			if (fdev.maps[k].va >= v->va && fdev.maps[k].va - v->va < v->size) {
				pthread_mutex_unlock(&fdev.lock);
				return CUDA_ERROR_INVALID_VALUE; /* still mapped */
			}
		}
		munmap((void *)v->va, v->size);
		fdev.resv[i] = fdev.resv[--fdev.n_resv];
		pthread_mutex_unlock(&fdev.lock);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&fdev.lock);
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	struct fdev_phys *p;
	struct fdev_map m;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	p = fk_handle(handle);
	if (!p || offset || flags || !size || size > p->size ||
	    !fdev_resv_find((uintptr_t)ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (fdev_map_find((uintptr_t)ptr) || fdev_map_find((uintptr_t)ptr + size - 1)) {
		r = CUDA_ERROR_ALREADY_MAPPED;
		goto out;
	}
	m = (struct fdev_map){ .va = (uintptr_t)ptr,
			       .size = size,
			       .vsize = size,
			       .phys = p,
			       .kind = FDEV_MAP_VMM,
			       .dev = p->dev };
	r = fk_res(fdev_map_insert(&m));
	if (!r)
		p->refs++;
out:
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult r = fk_res(fdev_ready());
	bool any = false;

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_maps;) {
		struct fdev_map *m = &fdev.maps[i];

		if (m->kind == FDEV_MAP_VMM && m->va >= (uintptr_t)ptr &&
		    m->va - (uintptr_t)ptr < size) {
			fdev_phys_unref(m->phys);
			fdev_map_remove(m);
			any = true;
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&fdev.lock);
	return any ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				size_t count)
{
	CUresult r = fk_res(fdev_ready());
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
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_maps; i++) {
		struct fdev_map *m = &fdev.maps[i];

		if (m->kind != FDEV_MAP_VMM || m->va < (uintptr_t)ptr ||
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
	atomic_fetch_add_explicit(&fdev.map_gen, 1, memory_order_release);
	pthread_mutex_unlock(&fdev.lock);
	return any ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct fdev_map *m;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find((uintptr_t)addr);
	if (!m || m->kind != FDEV_MAP_VMM) {
		pthread_mutex_unlock(&fdev.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	m->phys->refs++;
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
	pthread_mutex_unlock(&fdev.lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							CUmemGenericAllocationHandle handle)
{
	struct fdev_phys *p;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	p = fk_handle(handle);
	if (!p || !prop)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		*prop = *fk_prop(p);
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

_Static_assert(sizeof(struct fdev_handle) <= sizeof(CUmemFabricHandle), "fabric handle too small");

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
					      CUmemGenericAllocationHandle handle,
					      CUmemAllocationHandleType handleType,
					      unsigned long long flags)
{
	struct fdev_phys *p;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!shareableHandle || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	p = fk_handle(handle);
	if (!p || !(fk_prop(p)->requestedHandleTypes & handleType)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)shareableHandle = fd;
	} else if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
		struct fdev_handle f;

		fdev_handle_fill(&f, FK_FAB_MAGIC, p, p->size, p->dev);
		memset(shareableHandle, 0, sizeof(CUmemFabricHandle));
		memcpy(shareableHandle, &f, sizeof(f));
	} else {
		r = CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
						void *osHandle,
						CUmemAllocationHandleType shHandleType)
{
	struct fdev_phys *p = NULL;
	int fd = -1;
	CUresult r = fk_res(fdev_ready());

	if (r)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (fdev.ipc_open_fail)
		return CUDA_ERROR_MAP_FAILED;
	if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		fd = fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return CUDA_ERROR_INVALID_HANDLE;
	} else if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC) {
		struct fdev_handle f;
		enum fdev_err e;

		if (!osHandle)
			return CUDA_ERROR_INVALID_VALUE;
		memcpy(&f, osHandle, sizeof(f));
		if (memcmp(f.magic, FK_FAB_MAGIC, sizeof(f.magic)) != 0 || !fdev.fabric)
			return CUDA_ERROR_INVALID_VALUE;
		f.nonce[sizeof(f.nonce) - 1] = '\0';
		fd = fdev_open_remote(f.pid, f.fd, f.nonce, &e);
		if (fd < 0)
			return fk_res(e);
	} else {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_lock(&fdev.lock);
	r = fk_res(fdev_phys_adopt(fd, &p));
	if (r) {
		close(fd);
	} else {
		p->vmm = true;
		fk_prop(p)->type = CU_MEM_ALLOCATION_TYPE_PINNED;
		fk_prop(p)->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		fk_prop(p)->location.id = p->dev;
		fk_prop(p)->requestedHandleTypes = shHandleType;
		*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	}
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
					       CUmemRangeHandleType handleType,
					       unsigned long long flags)
{
	(void)flags;
	if (handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
		return CUDA_ERROR_INVALID_VALUE;
	return fk_res(fdev_dmabuf((uintptr_t)dptr, size, handle));
}

/* --- pinned host memory ------------------------------------------------------------------- */

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	(void)Flags;
	return fk_res(fdev_host_register(p, bytesize));
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	return fk_res(fdev_host_unregister(p));
}

/* --- streams, copies, events -------------------------------------------------------------- */

/* CUstream and CUevent are fakedev's streams and events. */
#define FK_STREAM(s) ((struct fdev_stream *)(void *)(s))
#define FK_EVENT(e) ((struct fdev_event *)(void *)(e))

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	struct fdev_stream *s = NULL;
	CUresult r;

	(void)Flags;
	if (!phStream)
		return CUDA_ERROR_INVALID_VALUE;
	r = fk_res(fdev_stream_create(&s));
	if (!r)
		*phStream = (CUstream)(void *)s;
	return r;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	return fk_res(fdev_stream_destroy(FK_STREAM(hStream)));
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	return fk_res(fdev_stream_sync(FK_STREAM(hStream)));
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	return fk_res(fdev_stream_query(FK_STREAM(hStream)));
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return fk_res(fdev_copy((uintptr_t)dst, (uintptr_t)src, ByteCount));
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return fk_res(
		fdev_copy_async((uintptr_t)dst, (uintptr_t)src, ByteCount, FK_STREAM(hStream)));
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	return cuMemcpyAsync(dstDevice, srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	struct fdev_event *e = NULL;
	CUresult r;

	if (!phEvent || Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_VALUE;
	r = fk_res(fdev_event_create(Flags, &e));
	if (!r)
		*phEvent = (CUevent)(void *)e;
	return r;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
	return fk_res(fdev_event_destroy(FK_EVENT(hEvent)));
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return fk_res(fdev_event_record(FK_EVENT(hEvent), FK_STREAM(hStream)));
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	return fk_res(fdev_event_query(FK_EVENT(hEvent)));
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	return fk_res(fdev_event_sync(FK_EVENT(hEvent)));
}

/* --- entry points ------------------------------------------------------------------------- */

/*
 * Each entry: the base name, the CUDA version that introduced this variant, the function (as a
 * generic function pointer: ISO C has no conversion to void *, POSIX gives both one size).
 */
typedef void (*fk_fn)(void);

#define FK_FN(name, ver)                                                                           \
	{                                                                                          \
#name, ver, (fk_fn)(name)                                                          \
	}
#define FK_FN_AS(base, fn, ver)                                                                    \
	{                                                                                          \
		base, ver, (fk_fn)(fn)                                                             \
	}

static const struct {
	const char *name;
	int version;
	fk_fn fn;
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

	pthread_once(&fk_once, fk_init_once);
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	/* A driver older than the version asked for refuses, as the real one does. */
	if (cudaVersion > fk_version) {
		if (symbolStatus)
			*symbolStatus = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; i < sizeof(fk_table) / sizeof(fk_table[0]); i++) {
		if (strcmp(fk_table[i].name, symbol) != 0)
			continue;
		found = true;
		if (fk_table[i].version <= cudaVersion) {
			memcpy(pfn, &fk_table[i].fn, sizeof(*pfn));
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
