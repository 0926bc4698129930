/* SPDX-License-Identifier: Apache-2.0 */
/* hip.c: the hip transport: AMD GPU copies between GPU memory of processes (ROCm HIP runtime). */

/*
 * The GPU transport itself (devices, streams and launch groups, the wait helper, registrations,
 * keys, the import cache, peers, the owner ops of memory kind HIP) is the toolkit of
 * <te/te_plugin_gpu.h>, shared with the nvlink plugin. This file is HIP's part (README.md has
 * the options, formats and semantics):
 *
 * Runtime. init dlopens the HIP runtime (option library; else libamdhip64.so, .so.6, .so.5),
 * checks hipRuntimeGetVersion against HIP_MIN_VERSION and takes every entry point by name with
 * dlsym (hipGetProcAddress exists only from ROCm 6.0; the entry points used here have kept
 * their names and prototypes from ROCm 5.0 to 6.x): nothing links against libamdhip64. No
 * runtime, an old one or no GPU fails init with TE_ERR_NO_DEVICE and the runtime's own words.
 * "The current device" is hipSetDevice's, per thread.
 *
 * Memory. hipMalloc memory is shared with legacy IPC handles (hipIpcGetMemHandle of the
 * allocation's base, hipIpcOpenMemHandle on the importing side). ROCm 6 renumbered
 * hipMemoryType (Device was 1, is 2) and hipIpcMemLazyEnablePeerAccess (was 0, is 1): both are
 * chosen by the runtime's major version, not the header's. A dmabuf export (mem_dmabuf) needs
 * hipMemGetHandleForAddressRange (ROCm 6), probed with dlsym.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <hip/hip_runtime_api.h>

#include <te/te_plugin_gpu.h>

/* The project version, passed by the build (plugins/meson.build); 0.0.0 outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define HIP_NAME "hip"
#define HIP_KEY_MAGIC 0x314b5048u  /* "HPK1" */
#define HIP_BLOB_MAGIC 0x31425048u /* "HPB1" */

/*
 * The oldest runtime accepted: ROCm 5.0 (HIP_VERSION encoding: major * 10^7 + minor * 10^5 +
 * patch), the first whose ABI the plugin's calls have (libamdhip64.so.5).
 */
#define HIP_MIN_VERSION 50000000

/* ROCm 6.0 renumbered hipMemoryType: hipMemoryTypeDevice is 1 before and 2 from it. */
#define HIP_MEMTYPE_DEVICE_ROCM5 1
#define HIP_MEMTYPE_DEVICE_ROCM6 2

/*
 * ROCm 6.0 also redefined hipIpcMemLazyEnablePeerAccess, hipIpcOpenMemHandle's one valid flag
 * (0 before, 1 from it), and the runtime refuses any other value with hipErrorInvalidValue:
 * the flag is chosen by the runtime's major version too, not taken from the header.
 */
#define HIP_IPC_LAZY_ROCM5 0u
#define HIP_IPC_LAZY_ROCM6 1u

/* hipMemGetHandleForAddressRange (ROCm 6), not in ROCm 5 headers: hipMemRangeHandleTypeDmaBufFd. */
#define HIP_RANGE_HANDLE_DMABUF 1
typedef hipError_t (*hip_range_handle_fn)(void *handle, hipDeviceptr_t dptr, size_t size,
					  int handle_type, unsigned long long flags);

/* The runtime entry points the plugin uses, by their exported names. */
#define HIP_FNS(X)                                                                                 \
	X(hipGetErrorName)                                                                         \
	X(hipGetErrorString)                                                                       \
	X(hipDriverGetVersion)                                                                     \
	X(hipGetDeviceCount)                                                                       \
	X(hipDeviceGetName)                                                                        \
	X(hipDeviceGetPCIBusId)                                                                    \
	X(hipSetDevice)                                                                            \
	X(hipDeviceCanAccessPeer)                                                                  \
	X(hipDeviceEnablePeerAccess)                                                               \
	X(hipMalloc)                                                                               \
	X(hipFree)                                                                                 \
	X(hipMemGetAddressRange)                                                                   \
	X(hipPointerGetAttributes)                                                                 \
	X(hipIpcGetMemHandle)                                                                      \
	X(hipIpcOpenMemHandle)                                                                     \
	X(hipIpcCloseMemHandle)                                                                    \
	X(hipHostRegister)                                                                         \
	X(hipHostUnregister)                                                                       \
	X(hipStreamCreateWithFlags)                                                                \
	X(hipStreamDestroy)                                                                        \
	X(hipStreamSynchronize)                                                                    \
	X(hipEventCreateWithFlags)                                                                 \
	X(hipEventDestroy)                                                                         \
	X(hipEventRecord)                                                                          \
	X(hipEventQuery)                                                                           \
	X(hipEventSynchronize)                                                                     \
	X(hipMemcpy)                                                                               \
	X(hipMemcpyAsync)

#define HIP_MEMBER(f) __typeof__(f) *f;
struct hip_fns {
	HIP_FNS(HIP_MEMBER)
};
#undef HIP_MEMBER

struct hip_inst {
	struct te_plugin_gpu g; /* first: the toolkit's instance */
	struct hip_fns rt;
	hip_range_handle_fn range_handle; /* NULL before ROCm 6 */
	int driver_version;
	int memtype_device; /* hipMemoryTypeDevice of this runtime */
	unsigned ipc_lazy;  /* hipIpcMemLazyEnablePeerAccess of this runtime */
};

TE_PLUGIN_GPU_STATIC_ASSERT(sizeof(hipIpcMemHandle_t) ==
				    sizeof(((struct te_plugin_gpu_key *)0)->handle),
			    "IPC handle size");

static inline struct hip_inst *hip_of(struct te_plugin_gpu *g)
{
	return (struct hip_inst *)g;
}

/* --- errors --------------------------------------------------------------------------------- */

/* "hipErrorX: runtime text" (ROCm 5 gives the name as its text: then the name once). */
static const char *hip_strerror(struct te_plugin_gpu *g, int err, char *buf, size_t len)
{
	struct hip_inst *hi = hip_of(g);
	const char *name = hi->rt.hipGetErrorName ? hi->rt.hipGetErrorName((hipError_t)err) : NULL;
	const char *text =
		hi->rt.hipGetErrorString ? hi->rt.hipGetErrorString((hipError_t)err) : NULL;

	return te_plugin_gpu_name_text(name, text, err, "hipError_t", buf, len);
}

/* Errors after which the device is unusable in this process. */
static bool hip_sticky(int err)
{
	switch ((hipError_t)err) {
	case hipErrorIllegalAddress:
	case hipErrorLaunchFailure:
	case hipErrorLaunchTimeOut:
	case hipErrorPriorLaunchFailure:
	case hipErrorECCNotCorrectable:
	case hipErrorAssert:
	case hipErrorContextIsDestroyed:
		return true;
	default:
		return false;
	}
}

static enum te_status hip_status(int err)
{
	switch ((hipError_t)err) {
	case hipSuccess:
		return TE_OK;
	case hipErrorOutOfMemory:
		return TE_ERR_NOMEM;
	case hipErrorInvalidDevice:
	case hipErrorNoDevice:
		return TE_ERR_NO_DEVICE;
	case hipErrorNotSupported:
		return TE_ERR_UNSUPPORTED;
	case hipErrorInvalidValue:
		return TE_ERR_INVALID_ARG;
	default:
		return hip_sticky(err) ? TE_ERR_DEVICE_FAILED : TE_ERR_SYSTEM;
	}
}

/* --- runtime ---------------------------------------------------------------------------------- */

/* Declared options (te_plugin.h, ABI 1.2): the toolkit's common ones (hip shares no fds). */
static const struct te_plugin_option hip_options[] = {
	TE_PLUGIN_GPU_OPTIONS_COMMON,
};

/* The development symlink first (whatever ROCm is installed), then the runtime sonames. */
static const char *const hip_libraries[] = {
	"libamdhip64.so",
	"libamdhip64.so.6",
	"libamdhip64.so.5",
};

typedef hipError_t (*hip_version_fn)(int *version);

static enum te_status hip_version(struct te_plugin_gpu *g, int *version_out)
{
	hip_version_fn version;
	int v = 0;

	*(void **)&version = dlsym(g->dl, "hipRuntimeGetVersion");
	if (!version) {
		TE_PLUGIN_GPU_ERROR(g,
				    HIP_NAME ": %s is not a HIP runtime (no hipRuntimeGetVersion)",
				    g->dl_name);
		return TE_ERR_NO_DEVICE;
	}
	if (version(&v) != hipSuccess)
		v = 0;
	*version_out = v;
	return TE_OK;
}

/* "6.1" of HIP_VERSION 60100000 (major * 10^7 + minor * 10^5 + patch). */
static void hip_version_str(int version, char *buf, size_t len)
{
	snprintf(buf, len, "%d.%d", version / 10000000, version / 100000 % 100);
}

static enum te_status hip_open(struct te_plugin_gpu *g, uint32_t *n_devs_out)
{
	struct hip_inst *hi = hip_of(g);
#define HIP_SYM(f) { #f, (void **)&hi->rt.f },
	const struct te_plugin_gpu_sym syms[] = { HIP_FNS(HIP_SYM) };
#undef HIP_SYM
	char why[160], have[32], cs[128];
	size_t missing = 0;
	int count = 0;
	hipError_t r;

	if (te_plugin_gpu_resolve(syms, TE_PLUGIN_ARRAY_LEN(syms), te_plugin_gpu_dlsym, g->dl,
				  &missing, why, sizeof(why)) != TE_OK) {
		hip_version_str(g->version, have, sizeof(have));
		TE_PLUGIN_GPU_ERROR(g, HIP_NAME ": the HIP runtime %s (version %s) has no %s: %s",
				    g->dl_name, have, syms[missing].name, why);
		return TE_ERR_NO_DEVICE;
	}
	*(void **)&hi->range_handle = dlsym(g->dl, "hipMemGetHandleForAddressRange");
	hi->memtype_device =
		g->version >= 60000000 ? HIP_MEMTYPE_DEVICE_ROCM6 : HIP_MEMTYPE_DEVICE_ROCM5;
	hi->ipc_lazy = g->version >= 60000000 ? HIP_IPC_LAZY_ROCM6 : HIP_IPC_LAZY_ROCM5;
	if (hi->rt.hipDriverGetVersion(&hi->driver_version) != hipSuccess)
		hi->driver_version = 0;
	/* No kernel driver (amdgpu/KFD) or no GPU: the runtime says so here. */
	r = hi->rt.hipGetDeviceCount(&count);
	if (r != hipSuccess || count <= 0) {
		TE_PLUGIN_GPU_ERROR(g, HIP_NAME ": no HIP device: hipGetDeviceCount: %s",
				    r != hipSuccess ? hip_strerror(g, r, cs, sizeof(cs))
						    : "0 devices");
		return TE_ERR_NO_DEVICE;
	}
	*n_devs_out = (uint32_t)count;
	return TE_OK;
}

static enum te_status hip_dev_open(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d)
{
	struct hip_inst *hi = hip_of(g);
	char cs[128];
	hipError_t r;

	r = hi->rt.hipDeviceGetName(d->gpu, (int)sizeof(d->gpu), d->ordinal);
	if (r == hipSuccess)
		r = hi->rt.hipDeviceGetPCIBusId(d->pci, (int)sizeof(d->pci), d->ordinal);
	if (r != hipSuccess) {
		TE_PLUGIN_GPU_ERROR(g, HIP_NAME ": hip:%d: %s", d->ordinal,
				    hip_strerror(g, r, cs, sizeof(cs)));
		return TE_ERR_NO_DEVICE;
	}
	/* The NUMA node comes from sysfs (the toolkit): HIP has no attribute for it. */
	d->dmabuf = hi->range_handle != NULL;
	return TE_OK;
}

static void hip_describe(struct te_plugin_gpu *g, char *head, size_t hlen, char *tail, size_t tlen)
{
	char rt[32], drv[32];

	hip_version_str(g->version, rt, sizeof(rt));
	hip_version_str(hip_of(g)->driver_version, drv, sizeof(drv));
	snprintf(head, hlen, "HIP runtime %s (driver %s) via %s", rt, drv, g->dl_name);
	snprintf(tail, tlen, "; dma-buf export %s", hip_of(g)->range_handle ? "on" : "off");
}

/* --- devices, streams, events, copies --------------------------------------------------------- */

static int hip_set_dev(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d)
{
	return hip_of(g)->rt.hipSetDevice(d->ordinal);
}

static int hip_can_access_peer(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
			       struct te_plugin_gpu_dev *peer, int *can)
{
	return hip_of(g)->rt.hipDeviceCanAccessPeer(can, d->ordinal, peer->ordinal);
}

static int hip_enable_peer(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d,
			   struct te_plugin_gpu_dev *peer)
{
	hipError_t r = hip_of(g)->rt.hipDeviceEnablePeerAccess(peer->ordinal, 0);

	(void)d; /* current */
	return r == hipErrorPeerAccessAlreadyEnabled ? hipSuccess : r;
}

static int hip_stream_create(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out)
{
	(void)d;
	return hip_of(g)->rt.hipStreamCreateWithFlags((hipStream_t *)out, hipStreamNonBlocking);
}

static void hip_stream_destroy(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *s)
{
	(void)d;
	(void)hip_of(g)->rt.hipStreamDestroy(s);
}

static int hip_stream_sync(struct te_plugin_gpu *g, void *s)
{
	return hip_of(g)->rt.hipStreamSynchronize(s);
}

static int hip_event_create(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void **out)
{
	(void)d;
	/* Blocking sync: the wait helper sleeps in hipEventSynchronize instead of spinning. */
	return hip_of(g)->rt.hipEventCreateWithFlags((hipEvent_t *)out,
						     hipEventBlockingSync | hipEventDisableTiming);
}

static void hip_event_destroy(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *e)
{
	(void)d;
	(void)hip_of(g)->rt.hipEventDestroy(e);
}

static int hip_event_record(struct te_plugin_gpu *g, void *e, void *s)
{
	return hip_of(g)->rt.hipEventRecord(e, s);
}

static int hip_event_query(struct te_plugin_gpu *g, void *e)
{
	return hip_of(g)->rt.hipEventQuery(e);
}

static int hip_event_sync(struct te_plugin_gpu *g, void *e)
{
	return hip_of(g)->rt.hipEventSynchronize(e);
}

static int hip_copy_async(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
			  enum te_plugin_gpu_dir dir, void *s)
{
	static const hipMemcpyKind kinds[] = {
		[TE_PLUGIN_GPU_D2D] = hipMemcpyDeviceToDevice,
		[TE_PLUGIN_GPU_D2H] = hipMemcpyDeviceToHost,
		[TE_PLUGIN_GPU_H2D] = hipMemcpyHostToDevice,
	};

	return hip_of(g)->rt.hipMemcpyAsync(dst, src, n, kinds[dir], s);
}

static int hip_copy(struct te_plugin_gpu *g, void *dst, const void *src, size_t n,
		    enum te_plugin_copy_dir dir)
{
	return hip_of(g)->rt.hipMemcpy(dst, src, n,
				       dir == TE_PLUGIN_COPY_TO_HOST ? hipMemcpyDeviceToHost
								     : hipMemcpyHostToDevice);
}

/* --- memory ------------------------------------------------------------------------------- */

static int hip_ptr_info(struct te_plugin_gpu *g, const void *addr, struct te_plugin_gpu_ptr *out)
{
	struct hip_inst *hi = hip_of(g);
	hipPointerAttribute_t a;
	hipDeviceptr_t base = NULL;
	size_t size = 0;
	hipError_t r;
	int type;

	memset(&a, 0, sizeof(a));
	r = hi->rt.hipPointerGetAttributes(&a, addr);
	if (r != hipSuccess)
		return r; /* ROCm 5: memory HIP does not know */
#if HIP_VERSION_MAJOR >= 6
	type = (int)a.type;
#else
	type = (int)a.memoryType;
#endif
	out->device = type == hi->memtype_device && !a.isManaged && a.device >= 0;
	out->dev = a.device;
	if (!out->device)
		return hipSuccess;
	r = hi->rt.hipMemGetAddressRange(&base, &size, (hipDeviceptr_t)(uintptr_t)addr);
	out->device = r == hipSuccess;
	out->base = (uintptr_t)base;
	out->size = size;
	out->ipc = true; /* hipMalloc memory */
	return r;
}

static int hip_alloc(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uint64_t len, void **ptr,
		     size_t *size, int *flavor, const char **step)
{
	(void)d;
	*step = "hipMalloc";
	*size = (size_t)len;
	*flavor = 0;
	return hip_of(g)->rt.hipMalloc(ptr, (size_t)len);
}

static int hip_free(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, void *ptr, size_t size,
		    int flavor)
{
	(void)d;
	(void)size;
	(void)flavor;
	return hip_of(g)->rt.hipFree(ptr);
}

static int hip_host_register(struct te_plugin_gpu *g, void *addr, uint64_t len)
{
	return hip_of(g)->rt.hipHostRegister(addr, (size_t)len, hipHostRegisterPortable);
}

static void hip_host_unregister(struct te_plugin_gpu *g, void *addr)
{
	(void)hip_of(g)->rt.hipHostUnregister(addr);
}

static int hip_dmabuf(struct te_plugin_gpu *g, struct te_plugin_gpu_dev *d, uintptr_t start,
		      size_t len, int *fd)
{
	(void)d;
	return hip_of(g)->range_handle(fd, (hipDeviceptr_t)start, len, HIP_RANGE_HANDLE_DMABUF, 0);
}

static int hip_ipc_get(struct te_plugin_gpu *g, uintptr_t base, uint8_t handle[64])
{
	hipIpcMemHandle_t h;
	hipError_t r = hip_of(g)->rt.hipIpcGetMemHandle(&h, (void *)base);

	if (r == hipSuccess)
		memcpy(handle, &h, sizeof(h));
	return r;
}

static int hip_import(struct te_plugin_gpu *g, const struct te_plugin_gpu_key *k, int fd,
		      struct te_plugin_gpu_import *imp, const char **step)
{
	hipIpcMemHandle_t h;
	void *local = NULL;
	hipError_t r;

	(void)fd; /* IPC handles only */
	memcpy(&h, k->handle, sizeof(h));
	*step = "hipIpcOpenMemHandle";
	r = hip_of(g)->rt.hipIpcOpenMemHandle(&local, h, hip_of(g)->ipc_lazy);
	imp->local = (uintptr_t)local;
	return r;
}

static void hip_unimport(struct te_plugin_gpu *g, struct te_plugin_gpu_import *imp)
{
	(void)hip_of(g)->rt.hipIpcCloseMemHandle((void *)imp->local);
}

/* --- the plugin ------------------------------------------------------------------------------ */

static const struct te_plugin_gpu_vendor hip_vendor = {
	.name = HIP_NAME,
	.kind = "hip",
	.api = "HIP",
	.runtime = "HIP runtime",
	.mem_type = TE_PLUGIN_MEM_HIP,
	.blob_magic = HIP_BLOB_MAGIC,
	.key_magic = HIP_KEY_MAGIC,
	.description_fabric = NULL,
	.libraries = hip_libraries,
	.n_libraries = TE_PLUGIN_ARRAY_LEN(hip_libraries),
	.min_version = HIP_MIN_VERSION,
	.not_ready = hipErrorNotReady,
	.host_registered = hipErrorHostMemoryAlreadyRegistered,
	.fn_set_dev = "hipSetDevice",
	.fn_copy = "hipMemcpy",
	.fn_copy_async = "hipMemcpyAsync",
	.fn_event_record = "hipEventRecord",
	.fn_event_query = "hipEventQuery",
	.fn_stream_create = "hipStreamCreateWithFlags",
	.fn_event_create = "hipEventCreateWithFlags",
	.fn_enable_peer = "hipDeviceEnablePeerAccess",
	.fn_host_register = "hipHostRegister",
	.fn_ipc_get = "hipIpcGetMemHandle",
	.fn_dmabuf = "hipMemGetHandleForAddressRange",
	.version = hip_version,
	.version_str = hip_version_str,
	.open = hip_open,
	.dev_open = hip_dev_open,
	.describe = hip_describe,
	.set_dev = hip_set_dev,
	.can_access_peer = hip_can_access_peer,
	.enable_peer = hip_enable_peer,
	.stream_create = hip_stream_create,
	.stream_destroy = hip_stream_destroy,
	.stream_sync = hip_stream_sync,
	.event_create = hip_event_create,
	.event_destroy = hip_event_destroy,
	.event_record = hip_event_record,
	.event_query = hip_event_query,
	.event_sync = hip_event_sync,
	.copy_async = hip_copy_async,
	.copy = hip_copy,
	.strerror = hip_strerror,
	.sticky = hip_sticky,
	.status = hip_status,
	.ptr_info = hip_ptr_info,
	.alloc = hip_alloc,
	.free = hip_free,
	.host_register = hip_host_register,
	.host_unregister = hip_host_unregister,
	.dmabuf = hip_dmabuf,
	.ipc_get = hip_ipc_get,
	.import = hip_import,
	.unimport = hip_unimport,
};

static enum te_status hip_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	return te_plugin_gpu_init(host, ctx, &hip_vendor, sizeof(struct hip_inst), inst_out);
}

static const struct te_plugin_ops hip_ops = TE_PLUGIN_GPU_OPS(hip_init);

static const struct te_plugin_desc hip_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = HIP_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "HIP copies between AMD GPU memory of processes (IPC handles); owns memory "
		       "kind hip",
	.ops = &hip_ops,
	TE_PLUGIN_OPTIONS(hip_options),
};

TE_PLUGIN_DEFINE(&hip_desc)
