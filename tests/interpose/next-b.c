/* SPDX-License-Identifier: MIT */
/* tests/interpose/next-b.c - the definition after next-a in LD_PRELOAD. */
#define API __attribute__((visibility("default")))

API int interpose_probe(void);

API int interpose_probe(void)
{
	return 'b';
}
