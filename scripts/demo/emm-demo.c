/* SPDX-License-Identifier: MIT */
/*
 * emm-demo - the built-in demo that `scripts/emm-run` runs when no program is
 * given. It is an ordinary CUDA driver-API program that knows nothing of
 * libemm: it reaches the driver exactly the way cudart does (dlopen
 * "libcuda.so.1", dlsym "cuGetProcAddress_v2", then every function through
 * that resolver), and runs an allocation pattern like a training loop: per
 * step, activations of mixed sizes allocated forward and freed backward,
 * some stream-ordered on two streams. It prints the time per alloc+free pair
 * and, when libemm is loaded, libemm's own counters.
 *
 *   emm-demo [--steps N] [--touch]
 * --touch writes every buffer with cuMemsetD8 (only meaningful on a GPU; the
 * host-simulation backend hands out addresses that must never be touched).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emm/emm.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
	CUresult (*init)(unsigned int);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set_current)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*mem_free_async)(CUdeviceptr, CUstream);
	CUresult (*stream_create)(CUstream *, unsigned int);
	CUresult (*stream_synchronize)(CUstream);
	CUresult (*ctx_synchronize)(void);
	CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
} cu;

static int resolve(get_proc_fn get_proc, const char *name, int version, void **ret)
{
	CUdriverProcAddressQueryResult status;
	CUresult r = get_proc(name, ret, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
	if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !*ret) {
		fprintf(stderr, "emm-demo: driver has no %s (error %d, status %d)\n", name, (int)r, (int)status);
		return -1;
	}
	return 0;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define CHECK(call)                                                                  \
	do {                                                                         \
		CUresult r_ = (call);                                                \
		if (r_ != CUDA_SUCCESS) {                                            \
			fprintf(stderr, "emm-demo: %s failed: error %d\n", #call, (int)r_); \
			return 1;                                                    \
		}                                                                    \
	} while (0)

int main(int argc, char **argv)
{
	/* A layer's activations: sizes in bytes, as a small transformer step
	 * would allocate them (mixed small and large). */
	static const size_t layer_sizes[] = {
		512,	  4096,	    64 << 10, 256 << 10, 1 << 20,  3 << 20,
		8 << 20,  12 << 20, 1000,	 768 << 10, 16 << 20, 96,
	};
	enum { LAYERS = 24, PER_LAYER = sizeof(layer_sizes) / sizeof(layer_sizes[0]) };
	static CUdeviceptr live[LAYERS * PER_LAYER];
	int steps = 50, touch = 0;
	void *lib;
	get_proc_fn get_proc;
	CUdevice dev;
	CUcontext ctx;
	CUstream streams[2];
	long pairs = 0;
	double t0, t1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--touch"))
			touch = 1;
		else {
			fprintf(stderr, "usage: emm-demo [--steps N] [--touch]\n");
			return 2;
		}
	}

	lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "emm-demo: cannot load libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	if (!get_proc) {
		fprintf(stderr, "emm-demo: libcuda.so.1 has no cuGetProcAddress_v2\n");
		return 1;
	}
	if (resolve(get_proc, "cuInit", 2000, (void **)&cu.init) ||
	    resolve(get_proc, "cuDeviceGet", 2000, (void **)&cu.device_get) ||
	    resolve(get_proc, "cuDevicePrimaryCtxRetain", 7000, (void **)&cu.primary_retain) ||
	    resolve(get_proc, "cuCtxSetCurrent", 4000, (void **)&cu.ctx_set_current) ||
	    resolve(get_proc, "cuMemAlloc", 3020, (void **)&cu.mem_alloc) ||
	    resolve(get_proc, "cuMemFree", 3020, (void **)&cu.mem_free) ||
	    resolve(get_proc, "cuMemAllocAsync", 11020, (void **)&cu.mem_alloc_async) ||
	    resolve(get_proc, "cuMemFreeAsync", 11020, (void **)&cu.mem_free_async) ||
	    resolve(get_proc, "cuStreamCreate", 2000, (void **)&cu.stream_create) ||
	    resolve(get_proc, "cuStreamSynchronize", 2000, (void **)&cu.stream_synchronize) ||
	    resolve(get_proc, "cuCtxSynchronize", 2000, (void **)&cu.ctx_synchronize) ||
	    resolve(get_proc, "cuMemsetD8", 3020, (void **)&cu.memset_d8))
		return 1;

	CHECK(cu.init(0));
	CHECK(cu.device_get(&dev, 0));
	CHECK(cu.primary_retain(&ctx, dev));
	CHECK(cu.ctx_set_current(ctx));
	CHECK(cu.stream_create(&streams[0], CU_STREAM_NON_BLOCKING));
	CHECK(cu.stream_create(&streams[1], CU_STREAM_NON_BLOCKING));

	t0 = now_us();
	for (int step = 0; step < steps; step++) {
		/* forward: allocate every layer's activations */
		for (int l = 0; l < LAYERS; l++) {
			for (int k = 0; k < PER_LAYER; k++) {
				CUdeviceptr *p = &live[l * PER_LAYER + k];
				size_t size = layer_sizes[k] + (size_t)(l * 512);
				if (k % 3 == 2) /* some activations are stream-ordered */
					CHECK(cu.mem_alloc_async(p, size, streams[l & 1]));
				else
					CHECK(cu.mem_alloc(p, size));
				if (touch)
					CHECK(cu.memset_d8(*p, (unsigned char)step, size));
			}
		}
		/* backward: free them in reverse */
		for (int l = LAYERS - 1; l >= 0; l--) {
			for (int k = PER_LAYER - 1; k >= 0; k--) {
				CUdeviceptr p = live[l * PER_LAYER + k];
				if (k % 3 == 2)
					CHECK(cu.mem_free_async(p, streams[l & 1]));
				else
					CHECK(cu.mem_free(p));
				pairs++;
			}
		}
	}
	CHECK(cu.ctx_synchronize());
	t1 = now_us();

	printf("emm-demo: %d steps, %ld alloc+free pairs in %.1f ms: %.2f us per pair\n", steps, pairs,
	       (t1 - t0) / 1e3, (t1 - t0) / (double)pairs);

	{
		int (*stats_get)(int, struct emm_stats *) =
			(int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");
		struct emm_stats s;
		memset(&s, 0, sizeof(s));
		s.struct_size = sizeof(s);
		if (stats_get && stats_get(-1, &s) == 0)
			printf("emm-demo: libemm served %llu allocations, %llu from cache (%.1f%%), "
			       "%llu backend allocations, peak reserved %.1f MiB for peak allocated %.1f MiB\n",
			       (unsigned long long)s.allocs, (unsigned long long)s.hits,
			       s.allocs ? 100.0 * (double)s.hits / (double)s.allocs : 0.0,
			       (unsigned long long)s.backend_allocs, (double)s.reserved_bytes_peak / 1048576.0,
			       (double)s.allocated_bytes_peak / 1048576.0);
		else
			printf("emm-demo: libemm is not loaded (run through scripts/emm-run)\n");
	}
	return 0;
}
