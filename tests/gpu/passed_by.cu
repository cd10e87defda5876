/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/passed_by.cu - the "passed by" statistics on the GPU (issue
 * 18): every family of calls that reaches the driver without libemm
 * serving it is counted in emm_stats' passby_* fields with its calls and
 * bytes, and a vectorAdd-sized program reports its true peak.
 *
 * Through the runtime (shared cudart, whose driver calls reach libemm's
 * shims through cuGetProcAddress):
 *   - vectorAdd: three 200000-byte cudaMalloc blocks alive together, freed:
 *     requested peak exactly 600000, peak error 0 (one thread);
 *   - arrays: cudaMallocArray (float4, 256 x 128), cudaMalloc3DArray
 *     (uchar1, 64 x 32 x 8), cudaMallocMipmappedArray (float1, 128 x 128,
 *     4 levels): 3 calls, bytes from the descriptors; data through the 2-D
 *     array checked;
 *   - a graph memory node (cudaGraphAddMemAllocNode, 1 MiB): 1 call, 1 MiB;
 *   - managed memory (cudaMallocManaged, 3 MiB + 5): 1 call, its bytes,
 *     and its cudaFree one unknown free;
 *   - host registration (cudaHostRegister, 2 MiB): 1 call, 2 MiB;
 *   - a stream-ordered allocation during a capture (cudaMallocAsync, 1 MiB
 *     on a capturing stream): 1 call, 1 MiB.
 * Prints "passby FAMILY calls N bytes N" per family and the result of each
 * check ("ok"/"FAIL"); exit 1 on any failure, 77 without a GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

#define MIB (1ull << 20)

static int failures;

static void check(const char *what, unsigned long long got, unsigned long long want)
{
	int ok = got == want;

	printf("%s %s: %llu (want %llu)\n", ok ? "ok" : "FAIL", what, got, want);
	if (!ok)
		failures++;
}

static void cuda_ok(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) {
		printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
		failures++;
	}
}

static struct emm_stats process_stats(void)
{
	struct emm_stats s;

	if (gpu_stats(GPU_SCOPE_PROCESS, &s) != 0) {
		printf("FAIL emm_stats_get\n");
		failures++;
	}
	return s;
}

#define DIFF(a, b, f) ((unsigned long long)((b).f - (a).f))

static void vector_add_peak(void)
{
	void *p[3];
	struct emm_stats s;

	for (int i = 0; i < 3; i++)
		cuda_ok(cudaMalloc(&p[i], 200000), "cudaMalloc");
	for (int i = 0; i < 3; i++)
		cuda_ok(cudaFree(p[i]), "cudaFree");
	s = process_stats();
	check("vectorAdd requested peak", s.requested_bytes_peak, 600000);
	check("vectorAdd requested peak error", s.requested_bytes_peak_error, 0);
	check("vectorAdd allocated peak error", s.allocated_bytes_peak_error, 0);
	if (s.allocated_bytes_peak < 600000) {
		printf("FAIL vectorAdd allocated peak %llu < 600000\n", (unsigned long long)s.allocated_bytes_peak);
		failures++;
	}
}

static void arrays(void)
{
	struct emm_stats a, b;
	cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
	cudaChannelFormatDesc u1 = cudaCreateChannelDesc<unsigned char>();
	cudaChannelFormatDesc f1 = cudaCreateChannelDesc<float>();
	cudaArray_t a2 = NULL, a3 = NULL;
	cudaMipmappedArray_t m = NULL;
	const size_t w = 256, h = 128;
	unsigned long long want = w * h * 16 + 64 * 32 * 8 + (128 * 128 + 64 * 64 + 32 * 32 + 16 * 16) * 4;
	float *host = (float *)malloc(w * h * 16), *back = (float *)malloc(w * h * 16);

	for (size_t i = 0; i < w * h * 4; i++)
		host[i] = (float)i;
	a = process_stats();
	cuda_ok(cudaMallocArray(&a2, &f4, w, h), "cudaMallocArray");
	cuda_ok(cudaMalloc3DArray(&a3, &u1, make_cudaExtent(64, 32, 8)), "cudaMalloc3DArray");
	cuda_ok(cudaMallocMipmappedArray(&m, &f1, make_cudaExtent(128, 128, 0), 4), "cudaMallocMipmappedArray");
	b = process_stats();
	cuda_ok(cudaMemcpy2DToArray(a2, 0, 0, host, w * 16, w * 16, h, cudaMemcpyHostToDevice), "to array");
	cuda_ok(cudaMemcpy2DFromArray(back, w * 16, a2, 0, 0, w * 16, h, cudaMemcpyDeviceToHost), "from array");
	check("array data intact", memcmp(host, back, w * h * 16) == 0, 1);
	printf("passby arrays calls %llu bytes %llu\n", DIFF(a, b, passby_array_calls), DIFF(a, b, passby_array_bytes));
	check("array calls", DIFF(a, b, passby_array_calls), 3);
	check("array bytes", DIFF(a, b, passby_array_bytes), want);
	check("arrays served by the pool", DIFF(a, b, allocs), 0);
	cuda_ok(cudaFreeArray(a2), "cudaFreeArray");
	cuda_ok(cudaFreeArray(a3), "cudaFreeArray 3D");
	cuda_ok(cudaFreeMipmappedArray(m), "cudaFreeMipmappedArray");
	free(host);
	free(back);
}

static void graph_memory_node(void)
{
	struct emm_stats a, b;
	cudaGraph_t g;
	cudaGraphNode_t node;
	cudaMemAllocNodeParams params;

	memset(&params, 0, sizeof(params));
	params.poolProps.allocType = cudaMemAllocationTypePinned;
	params.poolProps.location.type = cudaMemLocationTypeDevice;
	params.poolProps.location.id = 0;
	params.bytesize = MIB;
	cuda_ok(cudaGraphCreate(&g, 0), "cudaGraphCreate");
	a = process_stats();
	cuda_ok(cudaGraphAddMemAllocNode(&node, g, NULL, 0, &params), "cudaGraphAddMemAllocNode");
	b = process_stats();
	printf("passby graph_mem calls %llu bytes %llu\n", DIFF(a, b, passby_graph_mem_calls),
	       DIFF(a, b, passby_graph_mem_bytes));
	check("graph memory node calls", DIFF(a, b, passby_graph_mem_calls), 1);
	check("graph memory node bytes", DIFF(a, b, passby_graph_mem_bytes), MIB);
	cuda_ok(cudaGraphAddMemFreeNode(&node, g, &node, 1, params.dptr), "cudaGraphAddMemFreeNode");
	cuda_ok(cudaGraphDestroy(g), "cudaGraphDestroy");
}

static void managed(void)
{
	struct emm_stats a, b;
	char *p = NULL;
	const size_t n = 3 * MIB + 5;

	a = process_stats();
	cuda_ok(cudaMallocManaged(&p, n), "cudaMallocManaged");
	if (p) {
		memset(p, 7, n);
		cuda_ok(cudaMemset(p, 9, n), "cudaMemset managed");
		cuda_ok(cudaDeviceSynchronize(), "sync");
		check("managed data", p[n - 1] == 9, 1);
	}
	cuda_ok(cudaFree(p), "cudaFree managed");
	b = process_stats();
	printf("passby managed calls %llu bytes %llu\n", DIFF(a, b, passby_managed_calls),
	       DIFF(a, b, passby_managed_bytes));
	check("managed calls", DIFF(a, b, passby_managed_calls), 1);
	check("managed bytes", DIFF(a, b, passby_managed_bytes), n);
	check("unknown frees (the managed pointer)", DIFF(a, b, passby_unknown_free_calls), 1);
}

static void host_register(void)
{
	struct emm_stats a, b;
	void *p = NULL;

	if (posix_memalign(&p, 4096, 2 * MIB) != 0) {
		printf("FAIL posix_memalign\n");
		failures++;
		return;
	}
	a = process_stats();
	cuda_ok(cudaHostRegister(p, 2 * MIB, cudaHostRegisterDefault), "cudaHostRegister");
	b = process_stats();
	cuda_ok(cudaHostUnregister(p), "cudaHostUnregister");
	printf("passby host_register calls %llu bytes %llu\n", DIFF(a, b, passby_host_register_calls),
	       DIFF(a, b, passby_host_register_bytes));
	check("host registration calls", DIFF(a, b, passby_host_register_calls), 1);
	check("host registration bytes", DIFF(a, b, passby_host_register_bytes), 2 * MIB);
	free(p);
}

static void capture(void)
{
	struct emm_stats a, b;
	cudaStream_t s;
	cudaGraph_t g = NULL;
	void *p = NULL;

	cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
	a = process_stats();
	cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
	cuda_ok(cudaMallocAsync(&p, MIB, s), "cudaMallocAsync in capture");
	cuda_ok(cudaFreeAsync(p, s), "cudaFreeAsync in capture");
	cuda_ok(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
	b = process_stats();
	printf("passby capture calls %llu bytes %llu\n", DIFF(a, b, passby_capture_calls),
	       DIFF(a, b, passby_capture_bytes));
	check("capture calls", DIFF(a, b, passby_capture_calls), 1);
	check("capture bytes", DIFF(a, b, passby_capture_bytes), MIB);
	if (g)
		cuda_ok(cudaGraphDestroy(g), "cudaGraphDestroy");
	cuda_ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

int main(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("skip: no GPU\n");
		return GPU_SKIP;
	}
	if (!gpu_emm_present()) {
		printf("FAIL libemm is not loaded (run with LD_PRELOAD=libemm.so)\n");
		return 1;
	}
	cuda_ok(cudaSetDevice(0), "cudaSetDevice");
	vector_add_peak();
	arrays();
	graph_memory_node();
	managed();
	host_register();
	capture();
	printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
	return failures != 0;
}
