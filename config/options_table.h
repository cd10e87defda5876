/* SPDX-License-Identifier: MIT */
/*
 * config/options_table.h - the option table: one row per EMM_* option
 * (name, field, type, default, unit, limits, description), the row type
 * and its constraint flags, the names of enum values, the compile-time
 * checks of the rows against enum emm_option_id and struct emm_options,
 * the EMM_* prefixes left to tests and tools, and the relations between
 * options. Data only: the rows are static, for config/options.c, the one
 * file that includes this (it parses, checks and prints them). A new
 * option is a row here, its enum emm_option_id value and field in
 * options.h, and its row in the README's table.
 */
#ifndef EMM_CONFIG_OPTIONS_TABLE_H
#define EMM_CONFIG_OPTIONS_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/compiler.h"
#include "config/options.h"

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
	  "Large requests below half of it share segments of as many as fit this size")               \
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
	  "strict (device sync like cuMemFree), stream (at once, trusting stream order; pinned "     \
	  "blocks still wait for their fences)")                                                     \
	X(EPOCH_BLOCKS, epoch_blocks, UINT, U(64), "frees", RANGE(1, 65536),                          \
	  "Close the open free epoch after this many synchronous frees (half if an allocation "        \
	  "needs its memory, twice once 8 threads' arenas hold memory; 8 if unset with EMM_BACKEND=vmm)") \
	X(EPOCH_BYTES, epoch_bytes, SIZE, Z(64 * MIB), "bytes", FLAGS(F_NONZERO),                     \
	  "A miss closes the open free epoch once it holds this many freed bytes (one for half "     \
	  "this or more, before a new segment, once it holds any); a free only at 16 times this "    \
	  "(at this with a release threshold)")                                                       \
	X(PENDING_LIMIT, pending_limit, SIZE, Z(1024 * MIB), "bytes", NOLIMIT,                        \
	  "A miss that would reserve more memory while this many freed bytes still wait for their "   \
	  "fences first waits (bounded) for the oldest fences; 0: never wait")                        \
	X(MEMINFO_CACHED, meminfo_cached, BOOL, B(true), "", NOLIMIT,                                 \
	  "cuMemGetInfo counts idle cached memory as free")                                           \
	X(PINNED, pinned, BOOL, B(true), "", NOLIMIT,                                                 \
	  "Cache pinned host allocations (cuMemHostAlloc, cuMemAllocHost)")                           \
	X(RUNTIME_SHIMS, runtime_shims, BOOL, B(true), "", NOLIMIT,                                   \
	  "Serve cudaMalloc and cudaFree of shared-cudart programs directly")                         \
	X(CONTEXT_CHECK, context_check, BOOL, B(false), "", NOLIMIT,                                  \
	  "Ask the driver for the current context's id on every call (off: trust the per-thread "     \
	  "cache, emptied by libemm's context shims; see process/contexts.c)")                        \
	/* 0: one arena per CPU, at most 64, rounded down to a power of two. */                        \
	X(ARENAS, arenas, UINT, U(0), "", RANGE(0, 64),                                               \
	  "Arenas per heap that threads spread over (0: one per CPU, at most 64)")                    \
	X(THREAD_CACHE, thread_cache, BOOL, B(false), "", NOLIMIT,                                    \
	  "A per-thread cache of recently freed blocks, reused without a search of the pools (same fence rules)") \
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
	  "stream before it can be reused (debugging); 256: off")                                     \
	X(ANNOTATE, annotate, BOOL, B(true), "", NOLIMIT,                                             \
	  "Under a memory checker (compute-sanitizer), annotate segments and blocks through NVTX "     \
	  "so that it sees each block, and reuse no freed VMM buffer; off: the checker sees segments")

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

#endif
