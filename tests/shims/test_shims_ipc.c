/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_ipc.c - legacy IPC of blocks inside libemm's
 * segments between processes, over the test-double driver (whose IPC maps
 * the exporter's memory into the importer: tests/fakecuda/fake_mem.c).
 *
 * The program re-runs itself with EMM_IPC_DIR set to a fresh directory
 * (the registry of this test only), exports blocks and starts importers
 * with fork+exec of itself in a child mode:
 *   import N HANDLE SIZE OFFSET SEED ...  under libemm: open, check bytes,
 *                      ranges, reopen, write, close; steered over stdin
 *   plain SUB WHOLE SIZE SEED   without libemm (LD_PRELOAD unset): the
 *                      sub-block's handle fails, the whole segment's opens
 *   export-exit        export a sub-block and a whole segment, print their
 *                      handles, exit
 *   fill N             export N blocks, print how many succeeded, wait
 *                      for a line on stdin, exit
 *   export1            export one sub-block: print the CUresult
 *   hold HANDLE        open a handle, print "opened <CUresult>", wait for a
 *                      line on stdin, exit without closing
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emm_test.h"
#include "ipc_test.h"
#include "shims_common.h"

#define NBLK 4
#define WHOLE_SIZE ((size_t)12 << 20)

static const size_t blk_size[NBLK] = {4096, 1000, 8192, 512};

/* --- helpers ------------------------------------------------------------- */

static void fill(CUdeviceptr d, size_t n, unsigned seed)
{
	unsigned char *buf = malloc(n);
	for (size_t i = 0; i < n; i++)
		buf[i] = ipc_pattern(seed, i);
	if (cuMemcpyHtoD(d, buf, n) != CUDA_SUCCESS)
		abort();
	free(buf);
}

/* 0 if the device bytes follow pattern seed. */
static int check(CUdeviceptr d, size_t n, unsigned seed)
{
	unsigned char *buf = malloc(n);
	int bad = cuMemcpyDtoH(buf, d, n) != CUDA_SUCCESS;
	for (size_t i = 0; i < n && !bad; i++)
		bad = buf[i] != ipc_pattern(seed, i);
	free(buf);
	return bad;
}

static int child_line(struct ipc_child *c, char *buf, size_t n)
{
	if (!fgets(buf, (int)n, c->out)) {
		buf[0] = '\0';
		return -1;
	}
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

static int child_wait(struct ipc_child *c)
{
	int status = 0;

	fclose(c->in);
	fclose(c->out);
	if (waitpid(c->pid, &status, 0) != c->pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A fresh registry directory under EMM_IPC_DIR (for the children). */
static void sub_dir(char *out, size_t n, const char *name)
{
	snprintf(out, n, "%s/%s", getenv("EMM_IPC_DIR"), name);
	mkdir(out, 0700);
}

/* --- child modes ----------------------------------------------------------- */

#define CHILD_CHECK(c)                                                                                       \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "child %s: %s:%d: %s\n", mode, __FILE__, __LINE__, #c);              \
			return 1;                                                                            \
		}                                                                                            \
	} while (0)

/* Threads opening and closing one handle at once: always one pointer. */
struct opener {
	CUcontext ctx;
	CUipcMemHandle h;
	CUdeviceptr want;
	int bad;
};

static void *open_close_loop(void *arg)
{
	struct opener *o = arg;
	CUdeviceptr p[20];

	cuCtxSetCurrent(o->ctx);
	for (int round = 0; round < 10; round++) {
		for (int i = 0; i < 20; i++)
			if (cuIpcOpenMemHandle(&p[i], o->h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS ||
			    p[i] != o->want)
				o->bad++;
		for (int i = 0; i < 20; i++)
			if (cuIpcCloseMemHandle(o->want) != CUDA_SUCCESS)
				o->bad++;
	}
	return NULL;
}

/* A thread with no current context opens an open handle: the driver's
 * answer, CUDA_ERROR_INVALID_CONTEXT (not another context's mapping). */
static void *open_without_context(void *arg)
{
	CUdeviceptr p = 0;

	return (void *)(intptr_t)cuIpcOpenMemHandle(&p, *(const CUipcMemHandle *)arg,
	                                            CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

/* import N (HANDLE SIZE OFFSET SEED){N} */
static int mode_import(int argc, char **argv)
{
	const char *mode = "import";
	CUdeviceptr p[NBLK], again, base;
	CUipcMemHandle h[NBLK];
	size_t size[NBLK], off[NBLK], range;
	unsigned seed[NBLK];
	char line[64];
	int n = atoi(argv[2]);

	CHILD_CHECK(n == NBLK && argc == 3 + 4 * n);
	shims_setup();
	for (int i = 0; i < n; i++) {
		ipc_from_hex(argv[3 + 4 * i], &h[i]);
		size[i] = strtoul(argv[4 + 4 * i], NULL, 0);
		off[i] = strtoul(argv[5 + 4 * i], NULL, 0);
		seed[i] = (unsigned)atoi(argv[6 + 4 * i]);
		CHILD_CHECK(cuIpcOpenMemHandle(&p[i], h[i], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
		/* the block's first byte, its bytes, its range as the exporter
		 * answers it (base + offset) */
		CHILD_CHECK(check(p[i], size[i], seed[i]) == 0);
		CHILD_CHECK(cuMemGetAddressRange(&base, &range, p[i] + size[i] - 1) == CUDA_SUCCESS);
		CHILD_CHECK(base == p[i] && range == size[i]);
		CUdeviceptr start = 0;
		CHILD_CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p[i] + 1) ==
		            CUDA_SUCCESS);
		CHILD_CHECK(start == p[i]);
	}
	/* Blocks of one segment lie as they lie in the exporter. */
	for (int i = 1; i < n; i++)
		CHILD_CHECK(p[i] - p[0] == off[i] - off[0]);
	/* The same handle again: the same pointer, one more reference. */
	CHILD_CHECK(cuIpcOpenMemHandle(&again, h[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
	CHILD_CHECK(again == p[0]);
	pthread_t nc;
	void *ncr = NULL;
	CHILD_CHECK(pthread_create(&nc, NULL, open_without_context, &h[0]) == 0);
	pthread_join(nc, &ncr);
	CHILD_CHECK((intptr_t)ncr == CUDA_ERROR_INVALID_CONTEXT);
	/* Four threads open and close block 3 at once (block 3 stays open). */
	struct opener op[4];
	pthread_t th[4];
	CUcontext ctx;
	CHILD_CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
	for (int t = 0; t < 4; t++) {
		op[t] = (struct opener){.ctx = ctx, .h = h[3], .want = p[3]};
		CHILD_CHECK(pthread_create(&th[t], NULL, open_close_loop, &op[t]) == 0);
	}
	for (int t = 0; t < 4; t++) {
		pthread_join(th[t], NULL);
		CHILD_CHECK(op[t].bad == 0);
	}
	CHILD_CHECK(check(p[3], size[3], seed[3]) == 0);
	/* Write block 1 for the exporter to see. */
	fill(p[1], size[1], seed[1] + 100);
	printf("written\n");
	fflush(stdout);
	/* The exporter frees every block and gives its idle memory back. */
	CHILD_CHECK(fgets(line, sizeof(line), stdin) && strncmp(line, "freed", 5) == 0);
	/* The segment stays alive: the bytes are still there. */
	for (int i = 2; i < n; i++)
		CHILD_CHECK(check(p[i], size[i], seed[i]) == 0);
	CHILD_CHECK(check(p[1], size[1], seed[1] + 100) == 0);
	/* Close: twice for block 0, then once too often. */
	CHILD_CHECK(cuIpcCloseMemHandle(p[0]) == CUDA_SUCCESS);
	CHILD_CHECK(check(p[0], size[0], seed[0]) == 0);
	CHILD_CHECK(cuIpcCloseMemHandle(p[0]) == CUDA_SUCCESS);
	CHILD_CHECK(cuIpcCloseMemHandle(p[0]) == CUDA_ERROR_INVALID_VALUE);
	/* The other blocks still read. */
	CHILD_CHECK(check(p[3], size[3], seed[3]) == 0);
	for (int i = 1; i < n; i++)
		CHILD_CHECK(cuIpcCloseMemHandle(p[i]) == CUDA_SUCCESS);
	/* Everything closed: the mapping is gone, the driver answers. */
	CHILD_CHECK(cuIpcCloseMemHandle(p[1]) == CUDA_ERROR_INVALID_VALUE);
	/* Opened again after all closes: a fresh mapping, the same bytes. */
	CHILD_CHECK(cuIpcOpenMemHandle(&again, h[3], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
	CHILD_CHECK(check(again, size[3], seed[3]) == 0);
	CHILD_CHECK(cuIpcCloseMemHandle(again) == CUDA_SUCCESS);
	printf("done\n");
	return 0;
}

/* plain SUB WHOLE SIZE SEED: no libemm here. */
static int mode_plain(int argc, char **argv)
{
	const char *mode = "plain";
	CUipcMemHandle sub, whole;
	CUdeviceptr p = 0;

	CHILD_CHECK(argc == 6);
	CHILD_CHECK(dlsym(RTLD_DEFAULT, "emm_stats_get") == NULL);
	shims_setup();
	ipc_from_hex(argv[2], &sub);
	ipc_from_hex(argv[3], &whole);
	CUresult r = cuIpcOpenMemHandle(&p, sub, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	printf("sub %d\n", (int)r);
	/* Never the segment's bytes: the driver refuses the libemm handle. */
	CHILD_CHECK(r == CUDA_ERROR_INVALID_VALUE);
	CHILD_CHECK(cuIpcOpenMemHandle(&p, whole, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
	CHILD_CHECK(check(p, strtoul(argv[4], NULL, 0), (unsigned)atoi(argv[5])) == 0);
	CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
	return 0;
}

static int mode_export_exit(void)
{
	CUdeviceptr a, b, w;
	CUipcMemHandle ha, hw;
	char hex[2 * CU_IPC_HANDLE_SIZE + 1];

	shims_setup();
	if (cuMemAlloc(&a, 4096) || cuMemAlloc(&b, 4096) || cuMemAlloc(&w, WHOLE_SIZE) ||
	    cuIpcGetMemHandle(&ha, b) || cuIpcGetMemHandle(&hw, w))
		return 1;
	ipc_to_hex(&ha, hex);
	printf("%s\n", hex);
	ipc_to_hex(&hw, hex);
	printf("%s\n", hex);
	return 0;
}

static int mode_fill(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[2]) : 0, ok = 0;
	char line[16];

	shims_setup();
	for (int i = 0; i < n; i++) {
		CUdeviceptr d;
		CUipcMemHandle h;
		if (cuMemAlloc(&d, 512) != CUDA_SUCCESS)
			break;
		if (cuIpcGetMemHandle(&h, d) == CUDA_SUCCESS)
			ok++;
	}
	printf("%d\n", ok);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 0;
	return 0;
}

static int mode_export1(void)
{
	CUdeviceptr a, b;
	CUipcMemHandle h;

	shims_setup();
	if (cuMemAlloc(&a, 4096) || cuMemAlloc(&b, 4096))
		return 1;
	printf("%d\n", (int)cuIpcGetMemHandle(&h, b));
	return 0;
}

static int mode_hold(int argc, char **argv)
{
	CUipcMemHandle h;
	CUdeviceptr p = 0;
	char line[16];

	if (argc != 3)
		return 2;
	shims_setup();
	ipc_from_hex(argv[2], &h);
	printf("opened %d\n", (int)cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 0;
	return 0;
}

/* --- the tests (exporter side) ------------------------------------------- */

/* Start a `hold` child on handle h: the CUresult its open gave. */
static int hold(struct ipc_child *c, const CUipcMemHandle *h)
{
	char hex[2 * CU_IPC_HANDLE_SIZE + 1], line[64];
	char *argv[] = {NULL, "hold", hex, NULL};

	ipc_to_hex(h, hex);
	ipc_spawn(c, true, NULL, argv);
	if (child_line(c, line, sizeof(line)) != 0 || strncmp(line, "opened ", 7) != 0)
		return -1;
	return atoi(line + 7);
}

TEST_BEGIN(test_blocks_shared_with_a_libemm_importer)
{
	CUdeviceptr d[NBLK];
	CUipcMemHandle h[NBLK], again;
	char hex[NBLK][2 * CU_IPC_HANDLE_SIZE + 1], sz[NBLK][32], off[NBLK][32], seed[NBLK][16], line[64];
	char *argv[3 + 4 * NBLK + 1] = {NULL, "import", "4"};
	struct fakecuda_stats f0, f1, f2;
	struct ipc_child c;

	/* An empty pool: every block comes from one fresh small segment. */
	(void)shims_release_idle(-1, 0);
	f0 = fake_stats();
	for (int i = 0; i < NBLK; i++) {
		assert_int_eq(cuMemAlloc(&d[i], blk_size[i]), CUDA_SUCCESS);
		fill(d[i], blk_size[i], (unsigned)i + 1);
	}
	f1 = fake_stats();
	expect_int_eq(f1.device_allocs - f0.device_allocs, 1);
	for (int i = 0; i < NBLK; i++) {
		assert_int_eq(cuIpcGetMemHandle(&h[i], d[i]), CUDA_SUCCESS);
		expect_true(memcmp(h[i].reserved, "libemm-ipc-blk1", 16) == 0);
		ipc_to_hex(&h[i], hex[i]);
		snprintf(sz[i], sizeof(sz[i]), "%zu", blk_size[i]);
		snprintf(off[i], sizeof(off[i]), "%llu", (unsigned long long)(d[i] - d[0]));
		snprintf(seed[i], sizeof(seed[i]), "%d", i + 1);
		argv[3 + 4 * i] = hex[i];
		argv[4 + 4 * i] = sz[i];
		argv[5 + 4 * i] = off[i];
		argv[6 + 4 * i] = seed[i];
	}
	assert_int_eq(cuIpcGetMemHandle(&again, d[2]), CUDA_SUCCESS);
	expect_true(memcmp(&again, &h[2], sizeof(again)) == 0);

	ipc_spawn(&c, true, NULL, argv);
	expect_int_eq(child_line(&c, line, sizeof(line)), 0);
	expect_str_eq(line, "written");
	/* The importer's write is here. */
	expect_int_eq(check(d[1], blk_size[1], 102), 0);
	/* Free every block and give idle memory back: the exported segment
	 * stays allocated (the driver frees nothing). */
	for (int i = 0; i < NBLK; i++)
		assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
	(void)shims_release_idle(-1, 0);
	f2 = fake_stats();
	expect_int_eq(f2.device_frees - f1.device_frees, 0);
	fprintf(c.in, "freed\n");
	expect_int_eq(child_line(&c, line, sizeof(line)), 0);
	expect_str_eq(line, "done");
	expect_int_eq(child_wait(&c), 0);
	/* The importer closed everything and left: the retired segment goes
	 * back at the next release, and its handles no longer open. */
	expect_true(shims_release_idle(-1, 0) >= (long long)(2 << 20));
	expect_int_eq(fake_stats().device_frees - f2.device_frees, 1);
	struct ipc_child held;
	expect_int_eq(hold(&held, &h[0]), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(child_wait(&held), 0);
}
TEST_END

TEST_BEGIN(test_segment_lifetime)
{
	struct fakecuda_stats f0, f1;
	CUdeviceptr a, b;
	CUipcMemHandle ha;
	struct ipc_child c;

	/* Nobody opened it: freed and released, the segment goes at once. */
	(void)shims_release_idle(-1, 0);
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	assert_int_eq(cuIpcGetMemHandle(&ha, b), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	f0 = fake_stats();
	(void)shims_release_idle(-1, 0);
	expect_int_eq(fake_stats().device_frees - f0.device_frees, 1);
	expect_int_eq(hold(&c, &ha), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(child_wait(&c), 0);

	/* An importer holds it and is killed: its record no longer counts. */
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	assert_int_eq(cuIpcGetMemHandle(&ha, b), CUDA_SUCCESS);
	expect_int_eq(hold(&c, &ha), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	f0 = fake_stats();
	(void)shims_release_idle(-1, 0);
	f1 = fake_stats();
	expect_int_eq(f1.device_frees - f0.device_frees, 0); /* held: kept */
	kill(c.pid, SIGKILL);
	expect_int_eq(child_wait(&c), 128 + SIGKILL);
	(void)shims_release_idle(-1, 0);
	expect_int_eq(fake_stats().device_frees - f1.device_frees, 1);
}
TEST_END

TEST_BEGIN(test_importer_without_libemm)
{
	CUdeviceptr a, b, w;
	CUipcMemHandle hb, hw;
	char hexb[2 * CU_IPC_HANDLE_SIZE + 1], hexw[2 * CU_IPC_HANDLE_SIZE + 1], size[32];
	char *argv[] = {NULL, "plain", hexb, hexw, size, "9", NULL};
	char line[64];
	struct ipc_child c;

	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&w, WHOLE_SIZE), CUDA_SUCCESS);
	fill(a, 4096, 3);
	fill(b, 4096, 4);
	fill(w, WHOLE_SIZE, 9);
	assert_int_eq(cuIpcGetMemHandle(&hb, b), CUDA_SUCCESS);
	assert_int_eq(cuIpcGetMemHandle(&hw, w), CUDA_SUCCESS);
	/* The whole segment: the driver's own handle, unchanged. */
	expect_true(memcmp(hw.reserved, "FAKEIPC1", 8) == 0);
	ipc_to_hex(&hb, hexb);
	ipc_to_hex(&hw, hexw);
	snprintf(size, sizeof(size), "%zu", WHOLE_SIZE);
	ipc_spawn(&c, false, NULL, argv);
	expect_int_eq(child_line(&c, line, sizeof(line)), 0);
	expect_str_eq(line, "sub 1");
	expect_int_eq(child_wait(&c), 0);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(w), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_exporter_exit)
{
	char sub[160], whole[160];
	char *argv[] = {NULL, "export-exit", NULL};
	CUipcMemHandle hs, hw;
	CUdeviceptr p = 0;
	struct ipc_child c;

	ipc_spawn(&c, true, NULL, argv);
	expect_int_eq(child_line(&c, sub, sizeof(sub)), 0);
	expect_int_eq(child_line(&c, whole, sizeof(whole)), 0);
	expect_int_eq(child_wait(&c), 0);
	ipc_from_hex(sub, &hs);
	ipc_from_hex(whole, &hw);
	/* The exporter is gone: its libemm handle gets the driver's answer
	 * for its own handles (the fake: CUDA_ERROR_INVALID_HANDLE). */
	CUresult rw = cuIpcOpenMemHandle(&p, hw, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	expect_int_ne(rw, CUDA_SUCCESS);
	expect_int_eq(cuIpcOpenMemHandle(&p, hs, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), rw);
	expect_int_eq(p, 0);
	/* A libemm handle nobody registered: the driver's answer for a
	 * handle it never made. */
	hs.reserved[40] ^= 0x55;
	expect_int_eq(cuIpcOpenMemHandle(&p, hs, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_VALUE);
}
TEST_END

TEST_BEGIN(test_registry_full_and_reclaimed)
{
	char dir[512], line[64];
	char *fill_argv[] = {NULL, "fill", "4096", NULL};
	char *one_argv[] = {NULL, "export1", NULL};
	struct ipc_child filler, one;

	/* A registry of its own, filled by a live exporter: no room. */
	sub_dir(dir, sizeof(dir), "full");
	ipc_spawn(&filler, true, dir, fill_argv);
	expect_int_eq(child_line(&filler, line, sizeof(line)), 0);
	expect_str_eq(line, "4096");
	ipc_spawn(&one, true, dir, one_argv);
	expect_int_eq(child_line(&one, line, sizeof(line)), 0);
	expect_int_eq(atoi(line), CUDA_ERROR_NOT_SUPPORTED);
	expect_int_eq(child_wait(&one), 0);
	/* The filler exits: its slots are reclaimed. */
	fprintf(filler.in, "exit\n");
	expect_int_eq(child_wait(&filler), 0);
	ipc_spawn(&one, true, dir, one_argv);
	expect_int_eq(child_line(&one, line, sizeof(line)), 0);
	expect_int_eq(atoi(line), CUDA_SUCCESS);
	expect_int_eq(child_wait(&one), 0);
}
TEST_END

TEST_BEGIN(test_registry_file_checked)
{
	char dir[512], path[600], line[64];
	char *one_argv[] = {NULL, "export1", NULL};
	struct ipc_child one;
	int fd;

	/* Readable by others: not used, exports of sub-blocks refused. */
	sub_dir(dir, sizeof(dir), "wide");
	snprintf(path, sizeof(path), "%s/libemm-ipc-%lu", dir, (unsigned long)geteuid());
	fd = open(path, O_CREAT | O_RDWR, 0644);
	assert_true(fd >= 0);
	fchmod(fd, 0644);
	close(fd);
	ipc_spawn(&one, true, dir, one_argv);
	expect_int_eq(child_line(&one, line, sizeof(line)), 0);
	expect_int_eq(atoi(line), CUDA_ERROR_NOT_SUPPORTED);
	expect_int_eq(child_wait(&one), 0);
	unlink(path);
	/* A symbolic link: not followed. */
	sub_dir(dir, sizeof(dir), "link");
	snprintf(path, sizeof(path), "%s/libemm-ipc-%lu", dir, (unsigned long)geteuid());
	expect_int_eq(symlink("/dev/null", path), 0);
	ipc_spawn(&one, true, dir, one_argv);
	expect_int_eq(child_line(&one, line, sizeof(line)), 0);
	expect_int_eq(atoi(line), CUDA_ERROR_NOT_SUPPORTED);
	expect_int_eq(child_wait(&one), 0);
	unlink(path);
}
TEST_END

/* Remove what the run left under dir (two levels). */
static void remove_tree(const char *dir)
{
	char cmd[700];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "import"))
		return mode_import(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "plain"))
		return mode_plain(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "export-exit"))
		return mode_export_exit();
	if (argc > 1 && !strcmp(argv[1], "fill"))
		return mode_fill(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "export1"))
		return mode_export1();
	if (argc > 1 && !strcmp(argv[1], "hold"))
		return mode_hold(argc, argv);
	if (argc == 1) {
		/* A registry of this run only, set before libemm reads it. */
		char dir[] = "/tmp/emm-ipc-test-XXXXXX";
		int status;
		pid_t pid;
		if (!mkdtemp(dir))
			return 1;
		pid = fork();
		if (pid == 0) {
			setenv("EMM_IPC_DIR", dir, 1);
			execl("/proc/self/exe", "self", "run", (char *)NULL);
			_exit(127);
		}
		if (pid < 0 || waitpid(pid, &status, 0) != pid)
			status = 1 << 8;
		remove_tree(dir);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	shims_setup();
	return emm_test_run(test_blocks_shared_with_a_libemm_importer, test_segment_lifetime,
	                    test_importer_without_libemm, test_exporter_exit,
	                    test_registry_full_and_reclaimed, test_registry_file_checked, NULL);
}
