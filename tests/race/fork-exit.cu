/* SPDX-License-Identifier: MIT */
/*
 * tests/race/fork-exit.cu - libemm across fork, exec and process exit.
 *
 *  (a) The parent allocates through libemm (live, cached and pending
 *      blocks), forks; the child does not touch CUDA and calls exit(0)
 *      (atexit handlers and destructors run in the child): it must exit 0.
 *      The parent's CUDA keeps working afterwards.
 *  (b) Spawn style: fork+execv and posix_spawn of this program
 *      (--child-spawned), which uses CUDA with a fresh libemm (LD_PRELOAD is
 *      inherited) and must exit 0 with its allocations served by the pool.
 *  (c) Frees after main returns, with a kernel still in flight on one of
 *      the blocks: a static object's destructor, an atexit handler registered
 *      before the first CUDA call, one registered at the end of main (runs
 *      before the runtime's teardown) and an ELF destructor of the executable
 *      (runs after every atexit handler, the runtime's teardown included)
 *      free blocks with cudaFree and cuMemFree. Nothing may crash or hang.
 *      The handler registered at the end of main must see both frees
 *      succeed; the others may only get the runtime's own
 *      cudaErrorCudartUnloading from cudaFree (that call never reaches
 *      libemm); their cuMemFree results are printed (compare with the
 *      EMM_DISABLE=1 baseline run).
 *  (d) exit() while 4 driver-API threads are in alloc/free loops: run as a
 *      child (--child-exit-under-load MS), which must exit 0 within 60 s
 *      (killed and failed otherwise); 3 timings. Driver-API threads, not
 *      runtime ones: on the H200 the static runtime's own teardown crashed
 *      (SIGSEGV inside cudart, no libemm frame) when other threads kept
 *      calling cudaMalloc during exit(), with EMM_DISABLE=1 too, so a
 *      runtime-API loop cannot tell libemm's exit safety from cudart's.
 *
 * Usage: fork-exit [--allow-no-emm]
 */
#include <cuda.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <string>
#include <thread>

#include "race_util.h"

extern char **environ;

static pid_t g_main_pid;

static size_t count_ne(const uint32_t *d, size_t n, uint32_t v)
{
	std::vector<uint32_t> h(n);
	CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
	size_t bad = 0;
	for (uint32_t x : h)
		bad += x != v;
	return bad;
}

/* Allocate, write on the GPU, check, free: CUDA works in this process. */
static bool cuda_roundtrip(const char *who)
{
	const size_t n = (1 << 20) / 4;
	uint32_t *p;
	CK(cudaMalloc((void **)&p, n * 4));
	race_fill_u32<<<128, 256>>>(p, n, 0xC0FFEEu);
	CK_LAUNCH();
	CK(cudaDeviceSynchronize());
	size_t bad = count_ne(p, n, 0xC0FFEEu);
	CK(cudaFree(p));
	if (bad)
		printf("%s: %zu wrong words\n", who, bad);
	return bad == 0;
}

/* ---- (c): late frees ----------------------------------------------------------------------- */

/* cudaMalloc'd: static destructor, atexit before CUDA init, atexit after, ELF destructor. */
static void *g_late_rt[4];
/* cuMemAlloc'd: atexit before CUDA init, atexit after, ELF destructor. */
static CUdeviceptr g_late_drv[3];
static bool g_late_armed;

static void late_report(const char *who, cudaError_t rt, int drv, bool must_succeed)
{
	const char *dn = "-";
	if (drv >= 0)
		cuGetErrorName((CUresult)drv, &dn);
	printf("late free in %s: cudaFree -> %d %s; cuMemFree -> %s (%d)\n", who, (int)rt, cudaGetErrorName(rt),
	       drv >= 0 ? dn : "not called", drv);
	fflush(stdout);
	/* cudaErrorCudartUnloading is the runtime's own answer once its teardown
	 * ran: the call never reaches the driver (or libemm). */
	bool ok = rt == cudaSuccess || (!must_succeed && rt == cudaErrorCudartUnloading);
	if (must_succeed && drv >= 0 && drv != CUDA_SUCCESS)
		ok = false;
	if (!ok) {
		printf("FAIL: late free in %s\n", who);
		fflush(stdout);
		_exit(1);
	}
}

/* Registered before the first CUDA call of main (the runtime may have
 * registered its teardown earlier, from its static constructor). */
static void late_atexit_early(void)
{
	if (getpid() != g_main_pid || !g_late_armed)
		return;
	cudaError_t e = cudaFree(g_late_rt[1]);
	CUresult r = cuMemFree(g_late_drv[0]);
	late_report("atexit handler registered before CUDA init", e, (int)r, false);
}

/* Registered at the end of main: runs before the runtime's teardown. Both
 * frees must succeed. */
static void late_atexit_last(void)
{
	if (getpid() != g_main_pid || !g_late_armed)
		return;
	cudaError_t e = cudaFree(g_late_rt[2]);
	CUresult r = cuMemFree(g_late_drv[1]);
	late_report("atexit handler registered at the end of main", e, (int)r, true);
}

/* An ELF destructor of the executable: runs from _dl_fini, after every
 * atexit handler (the runtime's teardown included), before libemm's and
 * libcuda's own destructors. */
__attribute__((destructor)) static void late_elf_destructor(void)
{
	if (getpid() != g_main_pid || !g_late_armed)
		return;
	cudaError_t e = cudaFree(g_late_rt[3]);
	CUresult r = cuMemFree(g_late_drv[2]);
	late_report("ELF destructor of the executable", e, (int)r, false);
	printf("exit path complete: no crash\n");
	fflush(stdout);
}

struct late_static {
	~late_static()
	{
		if (getpid() != g_main_pid || !g_late_armed)
			return;
		cudaError_t e = cudaFree(g_late_rt[0]);
		late_report("static object destructor", e, -1, false);
	}
};
static late_static g_late_static;

/* ---- children ------------------------------------------------------------------------------- */

static int child_spawned(void)
{
	race_require_gpu();
	bool emm = race_require_emm(true);
	struct emm_stats s0 = race_stats(0);
	bool ok = cuda_roundtrip("spawned child");
	for (int i = 0; i < 100; i++) {
		void *p;
		CK(cudaMalloc(&p, 64 << 10));
		CK(cudaFree(p));
	}
	struct emm_stats d = race_stats_delta(s0, race_stats(0));
	race_print_stats("spawned child, device 0", d);
	if (!emm) {
		printf("spawned child: libemm not loaded in the child\n");
		return 3;
	}
	if (race_emm_active() && d.allocs < 101) {
		printf("spawned child: allocations not served by the pool (%llu)\n", (unsigned long long)d.allocs);
		return 4;
	}
	return ok ? 0 : 5;
}

static std::atomic<unsigned long long> g_loops[4];

/* No CK in the loops: errors while the process exits are expected, and a
 * thread must not call exit() itself. */
static void drv_loop(int id, CUcontext ctx)
{
	cuCtxSetCurrent(ctx);
	size_t sz = 8192;
	for (;;) {
		CUdeviceptr p = 0;
		if (cuMemAlloc(&p, sz) == CUDA_SUCCESS)
			cuMemFree(p);
		sz = sz >= (2 << 20) ? 8192 : sz * 2;
		g_loops[id]++;
	}
}

static int child_exit_under_load(unsigned ms)
{
	race_require_gpu();
	CUcontext ctx;
	if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		race_fail("no current context after cudaFree(0)");
	std::thread t[4] = {std::thread(drv_loop, 0, ctx), std::thread(drv_loop, 1, ctx),
			    std::thread(drv_loop, 2, ctx), std::thread(drv_loop, 3, ctx)};
	for (auto &x : t)
		x.detach();
	usleep(ms * 1000);
	printf("exit-under-load child: exit(0) after %u ms; loops so far %llu %llu %llu %llu\n", ms,
	       (unsigned long long)g_loops[0], (unsigned long long)g_loops[1], (unsigned long long)g_loops[2],
	       (unsigned long long)g_loops[3]);
	race_print_stats("exit-under-load child, device 0", race_stats(0));
	fflush(stdout);
	exit(0);
}

/* Wait for pid up to timeout_s; kill it (that pid only) on timeout. */
static int wait_child(pid_t pid, unsigned timeout_s, const char *what)
{
	uint64_t t0 = race_now_ns();
	int status = 0;
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			break;
		if (w < 0)
			race_fail("waitpid(%s): %s", what, strerror(errno));
		if (race_now_ns() - t0 > (uint64_t)timeout_s * 1000000000ull) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			printf("FAIL: %s did not finish within %u s (hang): killed\n", what, timeout_s);
			race_fails++;
			return -1;
		}
		usleep(10000);
	}
	if (WIFSIGNALED(status)) {
		printf("FAIL: %s died of signal %d\n", what, WTERMSIG(status));
		race_fails++;
		return -1;
	}
	int code = WEXITSTATUS(status);
	printf("%s: exit %d after %.2f s\n", what, code, (double)(race_now_ns() - t0) / 1e9);
	fflush(stdout);
	return code;
}

static char g_self[4096];

static pid_t spawn_self(const char *arg1, const char *arg2, bool use_posix_spawn)
{
	char *args[4] = {g_self, (char *)arg1, (char *)arg2, NULL};
	fflush(stdout);
	fflush(stderr);
	if (use_posix_spawn) {
		pid_t pid;
		int e = posix_spawn(&pid, g_self, NULL, NULL, args, environ);
		if (e)
			race_fail("posix_spawn: %s", strerror(e));
		return pid;
	}
	pid_t pid = fork();
	if (pid < 0)
		race_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		execv(g_self, args);
		_exit(127);
	}
	return pid;
}

int main(int argc, char **argv)
{
	g_main_pid = getpid();
	ssize_t n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
	if (n <= 0)
		race_fail("readlink /proc/self/exe");
	g_self[n] = 0;

	if (argc >= 2 && std::string(argv[1]) == "--child-spawned")
		return child_spawned();
	if (argc >= 3 && std::string(argv[1]) == "--child-exit-under-load")
		return child_exit_under_load((unsigned)atoi(argv[2]));
	bool allow_no_emm = argc >= 2 && std::string(argv[1]) == "--allow-no-emm";
	if (argc >= 2 && !allow_no_emm) {
		fprintf(stderr, "usage: fork-exit [--allow-no-emm]\n");
		return 2;
	}

	/* (c) part 1: registered before the first CUDA call. */
	atexit(late_atexit_early);

	race_require_gpu();
	race_require_emm(allow_no_emm);
	bool active = race_emm_active();
	printf("fork-exit: libemm %s, EMM_FREE_MODE=%s\n", active ? "active" : "not active (baseline)",
	       race_free_mode());

	/* ---- (a) fork; the child exits without touching CUDA --------------------------------- */
	struct emm_stats s0 = race_stats(0);
	const size_t nb = (256 << 10) / 4;
	uint32_t *live[4];
	for (int i = 0; i < 4; i++) {
		CK(cudaMalloc((void **)&live[i], nb * 4));
		race_fill_u32<<<64, 256>>>(live[i], nb, 0xA0A0A0A0u + i);
		CK_LAUNCH();
	}
	for (int i = 0; i < 8; i++) { /* cached and (while the kernels run) pending blocks */
		void *p;
		CK(cudaMalloc(&p, 128 << 10));
		race_fill_u32<<<64, 256>>>((uint32_t *)p, (128 << 10) / 4, 1);
		CK(cudaFree(p));
	}
	cudaStream_t nbs;
	CK(cudaStreamCreateWithFlags(&nbs, cudaStreamNonBlocking));
	void *ap;
	CK(cudaMallocAsync(&ap, 1 << 20, nbs));
	CK(cudaFreeAsync(ap, nbs));
	race_print_stats("parent before fork, device 0", race_stats_delta(s0, race_stats(0)));
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		race_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		/* The child: no CUDA. exit() runs handlers and destructors. */
		exit(0);
	}
	int code = wait_child(pid, 60, "(a) forked child calling exit(0) without CUDA");
	race_check(code == 0, "(a) forked child exited %d", code);
	pid = fork();
	if (pid == 0) {
		/* Same, with libemm's query API touched in the child. */
		struct emm_stats cs = race_stats(0);
		(void)cs;
		exit(0);
	}
	code = wait_child(pid, 60, "(a) forked child reading emm_stats, then exit(0)");
	race_check(code == 0, "(a) forked child (stats) exited %d", code);

	CK(cudaDeviceSynchronize());
	for (int i = 0; i < 4; i++) {
		size_t bad = count_ne(live[i], nb, 0xA0A0A0A0u + i);
		race_check(bad == 0, "(a) parent block %d changed across fork (%zu words)", i, bad);
		CK(cudaFree(live[i]));
	}
	race_check(cuda_roundtrip("(a) parent after fork"), "(a) parent CUDA broken after fork");
	CK(cudaStreamDestroy(nbs));
	struct emm_stats s1 = race_stats(0);
	race_print_stats("parent after fork, device 0", race_stats_delta(s0, s1));
	if (active)
		race_check(race_stats_delta(s0, s1).allocs >= 14, "(a) parent allocations not served by the pool");

	/* ---- (b) spawn-style children with a fresh libemm -------------------------------------- */
	pid = spawn_self("--child-spawned", NULL, false);
	code = wait_child(pid, 60, "(b) fork+exec child using CUDA");
	race_check(code == 0, "(b) fork+exec child exited %d", code);
	pid = spawn_self("--child-spawned", NULL, true);
	code = wait_child(pid, 60, "(b) posix_spawn child using CUDA");
	race_check(code == 0, "(b) posix_spawn child exited %d", code);
	race_check(cuda_roundtrip("(b) parent after the children"), "(b) parent CUDA broken after spawning");

	/* ---- (d) exit() while 4 threads allocate and free ------------------------------------------ */
	const unsigned delays[3] = {20, 150, 600};
	for (unsigned d : delays) {
		char arg[32];
		snprintf(arg, sizeof(arg), "%u", d);
		char what[96];
		snprintf(what, sizeof(what), "(d) exit() under 4 allocating threads after %u ms", d);
		pid = spawn_self("--child-exit-under-load", arg, false);
		code = wait_child(pid, 60, what);
		race_check(code == 0, "%s: exit %d", what, code);
	}

	/* ---- (c) arm the late frees ------------------------------------------------------------------ */
	for (int i = 0; i < 4; i++)
		CK(cudaMalloc(&g_late_rt[i], (64 << 10) << i));
	CUcontext ctx;
	if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		race_fail("no current context");
	for (int i = 0; i < 3; i++) {
		CUresult r = cuMemAlloc(&g_late_drv[i], (32 << 10) << i);
		if (r != CUDA_SUCCESS)
			race_fail("cuMemAlloc -> %d", (int)r);
	}
	/* Work in flight on the blocks when main returns. */
	race_fill_u32<<<64, 256>>>((uint32_t *)g_late_rt[0], (64 << 10) / 4, 9);
	CK_LAUNCH();
	atexit(late_atexit_last);
	g_late_armed = true;
	race_print_stats("parent at the end of main, device 0", race_stats(0));

	if (race_fails) {
		printf("%d check(s) failed\n", race_fails);
		g_late_armed = false;
		return 1;
	}
	printf("main returns 0; the late frees follow\n");
	fflush(stdout);
	return 0;
}
