/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_map.c - the uint64 -> uint32 hash map of replay_map.h.
 */
#include "tools/replay_map.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot_of(const struct replay_map *map, uint64_t key)
{
	/* Fibonacci hashing: traced pointers share their low bits. */
	return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 17) & (map->capacity - 1);
}

static int grow(struct replay_map *map)
{
	struct replay_map bigger = {.capacity = map->capacity ? map->capacity * 2 : 64};

	bigger.keys = malloc(bigger.capacity * sizeof(*bigger.keys));
	bigger.values = malloc(bigger.capacity * sizeof(*bigger.values));
	bigger.used = calloc(bigger.capacity, sizeof(*bigger.used));
	if (!bigger.keys || !bigger.values || !bigger.used) {
		replay_map_free(&bigger);
		return -ENOMEM;
	}
	for (size_t i = 0; i < map->capacity; i++)
		if (map->used[i])
			(void)replay_map_put(&bigger, map->keys[i], map->values[i]);
	replay_map_free(map);
	*map = bigger;
	return 0;
}

int replay_map_put(struct replay_map *map, uint64_t key, uint32_t value)
{
	size_t i;

	if ((map->count + 1) * 4 > map->capacity * 3) {
		int ret = grow(map);
		if (ret < 0)
			return ret;
	}
	for (i = slot_of(map, key); map->used[i]; i = (i + 1) & (map->capacity - 1)) {
		if (map->keys[i] == key) {
			map->values[i] = value;
			return 0;
		}
	}
	map->used[i] = true;
	map->keys[i] = key;
	map->values[i] = value;
	map->count++;
	return 0;
}

static bool find(const struct replay_map *map, uint64_t key, size_t *ret_slot)
{
	if (map->capacity == 0)
		return false;
	for (size_t i = slot_of(map, key); map->used[i]; i = (i + 1) & (map->capacity - 1)) {
		if (map->keys[i] == key) {
			*ret_slot = i;
			return true;
		}
	}
	return false;
}

bool replay_map_get(const struct replay_map *map, uint64_t key, uint32_t *ret_value)
{
	size_t i;

	if (!find(map, key, &i))
		return false;
	*ret_value = map->values[i];
	return true;
}

bool replay_map_remove(struct replay_map *map, uint64_t key)
{
	size_t mask = map->capacity - 1, hole, j;

	if (!find(map, key, &hole))
		return false;
	/* Shift back every later entry of the run that may move into the hole. */
	for (j = (hole + 1) & mask; map->used[j]; j = (j + 1) & mask) {
		size_t home = slot_of(map, map->keys[j]);
		bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);

		if (movable) {
			map->keys[hole] = map->keys[j];
			map->values[hole] = map->values[j];
			hole = j;
		}
	}
	map->used[hole] = false;
	map->count--;
	return true;
}

void replay_map_free(struct replay_map *map)
{
	free(map->keys);
	free(map->values);
	free(map->used);
	*map = (struct replay_map){0};
}
