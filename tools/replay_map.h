/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_map.h - a uint64 -> uint32 hash map (linear probing,
 * backward-shift deletion) for emm-replay: thread ids, stream values and
 * live traced pointers. Single-threaded; grows by doubling.
 */
#ifndef EMM_TOOLS_REPLAY_MAP_H
#define EMM_TOOLS_REPLAY_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct replay_map {
	uint64_t *keys;
	uint32_t *values;
	bool *used;
	size_t capacity; /* a power of two, or 0 */
	size_t count;
};

/* 0 or -ENOMEM; an existing key gets the new value. */
int replay_map_put(struct replay_map *map, uint64_t key, uint32_t value);

/* true and *ret_value when present. */
bool replay_map_get(const struct replay_map *map, uint64_t key, uint32_t *ret_value);

/* Remove `key`; true if it was there. */
bool replay_map_remove(struct replay_map *map, uint64_t key);

void replay_map_free(struct replay_map *map);

#endif
