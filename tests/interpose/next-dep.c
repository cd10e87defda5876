/* SPDX-License-Identifier: MIT */
/* tests/interpose/next-dep.c - a dependency of next-local, so only in
 * next-local's local scope when next-local is opened with RTLD_LOCAL. */
#define API __attribute__((visibility("default")))

API int dep_only_symbol(void);

API int dep_only_symbol(void)
{
	return 42;
}
