/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_trace.c - reads a trace in RMM's CSV columns into replay
 * order, matches frees to allocations (format in replay_trace.h).
 */
#include "tools/replay_trace.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap.h"
#include "tools/replay_map.h"

#define NS_PER_S  UINT64_C(1000000000)
#define NS_PER_DAY (UINT64_C(86400) * NS_PER_S)

uint64_t replay_stream_key(uint64_t value, uint32_t thread, uint32_t stream_index)
{
	if (value == 0)
		return EMM_STREAM_SYNC;
	if (value == 1)
		return EMM_STREAM_LEGACY;
	if (value == 2)
		return EMM_STREAM_PER_THREAD_KEY((uint64_t)thread + 1);
	/* Low byte 3: a created stream's key that no handle check confuses
	 * with the per-thread form (low byte 2). */
	return ((uint64_t)stream_index + 1) << 8 | 3u;
}

/* --- fields --- */

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* "0x1f" (hex), "(nil)"/"nil"/"null"/"nullptr" (0), "123" (decimal). */
static int parse_number(const char *s, uint64_t *ret)
{
	uint64_t v = 0;
	int base = 10;

	if (strcmp(s, "(nil)") == 0 || strcmp(s, "nil") == 0 || strcmp(s, "null") == 0 ||
	    strcmp(s, "nullptr") == 0) {
		*ret = 0;
		return 0;
	}
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		int d;

		if (*s >= '0' && *s <= '9')
			d = *s - '0';
		else if (base == 16 && *s >= 'a' && *s <= 'f')
			d = *s - 'a' + 10;
		else if (base == 16 && *s >= 'A' && *s <= 'F')
			d = *s - 'A' + 10;
		else
			return -EINVAL;
		if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
			return -EINVAL;
		v = v * (uint64_t)base + (uint64_t)d;
	}
	*ret = v;
	return 0;
}

/* Digits then an optional ".fraction" (up to 9 digits kept) as ns. */
static int parse_seconds(const char *s, uint64_t *ret)
{
	uint64_t whole = 0, frac = 0, scale = NS_PER_S;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	for (; isdigit((unsigned char)*s); s++) {
		if (whole > UINT64_MAX / 10 / NS_PER_S)
			return -EINVAL;
		whole = whole * 10 + (uint64_t)(*s - '0');
	}
	if (*s == '.') {
		for (s++; isdigit((unsigned char)*s); s++) {
			if (scale > 1) {
				scale /= 10;
				frac += (uint64_t)(*s - '0') * scale;
			}
		}
	}
	if (*s)
		return -EINVAL;
	*ret = whole * NS_PER_S + frac;
	return 0;
}

/* Seconds since the epoch ("1763675732.104211", libemm) or the time of day
 * ("13:24:29.345281", RMM's spdlog pattern) in ns. */
static int parse_time(const char *s, bool *ret_of_day, uint64_t *ret)
{
	unsigned h, m;
	int used = 0;
	uint64_t sec;

	if (!strchr(s, ':')) {
		*ret_of_day = false;
		return parse_seconds(s, ret);
	}
	if (sscanf(s, "%2u:%2u:%n", &h, &m, &used) != 2 || used == 0 || h > 23 || m > 59)
		return -EINVAL;
	if (parse_seconds(s + used, &sec) < 0 || sec >= 61 * NS_PER_S)
		return -EINVAL;
	*ret_of_day = true;
	*ret = ((uint64_t)h * 3600 + (uint64_t)m * 60) * NS_PER_S + sec;
	return 0;
}

static int parse_action(const char *s, enum replay_action *ret)
{
	if (strcmp(s, "allocate") == 0)
		*ret = REPLAY_ALLOC;
	else if (strcmp(s, "free") == 0 || strcmp(s, "deallocate") == 0)
		*ret = REPLAY_FREE;
	else if (strcmp(s, "allocate failure") == 0 || strcmp(s, "allocate_failure") == 0)
		*ret = REPLAY_ALLOC_FAILURE;
	else
		return -EINVAL;
	return 0;
}

/* --- loading --- */

struct loader {
	const char *path;
	char *err;
	size_t err_size;
	struct replay_trace *t;
	size_t capacity;
	struct replay_map threads, streams;
	uint64_t day_offset, last_time;
	bool have_time;
};

__attribute__((format(printf, 3, 4))) static int fail(struct loader *ld, unsigned line, const char *fmt, ...)
{
	int n = snprintf(ld->err, ld->err_size, "%s:%u: ", ld->path, line);
	va_list ap;

	if (n >= 0 && (size_t)n < ld->err_size) {
		va_start(ap, fmt);
		vsnprintf(ld->err + n, ld->err_size - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int index_of(struct replay_map *map, uint64_t key, size_t *count, uint32_t *ret)
{
	if (replay_map_get(map, key, ret))
		return 0;
	*ret = (uint32_t)*count;
	(*count)++;
	return replay_map_put(map, key, *ret);
}

static int add_thread(struct loader *ld, uint64_t tid, uint32_t *ret)
{
	struct replay_trace *t = ld->t;
	size_t before = t->nthreads;
	int r = index_of(&ld->threads, tid, &t->nthreads, ret);

	if (r == 0 && t->nthreads != before) {
		uint64_t *grown = realloc(t->thread_ids, t->nthreads * sizeof(*grown));
		if (!grown)
			return -ENOMEM;
		grown[*ret] = tid;
		t->thread_ids = grown;
	}
	return r;
}

/* One CSV line (already without its newline). 0, 1 (skipped), or -errno. */
static int parse_line(struct loader *ld, char *line, unsigned lineno)
{
	char *field[7], *p = line;
	struct replay_event ev = {.line = lineno, .match = REPLAY_NO_MATCH};
	enum replay_action action;
	uint64_t tid, stream, t;
	uint32_t stream_index;
	bool of_day;
	int n = 0, r;

	line = trim(line);
	if (!*line || *line == '#')
		return 1;
	if (strncasecmp(line, "Thread,", 7) == 0)
		return 1; /* the header (also where a forked child's trace repeats it) */
	for (p = line; n < 7; n++) {
		field[n] = p;
		p = strchr(p, ',');
		if (!p)
			break;
		*p++ = '\0';
	}
	if ((n != 5 && n != 6) || p)
		return fail(ld, lineno, "expected 6 or 7 comma-separated columns "
				       "(Thread,Time,Action,Pointer,Size,Stream[,Memory])");
	for (int i = 0; i <= n; i++)
		field[i] = trim(field[i]);
	/* libemm's Memory column: only device memory is replayed. */
	if (n == 6 && *field[6] && strcasecmp(field[6], "device") != 0) {
		if (strcasecmp(field[6], "pinned") != 0 && strcasecmp(field[6], "managed") != 0)
			return fail(ld, lineno, "bad Memory '%s' (want device, pinned or managed)", field[6]);
		ld->t->other_memory++;
		return 1;
	}
	if (parse_number(field[0], &tid) < 0)
		return fail(ld, lineno, "bad Thread '%s'", field[0]);
	if (parse_time(field[1], &of_day, &t) < 0)
		return fail(ld, lineno, "bad Time '%s' (want seconds like 1763675732.104211 or 13:24:29.345281)",
			    field[1]);
	if (parse_action(field[2], &action) < 0)
		return fail(ld, lineno, "bad Action '%s' (want allocate, free or allocate failure)", field[2]);
	if (parse_number(field[3], &ev.ptr) < 0)
		return fail(ld, lineno, "bad Pointer '%s'", field[3]);
	if (parse_number(field[4], &ev.size) < 0)
		return fail(ld, lineno, "bad Size '%s'", field[4]);
	if (parse_number(field[5], &stream) < 0)
		return fail(ld, lineno, "bad Stream '%s'", field[5]);
	if (action == REPLAY_ALLOC && (ev.ptr == 0 || ev.size == 0))
		return fail(ld, lineno, "an allocate with a null pointer or size 0");

	/* A time of day that goes back by more than 12 hours crossed midnight. */
	if (of_day) {
		t += ld->day_offset;
		if (ld->have_time && t + NS_PER_DAY / 2 < ld->last_time) {
			ld->day_offset += NS_PER_DAY;
			t += NS_PER_DAY;
		}
	}
	ld->last_time = t;
	ld->have_time = true;
	ev.time_ns = t;
	ev.action = (uint8_t)action;
	if ((r = add_thread(ld, tid, &ev.thread)) < 0)
		return r;
	stream_index = 0;
	if (stream > 2 && (r = index_of(&ld->streams, stream, &ld->t->nstreams, &stream_index)) < 0)
		return r;
	ev.stream_key = replay_stream_key(stream, ev.thread, stream_index);

	if (ld->t->count == ld->capacity) {
		size_t cap = ld->capacity ? ld->capacity * 2 : 4096;
		struct replay_event *grown = realloc(ld->t->events, cap * sizeof(*grown));
		if (!grown)
			return -ENOMEM;
		ld->t->events = grown;
		ld->capacity = cap;
	}
	ld->t->events[ld->t->count++] = ev;
	return 0;
}

static int by_time(const void *a, const void *b)
{
	const struct replay_event *x = a, *y = b;

	if (x->time_ns != y->time_ns)
		return x->time_ns < y->time_ns ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

/* In replay order: match each free to the live allocation of its pointer,
 * count, and find the traced peak of live bytes. */
static int match_frees(struct replay_trace *t)
{
	struct replay_map live = {0};
	uint64_t bytes = 0;
	int r = 0;

	for (size_t i = 0; i < t->count && r == 0; i++) {
		struct replay_event *ev = &t->events[i];
		uint32_t at;

		switch (ev->action) {
		case REPLAY_ALLOC:
			t->allocs++;
			if (replay_map_get(&live, ev->ptr, &at))
				bytes -= t->events[at].size; /* its free was not traced */
			r = replay_map_put(&live, ev->ptr, (uint32_t)i);
			bytes += ev->size;
			if (bytes > t->peak_requested)
				t->peak_requested = bytes;
			break;
		case REPLAY_FREE:
			t->frees++;
			if (replay_map_get(&live, ev->ptr, &at)) {
				ev->match = at;
				bytes -= t->events[at].size;
				replay_map_remove(&live, ev->ptr);
			} else {
				t->unmatched_frees++;
			}
			break;
		default:
			t->failures++;
			break;
		}
	}
	replay_map_free(&live);
	return r;
}

int replay_trace_load(const char *path, struct replay_trace *ret, char *err, size_t err_size)
{
	struct replay_trace t = {0};
	struct loader ld = {.path = path, .err = err, .err_size = err_size, .t = &t};
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	unsigned lineno = 0;
	int r = 0;

	if (!f) {
		r = -errno;
		snprintf(err, err_size, "%s: %s", path, strerror(errno));
		return r;
	}
	while (r >= 0 && (len = getline(&line, &cap, f)) >= 0) {
		bool complete = len > 0 && line[len - 1] == '\n';

		lineno++;
		r = parse_line(&ld, line, lineno);
		if (r == -EINVAL && !complete) {
			/* A last line cut short (the program died mid-write). */
			fprintf(stderr, "emm-replay: warning: %s\n", err);
			r = 0;
		}
	}
	if (r >= 0 && ferror(f)) {
		r = -EIO;
		snprintf(err, err_size, "%s: read error", path);
	}
	free(line);
	if (f != stdin)
		fclose(f);
	replay_map_free(&ld.threads);
	replay_map_free(&ld.streams);
	if (r >= 0 && t.count > UINT32_MAX - 1) {
		r = -E2BIG;
		snprintf(err, err_size, "%s: more than %u events", path, UINT32_MAX - 1);
	}
	if (r >= 0) {
		qsort(t.events, t.count, sizeof(*t.events), by_time);
		r = match_frees(&t);
	}
	if (r == -ENOMEM)
		snprintf(err, err_size, "%s: out of memory", path);
	if (r < 0) {
		replay_trace_free(&t);
		return r;
	}
	*ret = t;
	return 0;
}

void replay_trace_free(struct replay_trace *trace)
{
	free(trace->events);
	free(trace->thread_ids);
	*trace = (struct replay_trace){0};
}
