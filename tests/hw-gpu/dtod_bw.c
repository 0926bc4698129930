/* SPDX-License-Identifier: Apache-2.0 */
/* dtod_bw.c: the raw baseline of tests/hw-gpu/run.sh: cuMemcpyDtoDAsync bandwidth on one GPU. */

/*
 * dtod_bw [--library FILE] [--device N] [--size BYTES] [--seconds S] [--probe]
 *
 * Loads the CUDA driver with dlopen (default libcuda.so.1), resolves its entry points through
 * cuGetProcAddress as the nvlink plugin does, allocates two buffers of --size bytes on GPU
 * --device and copies one into the other with cuMemcpyDtoDAsync on one stream, back to back,
 * for --seconds (after one warm-up copy). It prints
 *
 *   dtod: device 0 (NAME), 67108864 bytes x 1234 copies in 2.001 s: 456.78 GB/s
 *
 * where GB/s is 10^9 bytes copied per second (each byte read once and written once). --probe
 * prints "gpus: N" and exits 0 when the driver loads and has a GPU, 77 otherwise (no driver,
 * no GPU): run.sh skips then.
 */

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#define DTOD_VERSION 12000

typedef CUresult (*dtod_getproc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
				    CUdriverProcAddressQueryResult *status);

static struct {
	__typeof__(cuInit) *init;
	__typeof__(cuGetErrorString) *error_string;
	__typeof__(cuDeviceGetCount) *device_count;
	__typeof__(cuDeviceGet) *device_get;
	__typeof__(cuDeviceGetName) *device_name;
	__typeof__(cuDevicePrimaryCtxRetain) *ctx_retain;
	__typeof__(cuDevicePrimaryCtxRelease) *ctx_release;
	__typeof__(cuCtxSetCurrent) *ctx_set;
	__typeof__(cuMemAlloc) *mem_alloc;
	__typeof__(cuMemFree) *mem_free;
	__typeof__(cuStreamCreate) *stream_create;
	__typeof__(cuStreamDestroy) *stream_destroy;
	__typeof__(cuStreamSynchronize) *stream_sync;
	__typeof__(cuMemcpyDtoDAsync) *dtod;
} cu;

static double dtod_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *dtod_err(CUresult r)
{
	const char *s = NULL;

	if (cu.error_string && cu.error_string(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown error";
}

#define DTOD_CHECK(call)                                                                           \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "dtod_bw: %s: %s (%d)\n", #call, dtod_err(r_), (int)r_);   \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* Resolve one entry point; 0 or an error message. */
static int dtod_resolve(dtod_getproc_fn getproc, const char *name, void **out)
{
	CUdriverProcAddressQueryResult qs;
	CUresult r = getproc(name, out, DTOD_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &qs);

	if (r != CUDA_SUCCESS || !*out) {
		fprintf(stderr, "dtod_bw: the driver has no %s for CUDA %d\n", name, DTOD_VERSION);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *library = "libcuda.so.1";
	unsigned long long size = 64ull << 20;
	double seconds = 2.0, t0, t1;
	int device = 0, count = 0, probe = 0;
	unsigned long long copies = 0;
	dtod_getproc_fn getproc;
	CUdeviceptr a = 0, b = 0;
	CUcontext ctx;
	CUstream stream;
	CUdevice dev;
	char name[128];
	void *dl;
	CUresult r;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--library") && i + 1 < argc)
			library = argv[++i];
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			size = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--probe"))
			probe = 1;
		else {
			fprintf(stderr,
				"usage: dtod_bw [--library FILE] [--device N] [--size BYTES] "
				"[--seconds S] [--probe]\n");
			return 2;
		}
	}
	dl = dlopen(library, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		fprintf(stderr, "dtod_bw: no CUDA driver: %s\n", dlerror());
		return probe ? 77 : 1;
	}
	*(void **)&getproc = dlsym(dl, "cuGetProcAddress_v2");
	if (!getproc) {
		fprintf(stderr, "dtod_bw: %s has no cuGetProcAddress_v2 (driver older than 12.0)\n",
			library);
		return probe ? 77 : 1;
	}
	if (dtod_resolve(getproc, "cuInit", (void **)&cu.init) ||
	    dtod_resolve(getproc, "cuGetErrorString", (void **)&cu.error_string) ||
	    dtod_resolve(getproc, "cuDeviceGetCount", (void **)&cu.device_count) ||
	    dtod_resolve(getproc, "cuDeviceGet", (void **)&cu.device_get) ||
	    dtod_resolve(getproc, "cuDeviceGetName", (void **)&cu.device_name) ||
	    dtod_resolve(getproc, "cuDevicePrimaryCtxRetain", (void **)&cu.ctx_retain) ||
	    dtod_resolve(getproc, "cuDevicePrimaryCtxRelease", (void **)&cu.ctx_release) ||
	    dtod_resolve(getproc, "cuCtxSetCurrent", (void **)&cu.ctx_set) ||
	    dtod_resolve(getproc, "cuMemAlloc", (void **)&cu.mem_alloc) ||
	    dtod_resolve(getproc, "cuMemFree", (void **)&cu.mem_free) ||
	    dtod_resolve(getproc, "cuStreamCreate", (void **)&cu.stream_create) ||
	    dtod_resolve(getproc, "cuStreamDestroy", (void **)&cu.stream_destroy) ||
	    dtod_resolve(getproc, "cuStreamSynchronize", (void **)&cu.stream_sync) ||
	    dtod_resolve(getproc, "cuMemcpyDtoDAsync", (void **)&cu.dtod))
		return probe ? 77 : 1;
	r = cu.init(0);
	if (r == CUDA_SUCCESS)
		r = cu.device_count(&count);
	if (r != CUDA_SUCCESS || count <= 0) {
		fprintf(stderr, "dtod_bw: no GPU: %s\n",
			r != CUDA_SUCCESS ? dtod_err(r) : "no device");
		return probe ? 77 : 1;
	}
	if (probe) {
		printf("gpus: %d\n", count);
		return 0;
	}
	if (device < 0 || device >= count) {
		fprintf(stderr, "dtod_bw: --device %d: %d GPU(s)\n", device, count);
		return 2;
	}
	DTOD_CHECK(cu.device_get(&dev, device));
	DTOD_CHECK(cu.device_name(name, sizeof(name), dev));
	DTOD_CHECK(cu.ctx_retain(&ctx, dev));
	DTOD_CHECK(cu.ctx_set(ctx));
	DTOD_CHECK(cu.mem_alloc(&a, (size_t)size));
	DTOD_CHECK(cu.mem_alloc(&b, (size_t)size));
	DTOD_CHECK(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
	DTOD_CHECK(cu.dtod(b, a, (size_t)size, stream)); /* warm-up */
	DTOD_CHECK(cu.stream_sync(stream));
	t0 = dtod_now();
	do {
		/* Keep a few copies queued: the GPU never waits for the host. */
		for (int k = 0; k < 8; k++)
			DTOD_CHECK(cu.dtod(b, a, (size_t)size, stream));
		DTOD_CHECK(cu.stream_sync(stream));
		copies += 8;
		t1 = dtod_now();
	} while (t1 - t0 < seconds);
	printf("dtod: device %d (%s), %llu bytes x %llu copies in %.3f s: %.2f GB/s\n", device,
	       name, size, copies, t1 - t0, (double)size * (double)copies / (t1 - t0) / 1e9);
	DTOD_CHECK(cu.stream_destroy(stream));
	DTOD_CHECK(cu.mem_free(a));
	DTOD_CHECK(cu.mem_free(b));
	DTOD_CHECK(cu.ctx_release(dev));
	return 0;
}
