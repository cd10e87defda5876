/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_exit_load.c - exit() while other threads allocate
 * and free through libemm (run with LD_PRELOAD=libemm.so over the
 * test-double driver).
 *
 * The parent runs itself as a child (posix_spawn) many times, each under a
 * timeout, and requires every child to exit 0: no crash, no hang. A child
 * initialises libemm (without a heap yet), registers an atexit handler the
 * way a CUDA runtime registers its teardown when it initialises (after
 * libemm: cudart's own cuGetProcAddress calls initialise us), starts eight
 * threads looping over the pool (six cuMemAlloc/cuMemFree of varying sizes,
 * one pinned cuMemAllocHost/cuMemFreeHost, one cuMemAllocAsync/
 * cuMemFreeAsync on a non-blocking stream with a stream capture now and
 * then, so the graph quarantine is busy too), waits a few milliseconds and
 * calls exit(0). The "runtime teardown" resets the primary context through
 * libemm's shim while the threads keep going: after exit has begun libemm
 * must not free or invalidate anything they use. Variants add EMM_STATS=1
 * (the table is printed while the threads run) and EMM_LOG (the trace is
 * flushed and closed at exit).
 *
 * A "late" child registers the teardown after the threads made the heap,
 * so it runs before libemm's exit handler: libemm then sees an ordinary
 * context reset while other threads are inside the heap, and must wait for
 * them before dropping it (the heap guard). A "reset" child does that
 * without exiting: the main thread resets the primary context 200 times,
 * through libemm's shim and behind its back, while the threads allocate.
 *
 *   test_shims_exit_load                 the parent (the meson test)
 *   test_shims_exit_load child MS        one child
 *   test_shims_exit_load late MS         teardown registered late
 *   test_shims_exit_load reset           resets under load, no exit
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shims_common.h"

extern char **environ;

#define NDEVICE 6 /* device_loop threads */

static atomic_uint_fast64_t loops[NDEVICE + 2];
static CUcontext g_ctx;
static atomic_bool stop;

/* arg: the thread's index; sizes vary from 4 KiB to 4 MiB. */
static void *device_loop(void *arg)
{
	size_t size = (size_t)4096 << ((uintptr_t)arg % 6);

	(void)cuCtxSetCurrent(g_ctx);
	for (unsigned i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
		CUdeviceptr d[4] = {0};
		for (int j = 0; j < 4; j++)
			if (cuMemAlloc(&d[j], size + (size_t)(i % 7) * 4096) != CUDA_SUCCESS)
				d[j] = 0;
		for (int j = 0; j < 4; j++)
			if (d[j])
				(void)cuMemFree(d[j]);
		size = size >= ((size_t)4 << 20) ? 4096 : size * 2;
		atomic_fetch_add(&loops[(uintptr_t)arg % NDEVICE], 1);
	}
	return NULL;
}

static void *pinned_loop(void *arg)
{
	(void)arg;
	(void)cuCtxSetCurrent(g_ctx);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		void *p = NULL;
		if (cuMemAllocHost(&p, 8192) == CUDA_SUCCESS)
			(void)cuMemFreeHost(p);
		atomic_fetch_add(&loops[NDEVICE], 1);
	}
	return NULL;
}

static void *async_loop(void *arg)
{
	CUstream s = NULL;

	(void)arg;
	(void)cuCtxSetCurrent(g_ctx);
	(void)cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	for (unsigned i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
		CUdeviceptr d = 0, e = 0;
		CUgraph graph = NULL;
		CUgraphExec exec = NULL;

		if (cuMemAllocAsync(&d, 65536, s) == CUDA_SUCCESS)
			(void)cuMemFreeAsync(d, s);
		if (i % 16 == 0 && cuMemAlloc(&e, 16384) == CUDA_SUCCESS) {
			/* A block freed during a capture: quarantined, then
			 * released when the graph and its exec go. */
			if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS) {
				(void)cuMemFree(e);
				if (cuStreamEndCapture(s, &graph) == CUDA_SUCCESS && graph) {
					if (cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS)
						(void)cuGraphExecDestroy(exec);
					(void)cuGraphDestroy(graph);
				}
			} else {
				(void)cuMemFree(e);
			}
		}
		atomic_fetch_add(&loops[NDEVICE + 1], 1);
	}
	return NULL;
}

static CUdeviceptr late_block;

/* What a runtime's teardown does at exit: the primary context goes. Our
 * heap must stay (the threads still use it), so a late free of one of its
 * blocks still succeeds (without the driver). */
static void runtime_teardown(void)
{
	(void)cuDevicePrimaryCtxReset(0);
	(void)cuDevicePrimaryCtxRelease(0);
	if (cuMemFree(late_block) != CUDA_SUCCESS) {
		fprintf(stderr, "late free after the runtime's teardown failed: libemm dropped its heap during exit\n");
		_exit(30);
	}
}

/* The teardown registered after libemm's last registration: it runs first. */
static void runtime_teardown_late(void)
{
	(void)cuDevicePrimaryCtxReset(0);
	(void)cuDevicePrimaryCtxRelease(0);
}

static int start_threads(pthread_t *threads)
{
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	if (!threads)
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (uintptr_t i = 0; i < NDEVICE + 2; i++) {
		pthread_t t;
		void *(*fn)(void *) = i < NDEVICE ? device_loop : i == NDEVICE ? pinned_loop : async_loop;
		if (pthread_create(&t, &attr, fn, (void *)i))
			return -1;
		if (threads)
			threads[i] = t;
	}
	/* Every thread is in its loop before the clock starts. */
	for (int i = 0; i < NDEVICE + 2; i++)
		while (atomic_load(&loops[i]) == 0)
			sched_yield();
	return 0;
}

static int child(unsigned ms, bool late)
{
	size_t free_b = 0, total_b = 0;

	g_ctx = shims_setup();
	/* libemm initialises here (no heap yet) ... */
	if (cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS)
		return 20;
	/* ... and the "runtime" registers its teardown after it. */
	if (!late)
		atexit(runtime_teardown);
	if (cuMemAlloc(&late_block, 4096) != CUDA_SUCCESS)
		return 22;
	if (start_threads(NULL) < 0)
		return 21;
	if (late)
		atexit(runtime_teardown_late);
	if (ms)
		usleep(ms * 1000);
	exit(0);
}

/* Resets under load (no exit): libemm must never free a heap another
 * thread is inside. The threads' errors while the context is down are the
 * driver's business. */
static int reset_under_load(void)
{
	pthread_t threads[NDEVICE + 2];
	CUcontext c;

	g_ctx = shims_setup();
	if (start_threads(threads) < 0)
		return 21;
	for (int i = 0; i < 200; i++) {
		if (i % 2) {
			if (fakecuda_device_reset(0, 1) != 0)
				return 23;
		} else {
			if (cuDevicePrimaryCtxReset(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS)
				return 24;
		}
		usleep(200);
	}
	atomic_store(&stop, true);
	for (int i = 0; i < NDEVICE + 2; i++)
		pthread_join(threads[i], NULL);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A copy of the environment (calloc'd; the strings are shared) without
 * the variables that start with `drop` (NULL: none), with `extra` added
 * (NULL: none); NULL without memory. */
static char **env_with(const char *drop, const char *extra)
{
	size_t n = 0, k = 0;
	char **envp;

	while (environ[n])
		n++;
	envp = calloc(n + 2, sizeof(*envp));
	if (!envp)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!drop || strncmp(environ[i], drop, strlen(drop)) != 0)
			envp[k++] = environ[i];
	envp[k] = (char *)extra;
	return envp;
}

/* The stacks of every thread of a hung child, on stderr, where gdb is
 * installed (it runs without the preload: the environment minus
 * LD_PRELOAD); a missing gdb is said so. */
static void dump_stacks(pid_t pid)
{
	char pidarg[32];
	char *argv[] = {"gdb", "-nx", "-batch", "-p", pidarg, "-ex", "thread apply all bt", NULL};
	char **envp = env_with("LD_PRELOAD=", NULL);
	pid_t g;
	int status, e;

	if (!envp)
		return;
	snprintf(pidarg, sizeof(pidarg), "%d", (int)pid);
	e = posix_spawnp(&g, "gdb", NULL, NULL, argv, envp);
	free(envp);
	if (e) {
		fprintf(stderr, "(no gdb here: no stacks of the hung child)\n");
		return;
	}
	waitpid(g, &status, 0);
}

/* Run one child; 0 if it exited 0 within the timeout. */
static int run_child(const char *self, const char *mode, unsigned ms, const char *extra_env)
{
	char arg[16];
	char *argv[4];
	char **envp = env_with(NULL, extra_env);
	pid_t pid;
	int status = 0, e;
	double t0;

	if (!envp)
		return -1;
	snprintf(arg, sizeof(arg), "%u", ms);
	argv[0] = (char *)self;
	argv[1] = (char *)mode;
	argv[2] = arg;
	argv[3] = NULL;
	e = posix_spawn(&pid, self, NULL, NULL, argv, envp);
	free(envp);
	if (e) {
		fprintf(stderr, "posix_spawn: %s\n", strerror(e));
		return -1;
	}
	t0 = now_s();
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			break;
		if (w < 0) {
			perror("waitpid");
			return -1;
		}
		if (now_s() - t0 > 30.0) {
			fprintf(stderr, "%s child (exit after %u ms, %s) hung: its threads' stacks follow\n", mode, ms,
			        extra_env ? extra_env : "-");
			dump_stacks(pid);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			fprintf(stderr, "%s child (exit after %u ms, %s) hung: killed\n", mode, ms,
			        extra_env ? extra_env : "-");
			return -1;
		}
		usleep(1000);
	}
	if (WIFSIGNALED(status)) {
		fprintf(stderr, "%s child (exit after %u ms, %s) died of signal %d\n", mode, ms,
		        extra_env ? extra_env : "-", WTERMSIG(status));
		return -1;
	}
	if (WEXITSTATUS(status) != 0) {
		fprintf(stderr, "%s child (exit after %u ms, %s) exited %d\n", mode, ms,
		        extra_env ? extra_env : "-", WEXITSTATUS(status));
		return -1;
	}
	return 0;
}

/* Every delay and variant is run this many times; a sanitized child runs
 * several times slower (ThreadSanitizer's over two minutes for 12), so the
 * sanitized passes repeat each one less often. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EXIT_LOAD_REPS 3
#else
#define EXIT_LOAD_REPS 12
#endif

int main(int argc, char **argv)
{
	static const unsigned delays[] = {0, 1, 3, 10};
	char self[4096], log_env[4200];
	const char *variants[3];
	int failed = 0, runs = 0;
	ssize_t len;

	/* A child lets the parent's gdb attach if it hangs (Yama's ptrace
	 * scope allows only ancestors otherwise; without Yama this fails). */
	if (argc >= 2)
		(void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	if (argc == 3 && strcmp(argv[1], "child") == 0)
		return child((unsigned)atoi(argv[2]), false);
	if (argc == 3 && strcmp(argv[1], "late") == 0)
		return child((unsigned)atoi(argv[2]), true);
	if (argc >= 2 && strcmp(argv[1], "reset") == 0)
		return reset_under_load();
	len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (len <= 0)
		return 2;
	self[len] = '\0';
	snprintf(log_env, sizeof(log_env), "EMM_LOG=/tmp/emm-exit-load-%d.csv", (int)getpid());
	variants[0] = NULL;
	variants[1] = "EMM_STATS=1";
	variants[2] = log_env;
	for (int rep = 0; rep < EXIT_LOAD_REPS; rep++)
		for (size_t d = 0; d < sizeof(delays) / sizeof(delays[0]); d++)
			for (int v = 0; v < 3; v++) {
				runs += 2;
				failed += run_child(self, "child", delays[d], variants[v]) != 0;
				failed += run_child(self, "late", delays[d], variants[v]) != 0;
			}
	for (int rep = 0; rep < 4; rep++) {
		runs++;
		failed += run_child(self, "reset", 0, NULL) != 0;
	}
	unlink(log_env + strlen("EMM_LOG="));
	printf("%d children, %d failed\n", runs, failed);
	printf("%d passed, %d failed, 0 skipped\n", failed ? 0 : 1, failed ? 1 : 0);
	return failed ? 1 : 0;
}
