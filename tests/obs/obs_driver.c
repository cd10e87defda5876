/* SPDX-License-Identifier: MIT */
/*
 * tests/obs/obs_driver.c - a driver-API program that makes the allocations
 * its arguments list, for the observability tests (check-obs.py runs it
 * with LD_PRELOAD=libemm.so over the test-double driver and reads what
 * libemm wrote: stderr, EMM_LOG, EMM_STATS JSON, EMM_SNAPSHOT).
 *
 * Each argument is one step:
 *   a:SIZE   cuMemAlloc that must succeed     A:SIZE  cuMemAllocAsync on a stream, must succeed
 *   o:SIZE   cuMemAlloc that must fail with CUDA_ERROR_OUT_OF_MEMORY
 *   z        cuMemAlloc of 0 bytes (the driver's CUDA_ERROR_INVALID_VALUE)
 *   h:SIZE   cuMemHostAlloc that must succeed
 *   m:SIZE   cuMemAllocManaged that must succeed (freed by f: with cuMemFree)
 *   r:SIZE   cuArrayCreate of SIZE one-byte elements (one row) that must succeed
 *   f:I      free the I-th successful allocation (0-based; host or device, sync or async)
 *   s:MS     sleep MS milliseconds              k:SIG   raise signal SIG
 *   w:FILE   wait (up to 5 s) until FILE exists and is not empty
 *   t:FILE   create FILE with one line in it
 *   x:SIZE   fork; the child's cuMemAlloc of SIZE must fail with CUDA_ERROR_NOT_INITIALIZED
 * SIZE takes a K or M suffix. Exit 0 when every step did what it must,
 * else 1 with the step on stderr.
 */
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIVE 256

struct live {
	CUdeviceptr dptr;
	void *host;
	CUstream stream;
};

static struct live live[MAX_LIVE];
static int nlive;
static CUstream stream;

static size_t parse_size(const char *s)
{
	char *end;
	size_t v = strtoull(s, &end, 10);

	if (*end == 'K')
		v <<= 10;
	else if (*end == 'M')
		v <<= 20;
	return v;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

static int wait_file(const char *path)
{
	struct stat st;

	for (int i = 0; i < 500; i++) {
		if (stat(path, &st) == 0 && st.st_size > 0)
			return 0;
		sleep_ms(10);
	}
	return -1;
}

static int step(const char *arg)
{
	const char *v = arg[0] && arg[1] == ':' ? arg + 2 : "";
	CUdeviceptr d = 0;
	CUresult r;

	switch (arg[0]) {
	case 'a':
	case 'A':
	case 'm':
		if (nlive == MAX_LIVE)
			return -1;
		if (arg[0] == 'a')
			r = cuMemAlloc(&d, parse_size(v));
		else if (arg[0] == 'm')
			r = cuMemAllocManaged(&d, parse_size(v), CU_MEM_ATTACH_GLOBAL);
		else
			r = cuMemAllocAsync(&d, parse_size(v), stream);
		if (r != CUDA_SUCCESS)
			return -1;
		live[nlive++] = (struct live){.dptr = d, .stream = arg[0] == 'A' ? stream : NULL};
		return 0;
	case 'r': {
		CUDA_ARRAY_DESCRIPTOR desc = {.Width = parse_size(v), .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
		CUarray a;
		return cuArrayCreate(&a, &desc) == CUDA_SUCCESS ? 0 : -1;
	}
	case 'o':
		return cuMemAlloc(&d, parse_size(v)) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : -1;
	case 'z':
		return cuMemAlloc(&d, 0) == CUDA_ERROR_INVALID_VALUE ? 0 : -1;
	case 'h': {
		void *p = NULL;
		if (nlive == MAX_LIVE || cuMemHostAlloc(&p, parse_size(v), 0) != CUDA_SUCCESS)
			return -1;
		live[nlive++] = (struct live){.host = p};
		return 0;
	}
	case 'f': {
		int i = atoi(v);
		if (i < 0 || i >= nlive)
			return -1;
		if (live[i].host)
			r = cuMemFreeHost(live[i].host);
		else if (live[i].stream)
			r = cuMemFreeAsync(live[i].dptr, live[i].stream);
		else
			r = cuMemFree(live[i].dptr);
		return r == CUDA_SUCCESS ? 0 : -1;
	}
	case 's':
		sleep_ms(atol(v));
		return 0;
	case 'k':
		return raise(atoi(v));
	case 'w':
		return wait_file(v);
	case 'x': {
		/* As with the real driver, a fork child of an initialised
		 * process cannot use CUDA: its allocation must fail so. */
		pid_t pid = fork();
		int status;
		if (pid == 0)
			_exit(cuMemAlloc(&d, parse_size(v)) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
		return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0
		                                                                                                  : -1;
	}
	case 't': {
		FILE *f = fopen(v, "w");
		if (!f)
			return -1;
		fputs("ready\n", f);
		return fclose(f) == 0 ? 0 : -1;
	}
	default:
		return -1;
	}
}

int main(int argc, char **argv)
{
	CUdevice dev;
	CUcontext ctx;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
	    cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		fprintf(stderr, "obs_driver: no device\n");
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		if (step(argv[i]) != 0) {
			fprintf(stderr, "obs_driver: step %d '%s' failed\n", i, argv[i]);
			return 1;
		}
	}
	return 0;
}
