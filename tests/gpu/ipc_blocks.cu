/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/ipc_blocks.cu - legacy IPC of small blocks that share one libemm
 * segment, between two processes on a real GPU. `gpu-ipc-blocks driver`
 * allocates and shares with the driver API (cuMemAlloc, cuIpcGetMemHandle,
 * cuIpcOpenMemHandle), `gpu-ipc-blocks runtime` with the runtime API
 * (cudaMalloc, cudaIpcGetMemHandle, cudaIpcOpenMemHandle; static cudart,
 * which reaches the driver through cuGetProcAddress). The exporter runs
 * under libemm; importers are this program again (fork+exec), in a mode:
 *
 *   import API N (HANDLE SIZE OFFSET SEED){N}  under libemm: opens every
 *        block, checks its bytes, its address range (base + offset, the
 *        block's size), the blocks' relative positions, opens one handle
 *        twice (same pointer), adds 1 to block 1 with a kernel, then - after
 *        the exporter freed every block and released its idle memory -
 *        reads the other blocks again (the segment stays alive) and closes;
 *   plain API SUB WHOLE SIZE SEED  without libemm (LD_PRELOAD unset): the
 *        sub-block's libemm handle must fail (never the segment's bytes;
 *        the driver's code is printed, "EMM-CONFIRM: ..."), a whole
 *        segment's handle (the driver's own) opens at the right bytes;
 *   export-exit API  exports a sub-block and a whole segment, prints both
 *        handles and exits: opening them afterwards gives one code;
 *   open1 API HANDLE  under libemm: prints the code of one open (a handle
 *        whose segment the exporter gave back after every importer closed
 *        it must not open).
 *
 * With IPC_IMPORT_DEVICE=N the importers run on device N, the exporter on
 * device 0 (IPC across devices; a skip with fewer than N + 1 GPUs).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_common.h"
#include "ipc_test.h"

#define NBLK 4
#define WHOLE_SIZE ((size_t)12 << 20)

static const size_t blk_size[NBLK] = {4096, 1000, 8192, 512};
static bool use_driver;

__global__ void fill_kernel(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

__global__ void add_one(unsigned char *p, size_t n)
{
	for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = (unsigned char)(p[i] + 1);
}

static void fill(CUdeviceptr d, size_t n, unsigned seed)
{
	fill_kernel<<<16, 256>>>((unsigned char *)d, n, seed);
	if (cudaDeviceSynchronize() != cudaSuccess)
		abort();
}

/* 0 if the bytes at d follow pattern seed (+ add). */
static int check(CUdeviceptr d, size_t n, unsigned seed, unsigned add)
{
	unsigned char *buf = (unsigned char *)malloc(n);
	int bad = cudaMemcpy(buf, (void *)d, n, cudaMemcpyDeviceToHost) != cudaSuccess;
	for (size_t i = 0; i < n && !bad; i++)
		bad = buf[i] != (unsigned char)(ipc_pattern(seed, i) + add);
	free(buf);
	return bad;
}

/* --- the two APIs -------------------------------------------------------- */

static int dev_alloc(CUdeviceptr *d, size_t n)
{
	if (use_driver)
		return cuMemAlloc(d, n) == CUDA_SUCCESS ? 0 : -1;
	return cudaMalloc((void **)d, n) == cudaSuccess ? 0 : -1;
}

static int dev_free(CUdeviceptr d)
{
	return use_driver ? (cuMemFree(d) == CUDA_SUCCESS ? 0 : -1) : (cudaFree((void *)d) == cudaSuccess ? 0 : -1);
}

/* Export: 0 or the API's error code. */
static int export_handle(CUdeviceptr d, CUipcMemHandle *h)
{
	if (use_driver)
		return (int)cuIpcGetMemHandle(h, d);
	return (int)cudaIpcGetMemHandle((cudaIpcMemHandle_t *)h, (void *)d);
}

static int open_handle(const CUipcMemHandle *h, CUdeviceptr *d)
{
	if (use_driver)
		return (int)cuIpcOpenMemHandle(d, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	cudaIpcMemHandle_t rh;
	memcpy(&rh, h, sizeof(rh));
	return (int)cudaIpcOpenMemHandle((void **)d, rh, cudaIpcMemLazyEnablePeerAccess);
}

static int close_handle(CUdeviceptr d)
{
	return use_driver ? (int)cuIpcCloseMemHandle(d) : (int)cudaIpcCloseMemHandle((void *)d);
}

/* --- helpers ------------------------------------------------------------- */

/* The child's next line that starts with `tag ` (its other output is
 * passed on): 0 and the rest, or -1 at its end. */
static int child_line(struct ipc_child *c, const char *tag, char *buf, size_t n)
{
	char line[512];
	size_t t = strlen(tag);

	while (fgets(line, sizeof(line), c->out)) {
		line[strcspn(line, "\n")] = '\0';
		if (strncmp(line, tag, t) == 0 && line[t] == ' ') {
			snprintf(buf, n, "%s", line + t + 1);
			return 0;
		}
		printf("  child: %s\n", line);
	}
	buf[0] = '\0';
	return -1;
}

static int child_wait(struct ipc_child *c)
{
	char rest[512];
	int status = 0;

	fclose(c->in);
	while (child_line(c, "\x01", rest, sizeof(rest)) == 0)
		;
	fclose(c->out);
	if (waitpid(c->pid, &status, 0) != c->pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const char *api_name(void)
{
	return use_driver ? "driver" : "runtime";
}

/* --- importer modes ------------------------------------------------------ */

#define CHILD_CHECK(c)                                                                                       \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			printf("child-fail %s:%d: %s\n", __FILE__, __LINE__, #c);                            \
			return 1;                                                                            \
		}                                                                                            \
	} while (0)

static int mode_import(int argc, char **argv)
{
	CUdeviceptr p[NBLK], again, base;
	CUipcMemHandle h[NBLK];
	size_t size[NBLK], off[NBLK], range;
	unsigned seed[NBLK];
	char line[64];
	int n = atoi(argv[3]);

	CHILD_CHECK(n == NBLK && argc == 4 + 4 * n);
	CHILD_CHECK(gpu_emm_present());
	for (int i = 0; i < n; i++) {
		ipc_from_hex(argv[4 + 4 * i], &h[i]);
		size[i] = strtoul(argv[5 + 4 * i], NULL, 0);
		off[i] = strtoul(argv[6 + 4 * i], NULL, 0);
		seed[i] = (unsigned)atoi(argv[7 + 4 * i]);
		CHILD_CHECK(open_handle(&h[i], &p[i]) == 0);
		CHILD_CHECK(check(p[i], size[i], seed[i], 0) == 0);
		/* The range of the block, as the exporter answers it. */
		CHILD_CHECK(cuMemGetAddressRange(&base, &range, p[i] + size[i] - 1) == CUDA_SUCCESS);
		CHILD_CHECK(base == p[i] && range == size[i]);
	}
	for (int i = 1; i < n; i++)
		CHILD_CHECK(p[i] - p[0] == off[i] - off[0]);
	CHILD_CHECK(open_handle(&h[0], &again) == 0);
	CHILD_CHECK(again == p[0]);
	add_one<<<16, 256>>>((unsigned char *)p[1], size[1]);
	CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
	printf("written 1\n");
	fflush(stdout);
	CHILD_CHECK(fgets(line, sizeof(line), stdin) && strncmp(line, "freed", 5) == 0);
	/* The exporter freed every block and released its idle memory: the
	 * segment is alive, the bytes unchanged. */
	for (int i = 2; i < n; i++)
		CHILD_CHECK(check(p[i], size[i], seed[i], 0) == 0);
	CHILD_CHECK(close_handle(p[0]) == 0);
	CHILD_CHECK(check(p[0], size[0], seed[0], 0) == 0);
	CHILD_CHECK(close_handle(p[0]) == 0);
	for (int i = 1; i < n; i++)
		CHILD_CHECK(close_handle(p[i]) == 0);
	printf("done 1\n");
	return 0;
}

static int mode_plain(int argc, char **argv)
{
	CUipcMemHandle sub, whole;
	CUdeviceptr p = 0;

	CHILD_CHECK(argc == 7);
	CHILD_CHECK(!gpu_emm_present());
	ipc_from_hex(argv[3], &sub);
	ipc_from_hex(argv[4], &whole);
	int r = open_handle(&sub, &p);
	printf("sub %d\n", r);
	fflush(stdout);
	/* Never the segment's first bytes: an error. */
	CHILD_CHECK(r != 0);
	CHILD_CHECK(open_handle(&whole, &p) == 0);
	CHILD_CHECK(check(p, strtoul(argv[5], NULL, 0), (unsigned)atoi(argv[6]), 0) == 0);
	CHILD_CHECK(close_handle(p) == 0);
	return 0;
}

static int mode_open1(int argc, char **argv)
{
	CUipcMemHandle h;
	CUdeviceptr p = 0;

	CHILD_CHECK(argc == 4 && gpu_emm_present());
	ipc_from_hex(argv[3], &h);
	int r = open_handle(&h, &p);
	printf("open %d\n", r);
	if (r == 0)
		(void)close_handle(p);
	return 0;
}

static int mode_export_exit(void)
{
	CUdeviceptr a, b, w;
	CUipcMemHandle hb, hw;
	char hex[2 * CU_IPC_HANDLE_SIZE + 1];

	CHILD_CHECK(dev_alloc(&a, 4096) == 0 && dev_alloc(&b, 4096) == 0 && dev_alloc(&w, WHOLE_SIZE) == 0);
	CHILD_CHECK(export_handle(b, &hb) == 0 && export_handle(w, &hw) == 0);
	ipc_to_hex(&hb, hex);
	printf("sub %s\n", hex);
	ipc_to_hex(&hw, hex);
	printf("whole %s\n", hex);
	return 0;
}

/* --- the tests (exporter side) ------------------------------------------- */

TEST_BEGIN(test_blocks_shared_with_a_libemm_importer)
{
	CUdeviceptr d[NBLK];
	CUipcMemHandle h[NBLK], again;
	char hex[NBLK][2 * CU_IPC_HANDLE_SIZE + 1], sz[NBLK][32], off[NBLK][32], seed[NBLK][16], line[64];
	char *argv[4 + 4 * NBLK + 1] = {(char *)"self", (char *)"import", (char *)api_name(), (char *)"4"};
	struct gpu_snap a, b;
	struct ipc_child c;

	/* An empty pool: every block comes from one fresh small segment. */
	(void)gpu_release_idle(-1, 0);
	gpu_snap_take(&a);
	for (int i = 0; i < NBLK; i++) {
		assert_int_eq(dev_alloc(&d[i], blk_size[i]), 0);
		fill(d[i], blk_size[i], (unsigned)i + 1);
	}
	gpu_snap_take(&b);
	expect_served("IPC blocks", GPU_SCOPE_DEVICE, &a, &b, NBLK);
	expect_true(b.dev.backend_allocs - a.dev.backend_allocs <= 1); /* one segment (the child checks offsets) */
	for (int i = 0; i < NBLK; i++) {
		assert_int_eq(export_handle(d[i], &h[i]), 0);
		ipc_to_hex(&h[i], hex[i]);
		snprintf(sz[i], sizeof(sz[i]), "%zu", blk_size[i]);
		snprintf(off[i], sizeof(off[i]), "%llu", (unsigned long long)(d[i] - d[0]));
		snprintf(seed[i], sizeof(seed[i]), "%d", i + 1);
		argv[4 + 4 * i] = hex[i];
		argv[5 + 4 * i] = sz[i];
		argv[6 + 4 * i] = off[i];
		argv[7 + 4 * i] = seed[i];
	}
	assert_int_eq(export_handle(d[2], &again), 0);
	expect_true(memcmp(&again, &h[2], sizeof(again)) == 0);
	/* In this process: the same answer as the driver's for its own. */
	CUdeviceptr q = 0;
	expect_int_ne(open_handle(&h[0], &q), 0);

	ipc_spawn(&c, true, NULL, argv);
	expect_int_eq(child_line(&c, "written", line, sizeof(line)), 0);
	/* The importer's kernel wrote block 1. */
	expect_int_eq(check(d[1], blk_size[1], 2, 1), 0);
	for (int i = 0; i < NBLK; i++)
		assert_int_eq(dev_free(d[i]), 0);
	(void)gpu_release_idle(-1, 0);
	fprintf(c.in, "freed\n");
	expect_int_eq(child_line(&c, "done", line, sizeof(line)), 0);
	expect_int_eq(child_wait(&c), 0);
	/* Every importer closed and left: the segment goes back at the next
	 * release, and its handles no longer open. */
	long long released = gpu_release_idle(-1, 0);
	expect_true(released >= (long long)(2 << 20));
	char *argv1[] = {(char *)"self", (char *)"open1", (char *)api_name(), hex[0], NULL};
	ipc_spawn(&c, true, NULL, argv1);
	expect_int_eq(child_line(&c, "open", line, sizeof(line)), 0);
	printf("  a handle of a segment given back: open answers %s\n", line);
	expect_int_ne(atoi(line), 0);
	expect_int_eq(child_wait(&c), 0);
}
TEST_END

TEST_BEGIN(test_importer_without_libemm)
{
	CUdeviceptr a, b, w;
	CUipcMemHandle hb, hw;
	char hexb[2 * CU_IPC_HANDLE_SIZE + 1], hexw[2 * CU_IPC_HANDLE_SIZE + 1], size[32], line[64];
	char *argv[] = {(char *)"self", (char *)"plain", (char *)api_name(), hexb, hexw, size, (char *)"9", NULL};
	struct ipc_child c;

	assert_int_eq(dev_alloc(&a, 4096), 0);
	assert_int_eq(dev_alloc(&b, 4096), 0);
	assert_int_eq(dev_alloc(&w, WHOLE_SIZE), 0);
	fill(a, 4096, 3);
	fill(b, 4096, 4);
	fill(w, WHOLE_SIZE, 9);
	assert_int_eq(export_handle(b, &hb), 0);
	assert_int_eq(export_handle(w, &hw), 0);
	ipc_to_hex(&hb, hexb);
	ipc_to_hex(&hw, hexw);
	snprintf(size, sizeof(size), "%zu", WHOLE_SIZE);
	ipc_spawn(&c, false, NULL, argv);
	expect_int_eq(child_line(&c, "sub", line, sizeof(line)), 0);
	/* To be confirmed on the GPU: the fake answers CUDA_ERROR_INVALID_VALUE
	 * (1; cudaErrorInvalidValue is 1 too). */
	printf("EMM-CONFIRM: the %s API without libemm answers %s for a libemm handle (expected 1, "
	       "invalid value)\n",
	       api_name(), line);
	expect_int_eq(child_wait(&c), 0);
	assert_int_eq(dev_free(a), 0);
	assert_int_eq(dev_free(b), 0);
	assert_int_eq(dev_free(w), 0);
}
TEST_END

TEST_BEGIN(test_exporter_exit)
{
	char sub[160], whole[160];
	char *argv[] = {(char *)"self", (char *)"export-exit", (char *)api_name(), NULL};
	CUipcMemHandle hs, hw;
	CUdeviceptr ps = 0, pw = 0;
	struct ipc_child c;

	ipc_spawn(&c, true, NULL, argv);
	expect_int_eq(child_line(&c, "sub", sub, sizeof(sub)), 0);
	expect_int_eq(child_line(&c, "whole", whole, sizeof(whole)), 0);
	expect_int_eq(child_wait(&c), 0);
	ipc_from_hex(sub, &hs);
	ipc_from_hex(whole, &hw);
	/* Whatever the driver answers for its own handle of an exited
	 * process, the libemm handle gets the same. */
	int rw = open_handle(&hw, &pw), rs = open_handle(&hs, &ps);
	printf("  after the exporter exited: driver handle %d, libemm handle %d\n", rw, rs);
	expect_int_eq(rs, rw);
	if (rw == 0)
		expect_int_eq(close_handle(pw), 0);
	if (rs == 0)
		expect_int_eq(close_handle(ps), 0);
}
TEST_END

int main(int argc, char **argv)
{
	int count = 0;
	cudaError_t e;

	use_driver = argc > 2 ? strcmp(argv[2], "driver") == 0 : argc > 1 && strcmp(argv[1], "driver") == 0;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		printf("skip: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n", cudaGetErrorName(e),
		       count);
		return GPU_SKIP;
	}
	/* IPC_IMPORT_DEVICE=N: importers open the handles on device N while the
	 * exporter stays on device 0 (IPC across devices; needs N + 1 GPUs). */
	const char *imp = getenv("IPC_IMPORT_DEVICE");
	int import_dev = imp ? atoi(imp) : 0;
	bool importer = argc > 1 && (!strcmp(argv[1], "import") || !strcmp(argv[1], "plain") || !strcmp(argv[1], "open1"));
	if (import_dev >= count) {
		printf("skip: IPC_IMPORT_DEVICE=%d but %d device(s) here\n", import_dev, count);
		return GPU_SKIP;
	}
	int dev = importer ? import_dev : 0;
	if (cudaSetDevice(dev) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		printf("FAIL: cannot initialise device %d\n", dev);
		return 1;
	}
	if (!importer && import_dev)
		printf("importers open the handles on device %d, the exporter is on device 0\n", import_dev);
	if (argc > 1 && !strcmp(argv[1], "import"))
		return mode_import(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "plain"))
		return mode_plain(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "export-exit"))
		return mode_export_exit();
	if (argc > 1 && !strcmp(argv[1], "open1"))
		return mode_open1(argc, argv);
	if (!gpu_emm_present()) {
		printf("FAIL: libemm is not loaded\n");
		return 1;
	}
	printf("ipc-blocks-%s: blocks of one libemm segment shared with other processes\n", api_name());
	/* A backend whose memory the driver cannot export (vmm: cuIpcGetMemHandle
	 * refuses VMM memory) must refuse clearly and lose nothing. */
	const char *backend = getenv("EMM_BACKEND");
	if (backend && *backend && strcmp(backend, "driver") != 0) {
		CUdeviceptr d = 0;
		CUipcMemHandle h;
		if (dev_alloc(&d, 4096) != 0) {
			printf("FAIL: allocation under EMM_BACKEND=%s\n", backend);
			return 1;
		}
		fill(d, 4096, 7);
		int code = export_handle(d, &h);
		if (code != 0) {
			bool ok = code == (use_driver ? (int)CUDA_ERROR_NOT_SUPPORTED : (int)cudaErrorNotSupported) &&
			          check(d, 4096, 7, 0) == 0 && dev_free(d) == 0;
			printf("%s: EMM_BACKEND=%s: export refused with %d (want not-supported), block intact and freed: %s\n",
			       ok ? "ok" : "FAIL", backend, code, ok ? "yes" : "no");
			cudaGetLastError();
			if (!ok)
				return 1;
			printf("EMM-PARTIAL: ran 1, skipped 3 (EMM_BACKEND=%s: its memory cannot be exported, "
			       "refused clearly)\n", backend);
			return 0;
		}
		dev_free(d);
	}
	static emm_test_fn tests[] = {test_blocks_shared_with_a_libemm_importer, test_importer_without_libemm,
	                              test_exporter_exit, NULL};
	int rc = emm_test_run_list(tests);
	gpu_print_served(use_driver ? "ipc-blocks-driver" : "ipc-blocks-runtime");
	return rc;
}
