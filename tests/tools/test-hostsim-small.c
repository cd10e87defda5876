/* SPDX-License-Identifier: MIT */
/*
 * tests/tools/test-hostsim-small.c - the host-simulation backend on small
 * simulated devices (16 MiB and less), which emm-replay --min-capacity
 * bisects down to: init succeeds, the capacity is charged exactly, and a
 * segment past it fails with -ENOMEM.
 */
#include <errno.h>

#include "allocator/backend_loader.h"
#include "emm_test.h"

#define MIB (UINT64_C(1) << 20)

static int errors;

static void count_errors(enum emm_backend_log_level level, const char *msg)
{
	if (level >= EMM_BACKEND_LOG_ERROR) {
		fprintf(stderr, "hostsim: %s\n", msg);
		errors++;
	}
}

/* Fill a device of `capacity` with `seg`-byte segments, then one more. */
static void fill(const char *options, uint64_t capacity, uint64_t seg)
{
	const struct emm_backend *be = NULL;
	struct emm_backend_host host = {
	    .interface_version = 1,
	    .struct_size = sizeof(host),
	    .log = count_errors,
	    .options = options,
	};
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;
	uint64_t addr[64], extra = 0;
	size_t free_bytes = 0, total = 0, n = (size_t)(capacity / seg);
	void *sim = NULL;

	assert_int_eq(emm_backend_builtin_hostsim(&version, &be), 0);
	errors = 0;
	assert_int_eq(be->init(&host, 0, 0, &sim), 0);
	expect_int_eq(errors, 0);
	expect_int_eq(be->mem_info(sim, &free_bytes, &total), 0);
	expect_u64_eq(total, capacity);
	for (size_t i = 0; i < n && i < 64; i++)
		expect_int_eq(be->segment_alloc(sim, seg, 0, &addr[i]), 0);
	expect_int_eq(be->segment_alloc(sim, seg, 0, &extra), -ENOMEM);
	expect_int_eq(be->mem_info(sim, &free_bytes, NULL), 0);
	expect_u64_eq(free_bytes, capacity - n * seg);
	for (size_t i = 0; i < n && i < 64; i++)
		expect_int_eq(be->segment_free(sim, addr[i], seg, 0), 0);
	be->fini(sim, true);
}

TEST_BEGIN(test_16mib)
{
	fill("capacity=16M", 16 * MIB, 2 * MIB);
}
TEST_END

TEST_BEGIN(test_4mib_and_1mib)
{
	fill("capacity=4MiB", 4 * MIB, 2 * MIB);
	fill("capacity=1M", 1 * MIB, 512 * 1024);
}
TEST_END

TEST_BEGIN(test_odd_capacity)
{
	/* Not a multiple of 2 MiB: the last 2 MiB segment does not fit. */
	fill("capacity=7M", 7 * MIB, 2 * MIB);
}
TEST_END

int main(void)
{
	return emm_test_run(test_16mib, test_4mib_and_1mib, test_odd_capacity, NULL);
}
