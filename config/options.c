/* SPDX-License-Identifier: MIT */
/*
 * config/options.c - owns every EMM_* environment variable: the one option
 * table, the grammar its values are parsed with, the cross-option checks,
 * and the printers (settings lines, the README's Markdown table).
 *
 * Entry points: emm_options_get() parses `environ` once (pthread_once) into
 * static storage; emm_options_parse() does the same work on any envp, which
 * is what the tests use. Nothing here allocates: an LD_PRELOADed library may
 * be asked for its settings from inside the program's first malloc.
 */
#include "config/ascii.h"
#include "config/text.h"
#include "config/options.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

#include "common/compiler.h"
#include "common/log.h"

extern char **environ;

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

enum opt_type {
	OPT_BOOL,
	OPT_UINT,
	OPT_SIZE,
	OPT_ENUM,
	OPT_STRING,
	OPT_OUTPUT, /* EMM_STATS: on/off, table, json or a path */
	OPT_SIGNAL, /* a signal name or number; 0 off */
};

/* Per-row constraints beyond the type. */
enum {
	F_UNLIMITED = 1u << 0, /* size: "unlimited"/"none" means SIZE_MAX */
	F_NONZERO = 1u << 1,   /* size: 0 is not allowed */
	F_ALIGN512 = 1u << 2,  /* size: a multiple of 512 (the block granule) */
	F_POW2 = 1u << 3,      /* uint: 0 or a power of two */
	F_NONEMPTY = 1u << 4,  /* string: "" is not allowed */
	F_SECURE = 1u << 5,    /* ignored when the process runs with AT_SECURE */
};

struct opt_row {
	enum emm_option_id id;
	const char *name; /* without the EMM_ prefix */
	enum opt_type type;
	size_t offset;	   /* of the field in struct emm_options */
	size_t field_size; /* its size (the string buffer's capacity) */
	union {
		bool b;
		unsigned u;
		size_t z;
		const char *s;
	} def;
	const char *unit;	 /* "" when none */
	unsigned min, max;	 /* uint range */
	unsigned flags;		 /* F_* */
	const char *const *names; /* enum value names, in enum order */
	unsigned n_names;
	const char *desc; /* one line, no '|' (it goes into a Markdown table) */
};

static const char *const free_mode_names[] = {
	[EMM_OPT_FREE_FENCE] = "fence",
	[EMM_OPT_FREE_STRICT] = "strict",
	[EMM_OPT_FREE_STREAM] = "stream",
};

static const char *const vmm_names[] = {
	[EMM_OPT_VMM_CACHE] = "cache",
	[EMM_OPT_VMM_COUNT] = "count",
	[EMM_OPT_VMM_OFF] = "off",
};

#define MIB ((size_t)1 << 20)

/* Column helpers for the table below. */
#define B(v) .b = (v)
#define U(v) .u = (v)
#define Z(v) .z = (v)
#define S(v) .s = (v)
#define NOLIMIT .flags = 0
#define RANGE(lo, hi) .min = (lo), .max = (hi)
#define POW2_UPTO(hi) .min = 0, .max = (hi), .flags = F_POW2
#define FLAGS(f) .flags = (f)
#define NAMES(a) .names = (a), .n_names = EMM_ARRAY_SIZE(a)

/*
 * One row per option, in enum emm_option_id order (checked at compile time
 * below). Columns: NAME, struct field, type, default, unit, limits,
 * description.
 */
#define EMM_OPTION_TABLE(X)                                                                          \
	/* Pure pass-through; read before anything else is set up. */                               \
	X(DISABLE, disable, BOOL, B(false), "", NOLIMIT,                                              \
	  "Pure pass-through: every call goes to the driver unchanged")                              \
	/* 0 quiet, 1 settings at start-up, 2-3 debug lines. */                                      \
	X(VERBOSE, verbose, UINT, U(0), "level", RANGE(0, 3),                                         \
	  "0 quiet, 1 print version, backend and settings at start-up, 2-3 add debug output")       \
	/* A path form is ignored under AT_SECURE (JSON goes to stderr then). */                     \
	X(STATS, stats, OUTPUT, B(false), "", NOLIMIT,                                                \
	  "Print per-device allocation statistics at exit: on (a table on stderr), json (JSON on "     \
	  "stderr) or a file path (JSON into it; %p: the process id)")                                 \
	X(STATS_SIGNAL, stats_signal, SIGNAL, U(0), "", NOLIMIT,                                      \
	  "On this signal (e.g. SIGUSR2 or 12) dump the statistics as EMM_STATS says (a table if "      \
	  "unset), flush the EMM_LOG trace and write the EMM_SNAPSHOT; off: no handler")               \
	X(SNAPSHOT, snapshot_file, STRING, S(""), "path", FLAGS(F_SECURE),                            \
	  "Write a memory snapshot in PyTorch's memory_viz format (pickle) to this path at exit "       \
	  "and on EMM_STATS_SIGNAL; %p: the process id; ignored in setuid programs")                   \
	/* A path: ignored under AT_SECURE so a setuid program cannot be made to   \
	 * write files where its invoker chooses. */                                                  \
	X(LOG, log_file, STRING, S(""), "path", FLAGS(F_SECURE),                                      \
	  "Write every allocator event to this CSV file (RMM log columns); empty: off; "              \
	  "ignored in setuid programs")                                                               \
	/* A name or a path to dlopen: ignored under AT_SECURE. */                                    \
	X(BACKEND, backend, STRING, S("driver"), "name or path", FLAGS(F_NONEMPTY | F_SECURE),        \
	  "Memory backend: a built-in name or the path of a backend .so; ignored in setuid programs") \
	X(BACKEND_OPTIONS, backend_options, STRING, S(""), "", NOLIMIT,                               \
	  "Option string handed to the backend")                                                      \
	/* Bytes. */                                                                                  \
	X(SMALL_SIZE, small_size, SIZE, Z(1 * MIB), "bytes", NOLIMIT,                                 \
	  "Requests up to this size are served from the small pool")                                  \
	X(SMALL_SEGMENT, small_segment, SIZE, Z(2 * MIB), "bytes", FLAGS(F_NONZERO | F_ALIGN512),     \
	  "Size of the segments the small pool carves its blocks from")                               \
	X(LARGE_SEGMENT, large_segment, SIZE, Z(20 * MIB), "bytes", FLAGS(F_NONZERO | F_ALIGN512),    \
	  "Segment size for large requests smaller than half of it")                                  \
	X(LARGE_ROUND, large_round, SIZE, Z(2 * MIB), "bytes", FLAGS(F_NONZERO | F_ALIGN512),         \
	  "Bigger large requests get a segment of their own, rounded up to this")                     \
	X(MAX_SPLIT, max_split, SIZE, Z(SIZE_MAX), "bytes", FLAGS(F_UNLIMITED),                       \
	  "Cached blocks of this size or more are never split")                                       \
	/* 0: round to 512 bytes; N: N steps per power of two. */                                    \
	X(ROUNDUP_DIVISIONS, roundup_divisions, UINT, U(0), "", POW2_UPTO(64),                        \
	  "Round requests to N steps per power of two (0: to a multiple of 512 bytes)")               \
	X(RELEASE_THRESHOLD, release_threshold, SIZE, Z(SIZE_MAX), "bytes", FLAGS(F_UNLIMITED),       \
	  "Idle cached bytes above this go back to the device")                                       \
	X(OOM_RETRY, oom_retry, BOOL, B(true), "", NOLIMIT,                                           \
	  "On out-of-memory, release idle cached segments and retry once")                            \
	X(HOLD_PEAK, hold_peak, BOOL, B(true), "", NOLIMIT,                                           \
	  "Page-granular backends (vmm): before mapping more pages, give back idle ones so that "     \
	  "the mapped bytes stay at their high-water mark")                                           \
	X(FREE_MODE, free_mode, ENUM, U(EMM_OPT_FREE_FENCE), "", NAMES(free_mode_names),              \
	  "When a block freed without a stream may be reused: fence (epoch events), "                 \
	  "strict (device sync like cuMemFree), stream (at once, trusting stream order)")             \
	X(EPOCH_BLOCKS, epoch_blocks, UINT, U(32), "frees", RANGE(1, 65536),                          \
	  "Close the open free epoch after this many synchronous frees (half as many when an "         \
	  "allocation needs its memory)")                                                             \
	X(EPOCH_BYTES, epoch_bytes, SIZE, Z(64 * MIB), "bytes", FLAGS(F_NONZERO),                     \
	  "Close the open free epoch after this many freed bytes")                                    \
	X(PENDING_LIMIT, pending_limit, SIZE, Z(1024 * MIB), "bytes", NOLIMIT,                        \
	  "A miss that would reserve more memory while this many freed bytes still wait for their "   \
	  "fences first waits (bounded) for the oldest fences; 0: never wait")                        \
	X(MEMINFO_CACHED, meminfo_cached, BOOL, B(true), "", NOLIMIT,                                 \
	  "cuMemGetInfo counts idle cached memory as free")                                           \
	X(PINNED, pinned, BOOL, B(true), "", NOLIMIT,                                                 \
	  "Cache pinned host allocations (cuMemHostAlloc, cuMemAllocHost)")                           \
	X(RUNTIME_SHIMS, runtime_shims, BOOL, B(true), "", NOLIMIT,                                   \
	  "Serve cudaMalloc and cudaFree of shared-cudart programs directly")                         \
	X(CONTEXT_CHECK, context_check, BOOL, B(true), "", NOLIMIT,                                   \
	  "Ask the driver for the current context's id on every call (off: trust the per-thread "     \
	  "cache, emptied by libemm's context shims; see process/contexts.c)")                        \
	/* 0: one arena per CPU, at most 64, rounded down to a power of two. */                        \
	X(ARENAS, arenas, UINT, U(0), "", RANGE(0, 64),                                               \
	  "Arenas per heap that threads spread over (0: one per CPU, at most 64)")                    \
	X(THREAD_CACHE, thread_cache, BOOL, B(false), "", NOLIMIT,                                    \
	  "A per-thread cache of recently freed blocks, reused without a lock (same fence rules)")    \
	X(TEARDOWN_WAIT, teardown_wait, UINT, U(2000), "ms", RANGE(0, 600000),                        \
	  "How long a context teardown waits for threads still inside libemm; past it their heaps "   \
	  "are left to them, not freed")                                                              \
	X(VMM, vmm, ENUM, U(EMM_OPT_VMM_CACHE), "", NAMES(vmm_names),                                 \
	  "VMM calls (cuMemCreate, cuMemMap, ...): cache (whole freed buffers kept mapped for the "   \
	  "next matching allocation), count (passed through, counted), off (passed through)")         \
	X(VMM_REAP_MS, vmm_reap_ms, UINT, U(5), "ms", RANGE(1, 60000),                                 \
	  "How long a VMM unmap or release that may begin a whole-buffer free waits for the rest "     \
	  "before it is made real")                                                                   \
	/* A directory: ignored under AT_SECURE like the other paths. */                              \
	X(IPC_DIR, ipc_dir, STRING, S("/dev/shm"), "path", FLAGS(F_NONEMPTY | F_SECURE),              \
	  "Directory of the per-user registry through which libemm processes open each other's IPC "   \
	  "handles of sub-allocated blocks; ignored in setuid programs")                                                   \
	/* 256: off (a byte is 0..255). */                                                            \
	X(POISON, poison, UINT, U(256), "byte", RANGE(0, 256),                                        \
	  "Fill each freed device block with this byte (0-255), stream-ordered on the freeing "       \
	  "stream before it can be reused (debugging); 256: off")

#define OPT_ROW(NAME, field_, TYPE, def_, unit_, limits_, desc_)                                      \
	{                                                                                             \
		.id = EMM_OPT_##NAME,                                                                 \
		.name = #NAME,                                                                        \
		.type = OPT_##TYPE,                                                                   \
		.offset = offsetof(struct emm_options, field_),                                       \
		.field_size = sizeof(((struct emm_options *)0)->field_),                              \
		.def = {def_},                                                                        \
		.unit = unit_,                                                                        \
		limits_,                                                                              \
		.desc = desc_,                                                                        \
	},

static const struct opt_row rows[] = {EMM_OPTION_TABLE(OPT_ROW)};

/* Compile-time checks: the rows are in enum order, and each field has the C
 * type its row's parser stores. */
#define OPT_ROW_INDEX(NAME, ...) OPT_ROW_INDEX_##NAME,
enum { EMM_OPTION_TABLE(OPT_ROW_INDEX) OPT_ROW_INDEX__COUNT };
#define OPT_ROW_ORDER(NAME, ...) \
	_Static_assert((int)OPT_ROW_INDEX_##NAME == (int)EMM_OPT_##NAME, "row " #NAME " is out of enum emm_option_id order");
EMM_OPTION_TABLE(OPT_ROW_ORDER)
_Static_assert((int)OPT_ROW_INDEX__COUNT == (int)EMM_OPT__COUNT, "one row per enum emm_option_id");

#define OPT_FIELD_IS_BOOL(f) _Generic((f), bool: 1, default: 0)
#define OPT_FIELD_IS_UINT(f) _Generic((f), unsigned: 1, default: 0)
#define OPT_FIELD_IS_SIZE(f) _Generic((f), size_t: 1, default: 0)
#define OPT_FIELD_IS_OUTPUT(f) OPT_FIELD_IS_BOOL(f)
#define OPT_FIELD_IS_SIGNAL(f) OPT_FIELD_IS_UINT(f)
#define OPT_FIELD_IS_ENUM(f) (sizeof(f) == sizeof(unsigned))
#define OPT_FIELD_IS_STRING(f) (_Generic(&(f)[0], char *: 1, default: 0) && sizeof(f) > 1)
#define OPT_ROW_FIELD(NAME, field_, TYPE, ...)                                      \
	_Static_assert(OPT_FIELD_IS_##TYPE(((struct emm_options *)0)->field_), \
		       "field of " #NAME " does not match its type " #TYPE);
EMM_OPTION_TABLE(OPT_ROW_FIELD)

/*
 * EMM_* variables that are not options but belong to tests and tools: they
 * are left alone instead of being reported as unknown. Prefixes.
 */
static const char *const reserved_prefixes[] = {
	"EMM_TEST_",  /* test programs and the test-double libcuda */
	"EMM_BENCH_", /* benchmark programs */
};

/*
 * Relations between options that single values cannot check: the `lo`
 * option must be <= the `hi` option (< when strict). When one fails, the
 * options involved that came from the environment go back to their
 * defaults (the defaults satisfy every relation).
 */
static const struct {
	enum emm_option_id lo, hi;
	bool strict;
} relations[] = {
	/* a small request must fit in a small segment */
	{EMM_OPT_SMALL_SIZE, EMM_OPT_SMALL_SEGMENT, false},
	/* the rounding granule of large segments cannot exceed the segment */
	{EMM_OPT_LARGE_ROUND, EMM_OPT_LARGE_SEGMENT, false},
	/* blocks >= MAX_SPLIT are never split: a large segment must stay splittable */
	{EMM_OPT_LARGE_SEGMENT, EMM_OPT_MAX_SPLIT, true},
};

/* ------------------------------------------------------------------------
 * Formatting values (settings lines, warnings, the Markdown table)
 * ------------------------------------------------------------------------ */

static const void *field_of(const struct emm_options *o, const struct opt_row *r)
{
	return (const char *)o + r->offset;
}

static unsigned enum_value(const void *field)
{
	unsigned v;

	memcpy(&v, field, sizeof(v));
	return v;
}

static void format_value(const struct opt_row *r, const struct emm_options *o, char *buf, size_t n)
{
	const void *f = field_of(o, r);

	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "%s", *(const bool *)f ? "on" : "off");
		break;
	case OPT_UINT:
		snprintf(buf, n, "%u", *(const unsigned *)f);
		break;
	case OPT_SIZE:
		emm_options_format_size(*(const size_t *)f, buf, n);
		break;
	case OPT_ENUM: {
		unsigned v = enum_value(f);
		snprintf(buf, n, "%s", v < r->n_names ? r->names[v] : "?");
		break;
	}
	case OPT_STRING:
		snprintf(buf, n, "%s", *(const char *)f ? (const char *)f : "\"\"");
		break;
	case OPT_OUTPUT:
		snprintf(buf, n, "%s", o->stats_file[0] ? o->stats_file : !o->stats ? "off" : o->stats_json ? "json" : "on");
		break;
	case OPT_SIGNAL:
		emm_format_signal(*(const unsigned *)f, buf, n);
		break;
	}
}

/* What a valid value looks like, for the warning. */
static void format_expected(const struct opt_row *r, char *buf, size_t n)
{
	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "1/true/yes/on or 0/false/no/off");
		break;
	case OPT_UINT:
		if (r->flags & F_POW2)
			snprintf(buf, n, "0 or a power of two up to %u", r->max);
		else
			snprintf(buf, n, "an integer from %u to %u", r->min, r->max);
		break;
	case OPT_SIZE:
		snprintf(buf, n, "%s with an optional K/M/G/T suffix (e.g. 512K, 2M, 1GiB)%s",
			 (r->flags & F_ALIGN512)  ? "a non-zero multiple of 512 bytes"
			 : (r->flags & F_NONZERO) ? "a non-zero size in bytes"
						  : "a size in bytes",
			 (r->flags & F_UNLIMITED) ? ", or unlimited" : "");
		break;
	case OPT_ENUM: {
		size_t len = (size_t)snprintf(buf, n, "one of");
		for (unsigned i = 0; i < r->n_names && len < n; i++)
			len += (size_t)snprintf(buf + len, n - len, "%s %s", i ? "," : "", r->names[i]);
		break;
	}
	case OPT_STRING:
		snprintf(buf, n, "a %sstring of at most %zu bytes", (r->flags & F_NONEMPTY) ? "non-empty " : "",
			 r->field_size - 1);
		break;
	case OPT_OUTPUT:
		snprintf(buf, n, "1/true/yes/on, 0/false/no/off, table, json, or a path with a '/' or ending in .json");
		break;
	case OPT_SIGNAL:
		snprintf(buf, n, "a signal name (SIGUSR2, USR2, SIGRTMIN+1) or number, or off");
		break;
	}
}

/* The Markdown table's Type column. */
static void format_type(const struct opt_row *r, char *buf, size_t n)
{
	char unit[32] = "";
	char names[64];

	if (r->unit[0])
		snprintf(unit, sizeof(unit), " (%s)", r->unit);
	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "bool");
		break;
	case OPT_UINT:
		if (r->flags & F_POW2)
			snprintf(buf, n, "0 or power of 2 up to %u%s", r->max, unit);
		else
			snprintf(buf, n, "integer %u..%u%s", r->min, r->max, unit);
		break;
	case OPT_SIZE:
		snprintf(buf, n, "size%s%s", unit, (r->flags & F_UNLIMITED) ? " or `unlimited`" : "");
		break;
	case OPT_ENUM:
		format_expected(r, names, sizeof(names));
		snprintf(buf, n, "%s", names);
		break;
	case OPT_STRING:
		snprintf(buf, n, "string%s", unit);
		break;
	case OPT_OUTPUT:
		snprintf(buf, n, "bool, `json` or a path");
		break;
	case OPT_SIGNAL:
		snprintf(buf, n, "signal name or number");
		break;
	}
}

/* ------------------------------------------------------------------------
 * Parsing an environment
 * ------------------------------------------------------------------------ */

static void set_defaults(struct emm_options *o)
{
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		const struct opt_row *r = &rows[i];
		void *f = (char *)o + r->offset;

		switch (r->type) {
		case OPT_BOOL:
		case OPT_OUTPUT:
			*(bool *)f = r->def.b;
			break;
		case OPT_UINT:
		case OPT_SIGNAL:
			*(unsigned *)f = r->def.u;
			break;
		case OPT_ENUM:
			memcpy(f, &r->def.u, sizeof(unsigned));
			break;
		case OPT_SIZE:
			*(size_t *)f = r->def.z;
			break;
		case OPT_STRING:
			snprintf(f, r->field_size, "%s", r->def.s);
			break;
		}
	}
}

static void reset_to_default(const struct opt_row *r, struct emm_options *o, const struct emm_options *defaults)
{
	memcpy((char *)o + r->offset, field_of(defaults, r), r->field_size);
}

/* Parse `value` per row r into o's field. 0, or -EINVAL (field untouched). */
static int parse_value(const struct opt_row *r, const char *value, struct emm_options *o)
{
	void *f = (char *)o + r->offset;

	switch (r->type) {
	case OPT_BOOL:
		return emm_parse_bool(value, f);
	case OPT_UINT: {
		unsigned u;
		if (emm_parse_uint(value, r->min, r->max, &u) < 0)
			return -EINVAL;
		if ((r->flags & F_POW2) && (u & (u - 1)) != 0)
			return -EINVAL;
		*(unsigned *)f = u;
		return 0;
	}
	case OPT_SIZE: {
		size_t z;
		if (emm_parse_size(value, r->flags & F_UNLIMITED, &z) < 0)
			return -EINVAL;
		if ((r->flags & F_NONZERO) && z == 0)
			return -EINVAL;
		if ((r->flags & F_ALIGN512) && (z == 0 || z % 512 != 0))
			return -EINVAL;
		*(size_t *)f = z;
		return 0;
	}
	case OPT_ENUM:
		for (unsigned i = 0; i < r->n_names; i++) {
			if (ascii_eq_nocase(value, r->names[i])) {
				memcpy(f, &i, sizeof(i));
				return 0;
			}
		}
		return -EINVAL;
	case OPT_OUTPUT:
		return emm_parse_stats(value, &o->stats, &o->stats_json, o->stats_file, sizeof(o->stats_file));
	case OPT_SIGNAL:
		return emm_parse_signal(value, f);
	case OPT_STRING: {
		size_t len = strnlen(value, r->field_size);
		if (len >= r->field_size || (len == 0 && (r->flags & F_NONEMPTY)))
			return -EINVAL;
		memcpy(f, value, len + 1);
		return 0;
	}
	}
	return -EINVAL;
}

/* The row for an exact name (without EMM_), or NULL. */
static const struct opt_row *find_row(const char *name, size_t len)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++)
		if (strncmp(rows[i].name, name, len) == 0 && rows[i].name[len] == '\0')
			return &rows[i];
	return NULL;
}

static bool is_reserved(const char *var)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(reserved_prefixes); i++)
		if (strncmp(var, reserved_prefixes[i], strlen(reserved_prefixes[i])) == 0)
			return true;
	return false;
}

/* The option a misspelt name (without EMM_) most likely meant, or NULL when
 * none is close: at most 1 edit per 4 characters, 1 at least, 3 at most. */
static const struct opt_row *nearest_row(const char *name, size_t len)
{
	const struct opt_row *best = NULL;
	size_t best_d = SIZE_MAX;
	size_t limit = 1 + len / 4;

	if (len > EMM_CFG_NAME_MAX)
		return NULL;
	if (limit > 3)
		limit = 3;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		size_t d = emm_cfg_edit_distance(name, len, rows[i].name);
		if (d < best_d) {
			best_d = d;
			best = &rows[i];
		}
	}
	return best_d <= limit ? best : NULL;
}

static void warn_unknown(const char *var, size_t name_len)
{
	const char *name = var + 4; /* after EMM_ */
	const struct opt_row *near = nearest_row(name, name_len - 4);
	int shown = name_len > 64 ? 64 : (int)name_len;

	if (near)
		emm_warn("unknown variable %.*s%s; did you mean EMM_%s?", shown, var,
			 (size_t)shown < name_len ? "..." : "", near->name);
	else
		emm_warn("unknown variable %.*s%s", shown, var, (size_t)shown < name_len ? "..." : "");
}

static void warn_invalid(const struct opt_row *r, const char *value, const struct emm_options *defaults)
{
	char echo[80], expected[160], def[64];

	emm_cfg_echo(value, echo, sizeof(echo));
	format_expected(r, expected, sizeof(expected));
	format_value(r, defaults, def, sizeof(def));
	emm_warn("EMM_%s='%s' is not valid: expected %s; using default %s", r->name, echo, expected, def);
}

static size_t size_field(const struct emm_options *o, enum emm_option_id id)
{
	return *(const size_t *)field_of(o, &rows[id]);
}

/* Apply the relations until all hold; each failure is one warning. */
static void check_relations(struct emm_options *o, enum emm_option_source *src,
			    const struct emm_options *defaults)
{
	bool changed = true;

	while (changed) {
		changed = false;
		for (size_t i = 0; i < EMM_ARRAY_SIZE(relations); i++) {
			const struct opt_row *lo = &rows[relations[i].lo], *hi = &rows[relations[i].hi];
			size_t a = size_field(o, lo->id), b = size_field(o, hi->id);
			char va[32], vb[32], reset[160];
			size_t len = 0;

			if (relations[i].strict ? a < b : a <= b)
				continue;
			format_value(lo, o, va, sizeof(va));
			format_value(hi, o, vb, sizeof(vb));
			for (const struct opt_row *r = lo; r; r = (r == lo ? hi : NULL)) {
				char def[32];
				if (src[r->id] != EMM_OPTION_ENV)
					continue;
				reset_to_default(r, o, defaults);
				src[r->id] = EMM_OPTION_INVALID;
				format_value(r, o, def, sizeof(def));
				len += (size_t)snprintf(reset + len, sizeof(reset) - len, "%sEMM_%s=%s",
							len ? " and " : "", r->name, def);
			}
			if (len == 0)
				continue; /* both are defaults: a table bug the tests catch */
			emm_warn("EMM_%s=%s must be %s EMM_%s=%s; using default %s", lo->name, va,
				 relations[i].strict ? "smaller than" : "at most", hi->name, vb, reset);
			changed = true;
		}
	}
}

void emm_options_parse_secure(char *const *envp, struct emm_options *out, enum emm_option_source *sources,
			      bool secure)
{
	struct emm_options defaults;
	enum emm_option_source src[EMM_OPT__COUNT];

	set_defaults(&defaults);
	*out = defaults;
	for (size_t i = 0; i < EMM_OPT__COUNT; i++)
		src[i] = EMM_OPTION_DEFAULT;

	for (char *const *e = envp; e && *e; e++) {
		const char *var = *e;
		const char *eq = strchr(var, '=');
		const struct opt_row *r;
		size_t name_len;

		if (strncmp(var, "EMM_", 4) != 0 || !eq)
			continue;
		name_len = (size_t)(eq - var);
		r = find_row(var + 4, name_len - 4);
		if (!r) {
			if (!is_reserved(var))
				warn_unknown(var, name_len);
			continue;
		}
		/* The first occurrence wins, as with getenv. */
		if (src[r->id] != EMM_OPTION_DEFAULT)
			continue;
		if (secure && (r->flags & F_SECURE)) {
			char def[64];
			format_value(r, &defaults, def, sizeof(def));
			emm_warn("EMM_%s is ignored in a setuid/setgid program; using default %s", r->name, def);
			src[r->id] = EMM_OPTION_INVALID;
			continue;
		}
		if (parse_value(r, eq + 1, out) < 0) {
			warn_invalid(r, eq + 1, &defaults);
			src[r->id] = EMM_OPTION_INVALID;
			continue;
		}
		src[r->id] = EMM_OPTION_ENV;
		if (secure && r->type == OPT_OUTPUT && out->stats_file[0]) {
			emm_warn("EMM_%s: a file is ignored in a setuid/setgid program; JSON goes to stderr",
				 r->name);
			out->stats_file[0] = '\0';
		}
	}

	check_relations(out, src, &defaults);
	if (sources)
		memcpy(sources, src, sizeof(src));
}

void emm_options_parse(char *const *envp, struct emm_options *out, enum emm_option_source *sources)
{
	emm_options_parse_secure(envp, out, sources, getauxval(AT_SECURE) != 0);
}

/* ------------------------------------------------------------------------
 * The process's settings
 * ------------------------------------------------------------------------ */

static struct emm_options process_options;
static enum emm_option_source process_sources[EMM_OPT__COUNT];
static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void process_init(void)
{
	emm_options_parse(environ, &process_options, process_sources);
	if (process_options.verbose >= 2)
		emm_log_set_debug(true);
}

const struct emm_options *emm_options_get(void)
{
	pthread_once(&process_once, process_init);
	return &process_options;
}

const enum emm_option_source *emm_options_sources(void)
{
	pthread_once(&process_once, process_init);
	return process_sources;
}

/* ------------------------------------------------------------------------
 * Printing
 * ------------------------------------------------------------------------ */

void emm_options_print(const struct emm_options *opts, const enum emm_option_source *sources)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		char name[40], value[300];
		const char *src = "default";

		if (sources && sources[i] == EMM_OPTION_ENV)
			src = "env";
		else if (sources && sources[i] == EMM_OPTION_INVALID)
			src = "invalid, using default";
		snprintf(name, sizeof(name), "EMM_%s", rows[i].name);
		format_value(&rows[i], opts, value, sizeof(value));
		emm_info("%-22s = %s (%s)", name, value, src);
	}
}

void emm_options_write_markdown(FILE *out)
{
	struct emm_options defaults;

	set_defaults(&defaults);
	fprintf(out, "| Variable | Type | Default | Description |\n");
	fprintf(out, "|---|---|---|---|\n");
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		char type[96], def[64];

		format_type(&rows[i], type, sizeof(type));
		format_value(&rows[i], &defaults, def, sizeof(def));
		fprintf(out, "| `EMM_%s` | %s | `%s` | %s |\n", rows[i].name, type, def, rows[i].desc);
	}
}

const char *emm_option_name(enum emm_option_id id)
{
	return (size_t)id < EMM_ARRAY_SIZE(rows) ? rows[id].name : NULL;
}

void emm_option_format(enum emm_option_id id, const struct emm_options *opts, char *buf, size_t n)
{
	if ((size_t)id < EMM_ARRAY_SIZE(rows))
		format_value(&rows[id], opts, buf, n);
	else if (n)
		buf[0] = '\0';
}
