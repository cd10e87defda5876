/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_annotate_regions.c - the set of regions libemm has
 * registered with a memory checker (process/annotate_regions.c): a region
 * is unregistered only if it was registered and not already forgotten,
 * registering one twice keeps one, and a heap's going takes the regions
 * inside it (not those at its end or before it); a device going off
 * (peer access possible) takes that device's regions, not another's.
 */
#include "emm_test.h"
#include "process/annotate.h"

#define BASE UINT64_C(0x7f0000000000)

TEST_BEGIN(test_note_forget)
{
	expect_false(st_region_forget(BASE)); /* never registered */
	expect_true(st_region_note(BASE, 0));
	expect_true(st_region_note(BASE, 0)); /* again: one */
	expect_true(st_region_forget(BASE));
	expect_false(st_region_forget(BASE)); /* already forgotten */
}
TEST_END

TEST_BEGIN(test_forget_range)
{
	/* Many regions over many buckets, some in a 2 MiB heap. */
	for (uint64_t i = 0; i < 20000; i++)
		expect_true(st_region_note(BASE + i * 512, 0));
	st_region_forget_range(BASE + 4096 * 512, 2u << 20); /* [4096, 8192) x 512 */
	expect_true(st_region_forget(BASE + 4095 * 512));
	expect_false(st_region_forget(BASE + 4096 * 512));
	expect_false(st_region_forget(BASE + 8191 * 512));
	expect_true(st_region_forget(BASE + 8192 * 512));
	st_region_forget_range(BASE, 20000 * 512);
	for (uint64_t i = 0; i < 20000; i += 997)
		expect_false(st_region_forget(BASE + i * 512));
}
TEST_END

TEST_BEGIN(test_forget_device)
{
	for (uint64_t i = 0; i < 3000; i++)
		expect_true(st_region_note(BASE + i * 512, (int)(i % 3)));
	expect_u64_eq(st_regions_forget_device(-1), 0);
	expect_u64_eq(st_regions_forget_device(1), 1000);
	expect_u64_eq(st_regions_forget_device(1), 0);
	expect_false(st_region_forget(BASE + 1 * 512));
	expect_false(st_region_forget(BASE + 2998 * 512));
	expect_true(st_region_forget(BASE));
	expect_true(st_region_forget(BASE + 2997 * 512)); /* device 0 */
	expect_true(st_region_forget(BASE + 2 * 512));    /* device 2 */
	expect_u64_eq(st_regions_forget_device(0), 998);
	expect_u64_eq(st_regions_forget_device(2), 999);
}
TEST_END

/* A fork child's set is empty and usable (the parent's nodes are leaked
 * there by design, so none is left here for the leak checker). */
TEST_BEGIN(test_fork_child_starts_empty)
{
	st_regions_fork_child();
	expect_false(st_region_forget(BASE + 512));
	expect_true(st_region_note(BASE + 512, 0));
	expect_true(st_region_forget(BASE + 512));
}
TEST_END

int main(void)
{
	return emm_test_run(test_note_forget, test_forget_range, test_forget_device, test_fork_child_starts_empty, NULL);
}
