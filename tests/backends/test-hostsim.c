/* SPDX-License-Identifier: MIT */
/* tests/backends/test-hostsim.c - the host-simulation backend. */
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include "allocator/backend_loader.h"
#include "emm_test.h"

#define MIB (UINT64_C(1) << 20)

static const struct emm_backend *be;

static char last_log[512];
static int warnings;

/* Counts warnings about options; a short reservation (valgrind, a small
 * RLIMIT_AS) is warned about too, and is no option problem. */
static void test_log(enum emm_backend_log_level level, const char *msg)
{
	if (level >= EMM_BACKEND_LOG_WARNING && !strstr(msg, "address space"))
		warnings++;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

static struct emm_backend_host make_host(const char *options)
{
	return (struct emm_backend_host){
	    .interface_version = 1,
	    .struct_size = sizeof(struct emm_backend_host),
	    .driver_proc = NULL,
	    .log = test_log,
	    .options = options,
	};
}

static void *make_sim(const struct emm_backend_host *host)
{
	void *state = NULL;

	if (be->init(host, 0, 0xc0ffee, &state) != 0)
		return NULL;
	return state;
}

static uint64_t alignment_for(size_t size)
{
	return size >= 2 * MIB ? 2 * MIB : 512;
}

TEST_BEGIN(test_table)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;
	const struct emm_backend *table = NULL;

	expect_int_eq(emm_backend_builtin_hostsim(&version, &table), 0);
	expect_int_eq(version, EMM_BACKEND_INTERFACE_VERSION);
	assert_ptr_not_null(table);
	expect_false(table->caps & (EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW));
	version = 1; /* an older libemm gets the same table as version 1 */
	expect_int_eq(emm_backend_builtin_hostsim(&version, &table), 0);
	expect_int_eq(version, 1);
	expect_str_eq(table->name, "hostsim");
	expect_true(table->caps & EMM_BACKEND_CAP_DEVICE);
	expect_true(table->caps & EMM_BACKEND_CAP_SIMULATED);
	expect_false(table->caps & EMM_BACKEND_CAP_IPC);
	expect_int_eq(table->struct_size, sizeof(struct emm_backend));
	version = 0;
	expect_int_eq(emm_backend_builtin_hostsim(&version, &table), -ENOTSUP);
	version = 7; /* a newer libemm */
	expect_int_eq(emm_backend_builtin_hostsim(&version, &table), 0);
	expect_int_eq(version, EMM_BACKEND_INTERFACE_VERSION);
}
TEST_END

TEST_BEGIN(test_alloc_free_reuse)
{
	struct emm_backend_host host = make_host("capacity=64M");
	void *sim = make_sim(&host);
	uint64_t a = 0, b = 0, c = 0, again = 0;

	assert_ptr_not_null(sim);
	expect_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &a), 0);
	expect_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &b), 0);
	expect_int_eq(be->segment_alloc(sim, 4096, 0, &c), 0);
	expect_true(a != 0 && b != 0 && c != 0);
	expect_true(a != b);
	expect_u64_eq(a % (2 * MIB), 0);
	expect_u64_eq(b % (2 * MIB), 0);
	expect_u64_eq(c % 512, 0);
	/* first fit: a freed range is handed out again */
	expect_int_eq(be->segment_free(sim, a, 2 * MIB, 0), 0);
	expect_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &again), 0);
	expect_u64_eq(again, a);
	/* bad frees: unknown, interior, double, wrong size, zero size */
	expect_int_eq(be->segment_free(sim, a + 512, 2 * MIB, 0), -EINVAL);
	expect_int_eq(be->segment_free(sim, 0x1000, 4096, 0), -EINVAL);
	expect_int_eq(be->segment_free(sim, b, 4 * MIB, 0), -EINVAL);
	expect_int_eq(be->segment_free(sim, b, 2 * MIB, 0), 0);
	expect_int_eq(be->segment_free(sim, b, 2 * MIB, 0), -EINVAL);
	expect_int_eq(be->segment_alloc(sim, 0, 0, &b), -EINVAL);
	/* size rounded to 512: freeing with the asked size works */
	expect_int_eq(be->segment_free(sim, c, 4096, 0), 0);
	expect_int_eq(be->segment_alloc(sim, 1000, 0, &c), 0);
	expect_int_eq(be->segment_free(sim, c, 1000, 0), 0);
	expect_int_eq(be->segment_free(sim, again, 2 * MIB, 0), 0);
	be->fini(sim, true);
}
TEST_END

TEST_BEGIN(test_capacity)
{
	struct emm_backend_host host = make_host("capacity=64M");
	void *sim = make_sim(&host);
	uint64_t addrs[32], extra = 0;
	size_t free_bytes = 0, total = 0;

	assert_ptr_not_null(sim);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(total, 64 * MIB);
	expect_u64_eq(free_bytes, 64 * MIB);
	for (int i = 0; i < 32; i++)
		assert_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &addrs[i]), 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(free_bytes, 0);
	expect_int_eq(be->segment_alloc(sim, 512, 0, &extra), -ENOMEM);
	expect_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &extra), -ENOMEM);
	expect_u64_eq(extra, 0); /* untouched on failure */
	/* pinned host segments are not device memory */
	expect_int_eq(be->host_segment_alloc(sim, 2 * MIB, 0, &extra), 0);
	expect_int_eq(be->segment_free(sim, extra, 2 * MIB, 0), -EINVAL);
	expect_int_eq(be->host_segment_free(sim, addrs[0], 2 * MIB), -EINVAL);
	expect_int_eq(be->host_segment_free(sim, extra, 2 * MIB), 0);

	expect_int_eq(be->segment_free(sim, addrs[5], 2 * MIB, 0), 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, NULL), 0);
	expect_u64_eq(free_bytes, 2 * MIB);
	expect_int_eq(be->segment_alloc(sim, 4 * MIB, 0, &extra), -ENOMEM);
	expect_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &addrs[5]), 0);
	for (int i = 0; i < 32; i++)
		expect_int_eq(be->segment_free(sim, addrs[i], 2 * MIB, 0), 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(free_bytes, 64 * MIB);
	be->fini(sim, true);
}
TEST_END

TEST_BEGIN(test_options)
{
	static const struct {
		const char *options;
		uint64_t total;
		int warnings;
	} cases[] = {
	    {"", UINT64_C(80) << 30, 0},
	    {"capacity=1G", UINT64_C(1) << 30, 0},
	    {"capacity=1GiB", UINT64_C(1) << 30, 0},
	    {"capacity=512m", 512 * MIB, 0},
	    {"capacity=100000000", 100000000, 0},
	    {" capacity=3G , ", UINT64_C(3) << 30, 0},
	    {"capacity=lots", UINT64_C(80) << 30, 1},
	    {"capacity=0", UINT64_C(80) << 30, 1},
	    {"capacity=1Q", UINT64_C(80) << 30, 1},
	    {"capacity=99999999999999999999", UINT64_C(80) << 30, 1},
	    {"colour=blue,capacity=2G", UINT64_C(2) << 30, 1},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct emm_backend_host host = make_host(cases[i].options);
		size_t free_bytes = 0, total = 0;
		void *sim;

		warnings = 0;
		sim = make_sim(&host);
		assert_ptr_not_null(sim);
		expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
		if (total != cases[i].total || warnings != cases[i].warnings)
			emm_test_fail_("options \"%s\": total %zu, %d warnings (last: %s)", cases[i].options,
			               total, warnings, last_log);
		be->fini(sim, true);
	}
	/* NULL options and a NULL log are fine too */
	{
		struct emm_backend_host host = make_host(NULL);
		void *sim;

		host.log = NULL;
		sim = make_sim(&host);
		assert_ptr_not_null(sim);
		be->fini(sim, true);
	}
}
TEST_END

struct seg {
	uint64_t addr;
	size_t size;
};

static int cmp_seg(const void *a, const void *b)
{
	const struct seg *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Random sizes, random frees: live segments never overlap, are aligned,
 * and the capacity accounting comes back to zero. */
TEST_BEGIN(test_random_no_overlap)
{
	enum { SLOTS = 300, OPS = 20000 };
	struct emm_backend_host host = make_host("capacity=256M");
	void *sim = make_sim(&host);
	static struct seg live[SLOTS], sorted[SLOTS];
	uint64_t rng = 0x9e3779b97f4a7c15ull, used = 0;
	size_t free_bytes, total;
	int ooms = 0;

	assert_ptr_not_null(sim);
	memset(live, 0, sizeof(live));
	for (int op = 0; op < OPS; op++) {
		struct seg *s;

		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		s = &live[rng % SLOTS];
		if (s->addr) {
			assert_int_eq(be->segment_free(sim, s->addr, s->size, 0), 0);
			used -= (s->size + 511) & ~(size_t)511;
			s->addr = 0;
		} else {
			size_t size = (rng >> 20) % 8 == 0 ? (size_t)((rng >> 24) % 16 + 1) * 2 * MIB
			                                   : (size_t)((rng >> 24) % (1 << 20)) + 1;
			int ret = be->segment_alloc(sim, size, 0, &s->addr);

			if (ret == -ENOMEM) {
				ooms++;
				s->addr = 0;
				continue;
			}
			assert_int_eq(ret, 0);
			s->size = size;
			used += (size + 511) & ~(size_t)511;
			assert_u64_eq(s->addr % alignment_for(size), 0);
		}
		if (op % 500 == 0) {
			size_t n = 0;

			for (int i = 0; i < SLOTS; i++)
				if (live[i].addr)
					sorted[n++] = live[i];
			qsort(sorted, n, sizeof(sorted[0]), cmp_seg);
			for (size_t i = 1; i < n; i++)
				assert_true(sorted[i - 1].addr + sorted[i - 1].size <= sorted[i].addr);
			assert_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
			assert_u64_eq(total - free_bytes, used);
		}
	}
	for (int i = 0; i < SLOTS; i++)
		if (live[i].addr)
			expect_int_eq(be->segment_free(sim, live[i].addr, live[i].size, 0), 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(free_bytes, total);
	fprintf(stderr, "  %d allocations refused at capacity\n", ooms);
	be->fini(sim, true);
}
TEST_END

/* The permissions of the mapping that holds addr, from /proc/self/maps
 * ("rw-p", "---p"), or "" if none does. */
static void mapping_perms(uint64_t addr, char perms[8])
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];

	perms[0] = '\0';
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		uint64_t lo, hi;
		char p[8];

		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s", &lo, &hi, p) == 3 && lo <= addr &&
		    addr < hi) {
			memcpy(perms, p, sizeof(p));
			break;
		}
	}
	fclose(f);
}

/* Simulated memory is never touched: it is not even mapped accessible, so
 * a stray access through a simulated pointer faults at once. */
TEST_BEGIN(test_never_touched)
{
	struct emm_backend_host host = make_host("capacity=64M");
	void *sim = make_sim(&host);
	uint64_t addr = 0, small = 0;
	char perms[8];

	assert_ptr_not_null(sim);
	assert_int_eq(be->segment_alloc(sim, 2 * MIB, 0, &addr), 0);
	assert_int_eq(be->host_segment_alloc(sim, 4096, 0, &small), 0);
	mapping_perms(addr, perms);
	expect_str_eq(perms, "---p");
	mapping_perms(addr + 2 * MIB - 1, perms);
	expect_str_eq(perms, "---p");
	mapping_perms(small, perms);
	expect_str_eq(perms, "---p");
	expect_int_eq(be->segment_free(sim, addr, 2 * MIB, 0), 0);
	expect_int_eq(be->host_segment_free(sim, small, 4096), 0);
	be->fini(sim, true);
	/* fini gives the reservation back */
	mapping_perms(addr, perms);
	expect_str_eq(perms, "");
}
TEST_END

/* Two instances (two simulated devices) never hand out the same address. */
TEST_BEGIN(test_instances_disjoint)
{
	struct emm_backend_host host = make_host("capacity=64M");
	void *s1 = make_sim(&host), *s2 = make_sim(&host);
	uint64_t a[32], b[32];

	assert_ptr_not_null(s1);
	assert_ptr_not_null(s2);
	for (int i = 0; i < 32; i++) {
		assert_int_eq(be->segment_alloc(s1, 2 * MIB, 0, &a[i]), 0);
		assert_int_eq(be->segment_alloc(s2, 2 * MIB, 0, &b[i]), 0);
	}
	for (int i = 0; i < 32; i++)
		for (int j = 0; j < 32; j++)
			expect_true(a[i] + 2 * MIB <= b[j] || b[j] + 2 * MIB <= a[i]);
	be->fini(s1, true);
	be->fini(s2, true);
}
TEST_END

struct worker_arg {
	void *sim;
	struct seg segs[200];
	int errors;
};

static void *alloc_worker(void *p)
{
	struct worker_arg *w = p;

	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < 200; i++) {
			w->segs[i].size = (size_t)(i % 5 + 1) * 512 * 1024;
			if (be->segment_alloc(w->sim, w->segs[i].size, 0, &w->segs[i].addr) != 0)
				w->errors++;
		}
		if (round == 19)
			break;
		for (int i = 0; i < 200; i++)
			if (be->segment_free(w->sim, w->segs[i].addr, w->segs[i].size, 0) != 0)
				w->errors++;
	}
	return NULL;
}

TEST_BEGIN(test_threads)
{
	enum { T = 4 };
	struct emm_backend_host host = make_host("capacity=4G");
	void *sim = make_sim(&host);
	static struct worker_arg args[T];
	static struct seg all[T * 200];
	pthread_t threads[T];
	size_t n = 0, free_bytes, total;

	assert_ptr_not_null(sim);
	for (int t = 0; t < T; t++) {
		args[t] = (struct worker_arg){.sim = sim};
		assert_int_eq(pthread_create(&threads[t], NULL, alloc_worker, &args[t]), 0);
	}
	for (int t = 0; t < T; t++) {
		pthread_join(threads[t], NULL);
		expect_int_eq(args[t].errors, 0);
		for (int i = 0; i < 200; i++)
			all[n++] = args[t].segs[i];
	}
	qsort(all, n, sizeof(all[0]), cmp_seg);
	for (size_t i = 1; i < n; i++)
		expect_true(all[i - 1].addr + all[i - 1].size <= all[i].addr);
	for (size_t i = 0; i < n; i++)
		expect_int_eq(be->segment_free(sim, all[i].addr, all[i].size, 0), 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(free_bytes, total);
	be->fini(sim, true);
}
TEST_END

int main(void)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;

	if (emm_backend_builtin_hostsim(&version, &be) != 0)
		return 1;
	return emm_test_run(test_table, test_alloc_free_reuse, test_capacity, test_options,
	                    test_random_no_overlap, test_never_touched, test_instances_disjoint, test_threads,
	                    NULL);
}
