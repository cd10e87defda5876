/* SPDX-License-Identifier: MIT */
/*
 * config/options.h - every EMM_* environment variable, in one table.
 *
 * The table (config/options_table.h) has one row per option: name (without
 * the EMM_ prefix), type, default, unit, one-line description. Parsing follows
 * one grammar: booleans 1/true/yes/on and 0/false/no/off (any case); sizes
 * as a number with an optional K/M/G/T suffix, optional "iB"/"B" (binary:
 * 1K = 1024), or "unlimited"/"none" where the row allows it; unsigned
 * integers in a range; enums by name. A bad value prints one
 * "emm: warning:" line naming the variable and the accepted form, and the
 * default is kept. An unknown EMM_* variable gets a warning naming the
 * nearest known one.
 *
 * Nothing outside config/ reads the environment for EMM_* variables.
 */
#ifndef EMM_CONFIG_OPTIONS_H
#define EMM_CONFIG_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum emm_opt_free_mode {
	EMM_OPT_FREE_FENCE,
	EMM_OPT_FREE_STRICT,
	EMM_OPT_FREE_STREAM,
};

enum emm_opt_vmm {
	EMM_OPT_VMM_CACHE,
	EMM_OPT_VMM_COUNT,
	EMM_OPT_VMM_OFF,
};

enum emm_option_source {
	EMM_OPTION_DEFAULT, /* the table's default */
	EMM_OPTION_ENV,	    /* set from the environment */
	EMM_OPTION_INVALID, /* the environment had a bad value: default kept */
};

/* The resolved settings. Read-only after emm_options_get() returns them. */
struct emm_options {
	bool disable;		   /* EMM_DISABLE: pure pass-through */
	unsigned verbose;	   /* EMM_VERBOSE: 0 quiet, 1 settings + warnings, 2 debug */
	bool stats;		   /* EMM_STATS: print statistics at exit */
	bool stats_json;	   /* ... as JSON (EMM_STATS=json or a path) */
	char stats_file[256];	   /* ... into this file ("" = stderr; %p: the process id) */
	unsigned stats_signal;	   /* EMM_STATS_SIGNAL: dump statistics on this signal (0 = off) */
	char snapshot_file[256];   /* EMM_SNAPSHOT: memory snapshot pickle path ("" = off) */
	char log_file[256];	   /* EMM_LOG: CSV event trace path ("" = off) */
	char backend[256];	   /* EMM_BACKEND: built-in name or path ("driver") */
	char backend_options[256]; /* EMM_BACKEND_OPTIONS: passed to the backend */
	size_t small_size;	   /* EMM_SMALL_SIZE: small-pool threshold (1M) */
	size_t small_segment;	   /* EMM_SMALL_SEGMENT (2M) */
	size_t large_segment;	   /* EMM_LARGE_SEGMENT (20M) */
	size_t large_round;	   /* EMM_LARGE_ROUND (2M) */
	size_t max_split;	   /* EMM_MAX_SPLIT (unlimited = SIZE_MAX) */
	unsigned roundup_divisions; /* EMM_ROUNDUP_DIVISIONS (0 = off; power of 2 <= 64) */
	size_t release_threshold;  /* EMM_RELEASE_THRESHOLD (unlimited = SIZE_MAX) */
	bool oom_retry;		   /* EMM_OOM_RETRY (on) */
	bool hold_peak;		   /* EMM_HOLD_PEAK (on) */
	enum emm_opt_free_mode free_mode; /* EMM_FREE_MODE: fence|strict|stream */
	unsigned epoch_blocks;	   /* EMM_EPOCH_BLOCKS (64) */
	size_t epoch_bytes;	   /* EMM_EPOCH_BYTES (64M) */
	size_t pending_limit;	   /* EMM_PENDING_LIMIT (1G) */
	bool meminfo_cached;	   /* EMM_MEMINFO_CACHED: cuMemGetInfo counts idle cache as free (on) */
	bool pinned;		   /* EMM_PINNED: cache pinned host allocations (on) */
	bool runtime_shims;	   /* EMM_RUNTIME_SHIMS: serve shared-cudart cudaMalloc directly (on) */
	bool context_check;	   /* EMM_CONTEXT_CHECK: cuCtxGetId on every context lookup (off) */
	unsigned arenas;	   /* EMM_ARENAS: arenas per heap (0: one per CPU, <= 64) */
	bool thread_cache;	   /* EMM_THREAD_CACHE: per-thread front cache (off) */
	unsigned teardown_wait;	   /* EMM_TEARDOWN_WAIT: ms a teardown waits for threads inside (2000) */
	enum emm_opt_vmm vmm;	   /* EMM_VMM: cache|count|off (cache) */
	unsigned vmm_reap_ms;	   /* EMM_VMM_REAP_MS: a deferred VMM unmap/release waits this long (5) */
	char ipc_dir[256];	   /* EMM_IPC_DIR: where the IPC registry lives (/dev/shm) */
	unsigned poison;	   /* EMM_POISON: fill freed device blocks with this byte (256: off) */
	bool annotate;		   /* EMM_ANNOTATE: NVTX annotations under a memory checker (on) */
};

/* Row ids, in table order. */
enum emm_option_id {
	EMM_OPT_DISABLE,
	EMM_OPT_VERBOSE,
	EMM_OPT_STATS,
	EMM_OPT_STATS_SIGNAL,
	EMM_OPT_SNAPSHOT,
	EMM_OPT_LOG,
	EMM_OPT_BACKEND,
	EMM_OPT_BACKEND_OPTIONS,
	EMM_OPT_SMALL_SIZE,
	EMM_OPT_SMALL_SEGMENT,
	EMM_OPT_LARGE_SEGMENT,
	EMM_OPT_LARGE_ROUND,
	EMM_OPT_MAX_SPLIT,
	EMM_OPT_ROUNDUP_DIVISIONS,
	EMM_OPT_RELEASE_THRESHOLD,
	EMM_OPT_OOM_RETRY,
	EMM_OPT_HOLD_PEAK,
	EMM_OPT_FREE_MODE,
	EMM_OPT_EPOCH_BLOCKS,
	EMM_OPT_EPOCH_BYTES,
	EMM_OPT_PENDING_LIMIT,
	EMM_OPT_MEMINFO_CACHED,
	EMM_OPT_PINNED,
	EMM_OPT_RUNTIME_SHIMS,
	EMM_OPT_CONTEXT_CHECK,
	EMM_OPT_ARENAS,
	EMM_OPT_THREAD_CACHE,
	EMM_OPT_TEARDOWN_WAIT,
	EMM_OPT_VMM,
	EMM_OPT_VMM_REAP_MS,
	EMM_OPT_IPC_DIR,
	EMM_OPT_POISON,
	EMM_OPT_ANNOTATE,
	EMM_OPT__COUNT
};

/*
 * Parse an environment (NULL-terminated "NAME=value" strings) into *out,
 * recording each option's source in sources[] (may be NULL). Warnings go
 * through emm_warn. Never fails: bad values keep defaults.
 */
void emm_options_parse(char *const *envp, struct emm_options *out, enum emm_option_source *sources);

/* The process's settings: parsed from environ once, thread-safely, on first
 * call. */
const struct emm_options *emm_options_get(void);

/* Print version-independent "emm: NAME = value (source)" lines, one per
 * option, through emm_info. */
void emm_options_print(const struct emm_options *opts, const enum emm_option_source *sources);

/* The source of each option of emm_options_get()'s settings. */
const enum emm_option_source *emm_options_sources(void);

/* Write the options as a Markdown table (README's "Options" section is
 * checked against this output by a test). */
void emm_options_write_markdown(FILE *out);

/* A size the way a user would write it ("2M", "1536K", "unlimited"): the
 * largest binary unit that divides it exactly, so it parses back. */
void emm_options_format_size(size_t z, char *buf, size_t n);

/* Parse helpers, exposed for tests. 0 or -EINVAL; *ret untouched on error. */
int emm_parse_bool(const char *s, bool *ret);
int emm_parse_size(const char *s, bool allow_unlimited, size_t *ret);
int emm_parse_uint(const char *s, unsigned min, unsigned max, unsigned *ret);
/* A signal: a name with or without SIG (USR2, SIGUSR2, RTMIN+3, any case),
 * a number, or off/none/0 (0). Uncatchable and fault signals are refused. */
int emm_parse_signal(const char *s, unsigned *ret);
void emm_format_signal(unsigned sig, char *buf, size_t n);
/* EMM_STATS: a boolean (table or nothing), "table", "json" (JSON on
 * stderr), or a path (one with a '/' or ending in .json: JSON into it). */
int emm_parse_stats(const char *s, bool *ret_on, bool *ret_json, char *file, size_t file_size);

/* emm_options_parse with the secure mode given instead of read from
 * getauxval(AT_SECURE): when `secure`, EMM_BACKEND, EMM_LOG and EMM_IPC_DIR are ignored
 * with a warning (a setuid program must not dlopen or write where its
 * invoker says). For tests. */
void emm_options_parse_secure(char *const *envp, struct emm_options *out, enum emm_option_source *sources,
			      bool secure);

/* An option's name without the EMM_ prefix ("SMALL_SIZE"); NULL when `id`
 * is out of range. */
const char *emm_option_name(enum emm_option_id id);

/* An option's value in `opts` as emm_options_print writes it ("64M",
 * "fence"); "" when `id` is out of range. */
void emm_option_format(enum emm_option_id id, const struct emm_options *opts, char *buf, size_t n);

#endif
