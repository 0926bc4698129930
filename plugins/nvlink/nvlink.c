/* SPDX-License-Identifier: Apache-2.0 */
/* nvlink.c: the nvlink transport: CUDA copies between GPU memory of processes (CUDA driver API). */

/*
 * The GPU transport itself (devices, streams and launch groups, the wait helper, registrations,
 * keys, the import cache, peers, the owner ops of memory kind CUDA) is the toolkit of
 * <te/te_plugin_gpu.h>, shared with the hip plugin. This file is CUDA's part (README.md has the
 * options, formats and semantics):
 *
 * Driver. init dlopens the CUDA driver (option library, default libcuda.so.1), takes only
 * cuGetProcAddress_v2 and cuDriverGetVersion from it by name and resolves every other entry
 * point through cuGetProcAddress at NVLINK_CUDA_VERSION: nothing links against libcuda. No
 * driver, an old driver or no GPU fails init with TE_ERR_NO_DEVICE and the driver's own words.
 * Each GPU's primary context is retained; "the current device" is the current context.
 *
 * Memory beyond legacy IPC. VMM allocations (cuMemCreate; option alloc: vmm makes them) are
 * shared as FABRIC handles where every GPU supports them (peers on other hosts of the NVLink
 * domain too), else as POSIX file descriptors that peers fetch over the toolkit's fd socket;
 * an importer maps them with cuMemImportFromShareableHandle + cuMemAddressReserve + cuMemMap +
 * cuMemSetAccess for the GPUs that can reach them.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <cuda.h>

#include <te/te_plugin_gpu.h>

/* The project version, passed by the build (plugins/meson.build); 0.0.0 outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define NVLINK_NAME "nvlink"
#define NVLINK_KEY_MAGIC 0x314b564eu  /* "NVK1" */
#define NVLINK_BLOB_MAGIC 0x3142564eu /* "NVB1" */

/*
 * Every driver entry point is resolved through cuGetProcAddress at this CUDA version (12.0), so
 * the plugin gets the ABI variant its cuda.h prototypes describe on any newer driver, and an
 * older driver is refused at init with its version in the message.
 */
#define NVLINK_CUDA_VERSION 12000

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

typedef CUresult (*nvlink_getproc_fn)(const char *symbol, void **pfn, int cudaVersion,
				      cuuint64_t flags, CUdriverProcAddressQueryResult *status);

enum nvlink_alloc_mode {
	NVLINK_ALLOC_LEGACY = 0, /* cuMemAlloc: legacy IPC handles */
	NVLINK_ALLOC_VMM = 1,	 /* cuMemCreate: FABRIC handles or file descriptors */
};

enum nvlink_fabric_mode {
	NVLINK_FABRIC_AUTO = 0,
	NVLINK_FABRIC_OFF = 1,
};

struct nvlink_inst {
	struct te_plugin_gpu g; /* first: the toolkit's instance */
	struct nvlink_cu cu;
	nvlink_getproc_fn getproc;
	unsigned alloc_mode;
	unsigned fabric_mode;
};

/* What nvlink keeps per GPU (te_plugin_gpu_dev.priv). */
struct nvlink_dev {
	CUdevice cudev;
	CUcontext ctx;
	bool ctx_retained;
	bool fabric; /* FABRIC handles and VMM supported */
};

_Static_assert(sizeof(CUipcMemHandle) == sizeof(((struct te_plugin_gpu_key *)0)->handle),
	       "IPC handle size");
_Static_assert(sizeof(CUmemFabricHandle) == sizeof(((struct te_plugin_gpu_key *)0)->handle),
	       "fabric handle size");

static inline struct nvlink_inst *nvlink_of(struct te_plugin_gpu *g)
{
	return (struct nvlink_inst *)g;
}

static inline struct nvlink_dev *nvlink_dev(const struct te_plugin_gpu_dev *d)
{
	return d->priv;
}

/* --- errors --------------------------------------------------------------------------------- */

/* "CUDA_ERROR_X: driver text" for @err into @buf. */
static const char *nvlink_strerror(struct te_plugin_gpu *g, int err, char *buf, size_t len)
{
	struct nvlink_inst *ni = nvlink_of(g);
	const char *name = NULL, *text = NULL;

	if (ni->cu.cuGetErrorName)
		(void)ni->cu.cuGetErrorName((CUresult)err, &name);
	if (ni->cu.cuGetErrorString)
		(void)ni->cu.cuGetErrorString((CUresult)err, &text);
	return te_plugin_gpu_name_text(name, text, err, "CUresult", buf, len);
}

/* Errors after which the context (and so the GPU, for this process) is unusable. */
static bool nvlink_sticky(int err)
{
	switch ((CUresult)err) {
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

static enum te_status nvlink_status(int err)
{
	switch ((CUresult)err) {
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
		return nvlink_sticky(err) ? TE_ERR_DEVICE_FAILED : TE_ERR_SYSTEM;
	}
}

/* --- options and driver ---------------------------------------------------------------------- */

static const char *const nvlink_alloc_modes[] = { "legacy", "vmm", NULL };
static const char *const nvlink_fabric_modes[] = { "auto", "off", NULL };

/* Declared options (te_plugin.h, ABI 1.2): the toolkit's, then nvlink's; README.md. */
static const struct te_plugin_option nvlink_options_decl[] = {
	TE_PLUGIN_GPU_OPTIONS_COMMON,
	TE_PLUGIN_OPTION_CHOICE("alloc", "legacy", nvlink_alloc_modes,
				"what te_mem_alloc(\"cuda:N\") makes: legacy (cuMemAlloc) or vmm "
				"(cuMemCreate)"),
	TE_PLUGIN_OPTION_CHOICE("fabric", "auto", nvlink_fabric_modes,
				"auto: FABRIC handles when every GPU supports them; off: never"),
	TE_PLUGIN_GPU_OPTION_FETCH_TIMEOUT,
};

static const char *const nvlink_libraries[] = { "libcuda.so.1" };

static enum te_status nvlink_options(struct te_plugin_gpu *g)
{
	struct nvlink_inst *ni = nvlink_of(g);

	/* The indexes of the choices above are the enum values. */
	ni->alloc_mode = (unsigned)te_plugin_opt_choice(g->host, g->ctx, "alloc",
							nvlink_alloc_modes, NVLINK_ALLOC_LEGACY);
	ni->fabric_mode = (unsigned)te_plugin_opt_choice(g->host, g->ctx, "fabric",
							 nvlink_fabric_modes, NVLINK_FABRIC_AUTO);
	/* FABRIC handles when every GPU supports them (nvlink_dev_open clears it otherwise). */
	g->fabric = ni->fabric_mode != NVLINK_FABRIC_OFF;
	/* VMM memory without FABRIC handles travels as file descriptors. */
	g->fds = true;
	return TE_OK;
}

typedef CUresult (*nvlink_version_fn)(int *version);

static enum te_status nvlink_version(struct te_plugin_gpu *g, int *version_out)
{
	struct nvlink_inst *ni = nvlink_of(g);
	nvlink_version_fn version;
	int v = 0;

	*(void **)&version = dlsym(g->dl, "cuDriverGetVersion");
	*(void **)&ni->getproc = dlsym(g->dl, "cuGetProcAddress_v2");
	if (!version) {
		TE_PLUGIN_GPU_ERROR(g,
				    NVLINK_NAME ": %s is not a CUDA driver (no cuDriverGetVersion)",
				    g->dl_name);
		return TE_ERR_NO_DEVICE;
	}
	if (version(&v) != CUDA_SUCCESS)
		v = 0;
	*version_out = v;
	return TE_OK;
}

static void nvlink_version_str(int version, char *buf, size_t len)
{
	snprintf(buf, len, "%d.%d", version / 1000, version % 1000 / 10);
}

/* cuGetProcAddress at NVLINK_CUDA_VERSION, for te_plugin_gpu_resolve. */
static void *nvlink_lookup(void *user, const char *name, char *why, size_t len)
{
	struct nvlink_inst *ni = user;
	CUdriverProcAddressQueryResult qs = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	char cs[128];
	void *p = NULL;
	CUresult r;

	r = ni->getproc(name, &p, NVLINK_CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &qs);
	if (r == CUDA_SUCCESS && p)
		return p;
	/* cuGetErrorString may not be resolved yet: name the result, as the driver would. */
	snprintf(why, len, "%s%s",
		 r != CUDA_SUCCESS ? nvlink_strerror(&ni->g, r, cs, sizeof(cs)) : "",
		 qs == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? "version not sufficient"
		 : qs == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND	  ? "symbol not found"
								  : "");
	return NULL;
}

static enum te_status nvlink_open(struct te_plugin_gpu *g, uint32_t *n_devs_out)
{
	struct nvlink_inst *ni = nvlink_of(g);
#define NVLINK_CU_SYM(fn, name) { name, (void **)&ni->cu.fn },
	const struct te_plugin_gpu_sym syms[] = { NVLINK_CU_FNS(NVLINK_CU_SYM) };
#undef NVLINK_CU_SYM
	char why[160], cs[128];
	size_t missing = 0;
	int count = 0;
	CUresult r;

	if (!ni->getproc) {
		TE_PLUGIN_GPU_ERROR(g,
				    NVLINK_NAME ": the CUDA driver %s (version %d) has no "
						"cuGetProcAddress_v2",
				    g->dl_name, g->version);
		return TE_ERR_NO_DEVICE;
	}
	if (te_plugin_gpu_resolve(syms, TE_PLUGIN_ARRAY_LEN(syms), nvlink_lookup, ni, &missing, why,
				  sizeof(why)) != TE_OK) {
		TE_PLUGIN_GPU_ERROR(
			g,
			NVLINK_NAME ": the CUDA driver %s (version %d) has no %s for CUDA %d: %s",
			g->dl_name, g->version, syms[missing].name, NVLINK_CUDA_VERSION, why);
		return TE_ERR_NO_DEVICE;
	}
	r = ni->cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		TE_PLUGIN_GPU_ERROR(g, NVLINK_NAME ": cuInit: %s",
				    nvlink_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	r = ni->cu.cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count <= 0) {
		TE_PLUGIN_GPU_ERROR(g, NVLINK_NAME ": no CUDA device: %s",
				    r != CUDA_SUCCESS ? nvlink_strerror(g, r, cs, sizeof(cs))
						      : "cuDeviceGetCount returned 0");
		return TE_ERR_NO_DEVICE;
	}
	*n_devs_out = (uint32_t)count;
	return TE_OK;
}

static int nvlink_attr(struct nvlink_inst *ni, const struct nvlink_dev *nd, CUdevice_attribute a,
		       int def)
{
	int v = def;

	return ni->cu.cuDeviceGetAttribute(&v, a, nd->cudev) == CUDA_SUCCESS ? v : def;
}

static enum te_status nvlink_dev_open(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d)
{
	struct nvlink_inst *ni = nvlink_of(g);
	struct nvlink_dev *nd = calloc(1, sizeof(*nd));
	char cs[128];
	CUresult r;

	if (!nd)
		return TE_ERR_NOMEM;
	d->priv = nd;
	r = ni->cu.cuDeviceGet(&nd->cudev, d->ordinal);
	if (r == CUDA_SUCCESS)
		r = ni->cu.cuDeviceGetName(d->gpu, sizeof(d->gpu), nd->cudev);
	if (r == CUDA_SUCCESS)
		r = ni->cu.cuDeviceGetPCIBusId(d->pci, sizeof(d->pci), nd->cudev);
	if (r != CUDA_SUCCESS) {
		TE_PLUGIN_GPU_ERROR(g, NVLINK_NAME ": cuda:%d: %s", d->ordinal,
				    nvlink_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	if (!nvlink_attr(ni, nd, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0)) {
		TE_PLUGIN_GPU_ERROR(g, NVLINK_NAME ": cuda:%d (%s): no unified addressing",
				    d->ordinal, d->pci);
		return TE_ERR_NO_DEVICE;
	}
	d->numa = nvlink_attr(ni, nd, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
	nd->fabric =
		nvlink_attr(ni, nd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0) &&
		nvlink_attr(ni, nd, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
	g->fabric = g->fabric && nd->fabric;
	d->dmabuf = nvlink_attr(ni, nd, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0);
	r = ni->cu.cuDevicePrimaryCtxRetain(&nd->ctx, nd->cudev);
	if (r != CUDA_SUCCESS) {
		TE_PLUGIN_GPU_ERROR(g, NVLINK_NAME ": cuda:%d (%s): cuDevicePrimaryCtxRetain: %s",
				    d->ordinal, d->pci, nvlink_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	nd->ctx_retained = true;
	return TE_OK;
}

static void nvlink_dev_close(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d)
{
	struct nvlink_dev *nd = nvlink_dev(d);

	if (nd && nd->ctx_retained)
		(void)nvlink_of(g)->cu.cuDevicePrimaryCtxRelease(nd->cudev);
	free(nd);
	d->priv = NULL;
}

static void nvlink_close(struct te_plugin_gpu *g)
{
	struct nvlink_inst *ni = nvlink_of(g);

	if (ni->cu.cuCtxSetCurrent)
		(void)ni->cu.cuCtxSetCurrent(NULL);
}

static void nvlink_describe(struct te_plugin_gpu *g, char *head, size_t hlen, char *tail,
			    size_t tlen)
{
	snprintf(head, hlen, "CUDA driver %d.%d via %s", g->version / 1000, g->version % 1000 / 10,
		 g->dl_name);
	snprintf(tail, tlen, "; fabric handles %s", g->fabric ? "on" : "off");
}

/* --- devices, streams, events, copies --------------------------------------------------------- */

static int nvlink_set_dev(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d)
{
	return nvlink_of(g)->cu.cuCtxSetCurrent(nvlink_dev(d)->ctx);
}

static int nvlink_can_access_peer(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
				  struct te_plugin_gpu_dev *peer, int *can)
{
	return nvlink_of(g)->cu.cuDeviceCanAccessPeer(can, nvlink_dev(d)->cudev,
						      nvlink_dev(peer)->cudev);
}

static int nvlink_enable_peer(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
			      struct te_plugin_gpu_dev *peer)
{
	CUresult r = nvlink_of(g)->cu.cuCtxEnablePeerAccess(nvlink_dev(peer)->ctx, 0);

	(void)d; /* current */
	return r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? CUDA_SUCCESS : r;
}

static int nvlink_stream_create(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out)
{
	(void)d;
	return nvlink_of(g)->cu.cuStreamCreate((CUstream *)out, CU_STREAM_NON_BLOCKING);
}

static void nvlink_stream_destroy(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *s)
{
	(void)d;
	(void)nvlink_of(g)->cu.cuStreamDestroy(s);
}

static int nvlink_stream_sync(struct te_plugin_gpu *g, void *s)
{
	return nvlink_of(g)->cu.cuStreamSynchronize(s);
}

static int nvlink_event_create(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out)
{
	(void)d;
	/* Blocking sync: the wait helper sleeps in cuEventSynchronize instead of spinning. */
	return nvlink_of(g)->cu.cuEventCreate((CUevent *)out,
					      CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
}

static void nvlink_event_destroy(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *e)
{
	(void)d;
	(void)nvlink_of(g)->cu.cuEventDestroy(e);
}

static int nvlink_event_record(struct te_plugin_gpu *g, void *e, void *s)
{
	return nvlink_of(g)->cu.cuEventRecord(e, s);
}

static int nvlink_event_query(struct te_plugin_gpu *g, void *e)
{
	return nvlink_of(g)->cu.cuEventQuery(e);
}

static int nvlink_event_sync(struct te_plugin_gpu *g, void *e)
{
	return nvlink_of(g)->cu.cuEventSynchronize(e);
}

static int nvlink_copy_async(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
			     enum te_plugin_gpu_dir dir, void *s)
{
	(void)dir; /* unified addressing: the driver knows */
	return nvlink_of(g)->cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
					      (CUdeviceptr)(uintptr_t)src, n, s);
}

static int nvlink_copy(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
		       enum te_plugin_copy_dir dir)
{
	(void)dir;
	return nvlink_of(g)->cu.cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
					 n);
}

/* --- memory ------------------------------------------------------------------------------- */

static int nvlink_ptr_info(struct te_plugin_gpu *g, const void *addr, struct te_plugin_gpu_ptr *out)
{
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	};
	unsigned int type = 0;
	int dev = -1, ipc = 0;
	CUdeviceptr base = 0;
	size_t size = 0;
	void *data[] = { &type, &dev, &base, &size, &ipc };
	CUresult r = nvlink_of(g)->cu.cuPointerGetAttributes(5, attrs, data,
							     (CUdeviceptr)(uintptr_t)addr);

	out->device = r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE && dev >= 0;
	out->dev = dev;
	out->base = (uintptr_t)base;
	out->size = size;
	out->ipc = ipc;
	return r;
}

/* The GPUs of @reach, read-write, for cuMemSetAccess: into @acc; returns how many. */
static size_t nvlink_access(const struct te_plugin_gpu *g, uint64_t reach,
			    CUmemAccessDesc acc[TE_PLUGIN_GPU_MAX_DEV])
{
	size_t n = 0;

	for (uint32_t i = 0; i < g->n_devs; i++) {
		if (!(reach & (1ull << i)))
			continue;
		acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[n].location.id = (int)i;
		acc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	return n;
}

/* Reserve @size bytes, map @h there and give the GPUs of @reach access. */
static CUresult nvlink_map_vmm(struct nvlink_inst *ni, CUmemGenericAllocationHandle h, size_t size,
			       uint64_t reach, CUdeviceptr *ptr_out, const char **step)
{
	CUmemAccessDesc acc[TE_PLUGIN_GPU_MAX_DEV];
	CUdeviceptr ptr = 0;
	size_t n = nvlink_access(&ni->g, reach, acc);
	CUresult r;

	*step = "cuMemAddressReserve";
	r = ni->cu.cuMemAddressReserve(&ptr, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	*step = "cuMemMap";
	r = ni->cu.cuMemMap(ptr, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto err_free;
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

/* A VMM allocation of @len on @d, mapped read-write for @d and its peers. */
static CUresult nvlink_vmm_alloc(struct nvlink_inst *ni, struct te_plugin_gpu_dev *d, uint64_t len,
				 CUdeviceptr *ptr_out, size_t *size_out, const char **step)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h = 0;
	size_t gran = 0, size;
	CUresult r;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = d->ordinal;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (ni->fabric_mode != NVLINK_FABRIC_OFF && nvlink_dev(d)->fabric)
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
	r = nvlink_map_vmm(ni, h, size, te_plugin_gpu_reach_of(&ni->g, d->ordinal), ptr_out, step);
	(void)ni->cu.cuMemRelease(h); /* the mapping keeps the memory */
	if (r == CUDA_SUCCESS)
		*size_out = size;
	return r;
}

static int nvlink_alloc(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uint64_t len,
			void **ptr, size_t *size, int *flavor, const char **step)
{
	struct nvlink_inst *ni = nvlink_of(g);
	CUdeviceptr p = 0;
	CUresult r;

	*flavor = (int)ni->alloc_mode;
	*size = (size_t)len;
	if (ni->alloc_mode == NVLINK_ALLOC_VMM) {
		r = nvlink_vmm_alloc(ni, d, len, &p, size, step);
	} else {
		*step = "cuMemAlloc";
		r = ni->cu.cuMemAlloc(&p, (size_t)len);
	}
	*ptr = (void *)(uintptr_t)p;
	return r;
}

static int nvlink_free(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *ptr, size_t size,
		       int flavor)
{
	struct nvlink_inst *ni = nvlink_of(g);
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
	CUresult r;

	(void)d;
	if (flavor != NVLINK_ALLOC_VMM)
		return ni->cu.cuMemFree(p);
	r = ni->cu.cuMemUnmap(p, size);
	return r == CUDA_SUCCESS ? ni->cu.cuMemAddressFree(p, size) : r;
}

static int nvlink_host_register(struct te_plugin_gpu *g, void *addr, uint64_t len)
{
	return nvlink_of(g)->cu.cuMemHostRegister(addr, (size_t)len, CU_MEMHOSTREGISTER_PORTABLE);
}

static void nvlink_host_unregister(struct te_plugin_gpu *g, void *addr)
{
	(void)nvlink_of(g)->cu.cuMemHostUnregister(addr);
}

static int nvlink_dmabuf(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uintptr_t start,
			 size_t len, int *fd)
{
	(void)d;
	return nvlink_of(g)->cu.cuMemGetHandleForAddressRange(
		fd, (CUdeviceptr)start, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
}

static int nvlink_ipc_get(struct te_plugin_gpu *g, uintptr_t base, uint8_t handle[64])
{
	CUipcMemHandle h;
	CUresult r = nvlink_of(g)->cu.cuIpcGetMemHandle(&h, (CUdeviceptr)base);

	if (r == CUDA_SUCCESS)
		memcpy(handle, &h, sizeof(h));
	return r;
}

/*
 * VMM memory: a peer maps the mapping the region lies in, which may be smaller than the address
 * range reserved around it (CUDA 12.x attributes; an older driver leaves the range as it is).
 */
static void nvlink_vmm_range(struct nvlink_inst *ni, struct te_plugin_gpu_mem *m,
			     struct te_plugin_gpu_ptr *pi)
{
	CUpointer_attribute ma[] = { CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
				     CU_POINTER_ATTRIBUTE_MAPPING_SIZE };
	CUdeviceptr mbase = 0;
	size_t msize = 0;
	void *md[] = { &mbase, &msize };
	uintptr_t a = (uintptr_t)m->addr;

	if (ni->cu.cuPointerGetAttributes(2, ma, md, (CUdeviceptr)a) == CUDA_SUCCESS && msize &&
	    a >= mbase && m->length <= msize && a - mbase <= msize - m->length) {
		pi->base = (uintptr_t)mbase;
		pi->size = msize;
		m->key.alloc_base = mbase;
		m->key.alloc_size = msize;
	}
}

/* What a peer needs to map the VMM allocation holding @m (its FABRIC handle or fd). */
static enum te_status nvlink_export_vmm(struct te_plugin_gpu *g, struct te_plugin_gpu_mem *m,
					const struct te_plugin_gpu_ptr *pi0,
					struct te_plugin_gpu_dev *d)
{
	struct nvlink_inst *ni = nvlink_of(g);
	struct te_plugin_gpu_ptr pi = *pi0;
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	char cs[128];
	CUresult r;

	nvlink_vmm_range(ni, m, &pi);
	r = ni->cu.cuMemRetainAllocationHandle(&h, (void *)pi.base);
	if (r == CUDA_SUCCESS) {
		r = ni->cu.cuMemGetAllocationPropertiesFromHandle(&prop, h);
		if (r != CUDA_SUCCESS)
			(void)ni->cu.cuMemRelease(h);
	}
	if (r != CUDA_SUCCESS) {
		TE_PLUGIN_GPU_ERROR(g,
				    NVLINK_NAME ": region [%p, +%" PRIu64
						") on cuda:%d (%s): neither "
						"a cuMemAlloc allocation nor a VMM one "
						"(cuMemRetainAllocationHandle: %s): peers cannot "
						"map it",
				    m->addr, m->length, d->ordinal, d->pci,
				    nvlink_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_MEMORY_TYPE;
	}
	if (g->fabric && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
		CUmemFabricHandle fh;

		r = ni->cu.cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
		if (r == CUDA_SUCCESS) {
			m->key.kind = TE_PLUGIN_GPU_KEY_FABRIC;
			memcpy(m->key.handle, &fh, sizeof(fh));
			(void)ni->cu.cuMemRelease(h);
			return TE_OK;
		}
		g->host->log(g->ctx, TE_PLUGIN_LOG_INFO,
			     "cuda:%d: FABRIC export of [%p, +%" PRIu64 ") failed (%s); using a "
			     "file descriptor",
			     d->ordinal, m->addr, m->length, nvlink_strerror(g, r, cs, sizeof(cs)));
	}
	if (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		int fd = -1;
		enum te_status st;

		r = ni->cu.cuMemExportToShareableHandle(
			&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		(void)ni->cu.cuMemRelease(h);
		if (r != CUDA_SUCCESS) {
			TE_PLUGIN_GPU_ERROR(g,
					    NVLINK_NAME ": region [%p, +%" PRIu64 ") on cuda:%d: "
							"cuMemExportToShareableHandle(fd): %s",
					    m->addr, m->length, d->ordinal,
					    nvlink_strerror(g, r, cs, sizeof(cs)));
			return nvlink_status(r);
		}
		st = te_plugin_gpu_export_add(&g->sock, fd, pi.size, &m->key.export_id);
		if (st != TE_OK) {
			close(fd);
			return st;
		}
		m->key.kind = TE_PLUGIN_GPU_KEY_FD;
		return TE_OK;
	}
	(void)ni->cu.cuMemRelease(h);
	TE_PLUGIN_GPU_ERROR(g,
			    NVLINK_NAME ": region [%p, +%" PRIu64 ") on cuda:%d (%s) was created "
					"without a shareable handle type (cuMemCreate "
					"requestedHandleTypes 0x%x): peers cannot map it",
			    m->addr, m->length, d->ordinal, d->pci,
			    (unsigned)prop.requestedHandleTypes);
	return TE_ERR_MEMORY_TYPE;
}

static int nvlink_import(struct te_plugin_gpu *g, const struct te_plugin_gpu_key *k, int fd,
			 struct te_plugin_gpu_import *imp, const char **step)
{
	struct nvlink_inst *ni = nvlink_of(g);
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr local = 0;
	CUresult r;

	if (k->kind == TE_PLUGIN_GPU_KEY_IPC) {
		CUipcMemHandle ih;

		memcpy(&ih, k->handle, sizeof(ih));
		*step = "cuIpcOpenMemHandle";
		r = ni->cu.cuIpcOpenMemHandle(&local, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		imp->local = (uintptr_t)local;
		return r;
	}
	if (k->kind == TE_PLUGIN_GPU_KEY_FD) {
		*step = "cuMemImportFromShareableHandle(fd)";
		r = ni->cu.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
							  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	} else {
		CUmemFabricHandle fh;

		memcpy(&fh, k->handle, sizeof(fh));
		*step = "cuMemImportFromShareableHandle(fabric)";
		r = ni->cu.cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
	}
	if (r != CUDA_SUCCESS)
		return r;
	r = nvlink_map_vmm(ni, h, imp->map_size, imp->reach, &local, step);
	(void)ni->cu.cuMemRelease(h); /* the mapping keeps it */
	imp->local = (uintptr_t)local;
	return r;
}

static void nvlink_unimport(struct te_plugin_gpu *g, struct te_plugin_gpu_import *imp)
{
	struct nvlink_inst *ni = nvlink_of(g);
	CUdeviceptr p = (CUdeviceptr)imp->local;

	if (imp->kind == TE_PLUGIN_GPU_KEY_IPC) {
		(void)ni->cu.cuIpcCloseMemHandle(p);
	} else {
		(void)ni->cu.cuMemUnmap(p, imp->map_size);
		(void)ni->cu.cuMemAddressFree(p, imp->map_size);
	}
}

/* --- the plugin ------------------------------------------------------------------------------ */

static const struct te_plugin_gpu_vendor nvlink_vendor = {
	.name = NVLINK_NAME,
	.kind = "cuda",
	.api = "CUDA",
	.runtime = "CUDA driver",
	.mem_type = TE_PLUGIN_MEM_CUDA,
	.blob_magic = NVLINK_BLOB_MAGIC,
	.key_magic = NVLINK_KEY_MAGIC,
	.description_fabric = "FABRIC handles",
	.libraries = nvlink_libraries,
	.n_libraries = TE_PLUGIN_ARRAY_LEN(nvlink_libraries),
	.min_version = NVLINK_CUDA_VERSION,
	.not_ready = CUDA_ERROR_NOT_READY,
	.host_registered = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
	.fn_set_dev = "cuCtxSetCurrent",
	.fn_copy = "cuMemcpy",
	.fn_copy_async = "cuMemcpyAsync",
	.fn_event_record = "cuEventRecord",
	.fn_event_query = "cuEventQuery",
	.fn_stream_create = "cuStreamCreate",
	.fn_event_create = "cuEventCreate",
	.fn_enable_peer = "cuCtxEnablePeerAccess",
	.fn_host_register = "cuMemHostRegister",
	.fn_ipc_get = "cuIpcGetMemHandle",
	.fn_dmabuf = "cuMemGetHandleForAddressRange",
	.options = nvlink_options,
	.version = nvlink_version,
	.version_str = nvlink_version_str,
	.open = nvlink_open,
	.dev_open = nvlink_dev_open,
	.dev_close = nvlink_dev_close,
	.close = nvlink_close,
	.describe = nvlink_describe,
	.set_dev = nvlink_set_dev,
	.can_access_peer = nvlink_can_access_peer,
	.enable_peer = nvlink_enable_peer,
	.stream_create = nvlink_stream_create,
	.stream_destroy = nvlink_stream_destroy,
	.stream_sync = nvlink_stream_sync,
	.event_create = nvlink_event_create,
	.event_destroy = nvlink_event_destroy,
	.event_record = nvlink_event_record,
	.event_query = nvlink_event_query,
	.event_sync = nvlink_event_sync,
	.copy_async = nvlink_copy_async,
	.copy = nvlink_copy,
	.strerror = nvlink_strerror,
	.sticky = nvlink_sticky,
	.status = nvlink_status,
	.ptr_info = nvlink_ptr_info,
	.alloc = nvlink_alloc,
	.free = nvlink_free,
	.host_register = nvlink_host_register,
	.host_unregister = nvlink_host_unregister,
	.dmabuf = nvlink_dmabuf,
	.ipc_get = nvlink_ipc_get,
	.export_other = nvlink_export_vmm,
	.import = nvlink_import,
	.unimport = nvlink_unimport,
};

static enum te_status nvlink_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				  struct te_plugin_inst **inst_out)
{
	return te_plugin_gpu_init(host, ctx, &nvlink_vendor, sizeof(struct nvlink_inst), inst_out);
}

static const struct te_plugin_ops nvlink_ops = TE_PLUGIN_GPU_OPS(nvlink_init);

static const struct te_plugin_desc nvlink_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = NVLINK_NAME,
	.version = TE_PLUGIN_VERSION,
	.description =
		"CUDA copies between GPU memory of processes (IPC, VMM fds, FABRIC handles); "
		"owns memory kind cuda",
	.ops = &nvlink_ops,
	TE_PLUGIN_OPTIONS(nvlink_options_decl),
};

TE_PLUGIN_DEFINE(&nvlink_desc)
