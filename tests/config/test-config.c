/* SPDX-License-Identifier: MIT */
/*
 * tests/config/test-config.c - the EMM_* option table and its grammar.
 * Every environment here is a synthetic envp array (the real environment is
 * never consulted except by test_process_settings); log output is captured
 * in a temporary file and checked line by line.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "config/options.h"
#include "emm_test.h"

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static FILE *capture_file;

static void capture_begin(void)
{
	capture_file = tmpfile();
	if (!capture_file) {
		perror("tmpfile");
		exit(1);
	}
	emm_log_set_fd(fileno(capture_file));
}

/* Stop capturing; the text written since capture_begin() goes into buf.
 * Returns the number of lines. */
static int capture_end(char *buf, size_t n)
{
	size_t len;
	int lines = 0;

	emm_log_set_fd(-1);
	rewind(capture_file);
	len = fread(buf, 1, n - 1, capture_file);
	buf[len] = '\0';
	fclose(capture_file);
	capture_file = NULL;
	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n';
	return lines;
}

struct parsed {
	struct emm_options o;
	enum emm_option_source src[EMM_OPT__COUNT];
	char log[16384];
	int lines; /* lines of log output */
};

/* Parse a NULL-terminated list of "NAME=value" strings, not in secure mode. */
static void parse_env_mode(struct parsed *p, const char *const *env, bool secure)
{
	memset(p, 0, sizeof(*p));
	capture_begin();
	emm_options_parse_secure((char *const *)env, &p->o, p->src, secure);
	p->lines = capture_end(p->log, sizeof(p->log));
}

static void parse_env(struct parsed *p, const char *const *env)
{
	parse_env_mode(p, env, false);
}

/* Parse one variable. */
static void parse1(struct parsed *p, const char *var)
{
	const char *env[] = {var, NULL};
	parse_env(p, env);
}

static struct emm_options defaults(void)
{
	static const char *const env[] = {NULL};
	struct parsed p;

	parse_env(&p, env);
	return p.o;
}

/* Field by field (the struct has padding, so no memcmp). */
static bool options_equal(const struct emm_options *a, const struct emm_options *b)
{
	return a->disable == b->disable && a->verbose == b->verbose && a->stats == b->stats &&
	       strcmp(a->log_file, b->log_file) == 0 && strcmp(a->backend, b->backend) == 0 &&
	       strcmp(a->backend_options, b->backend_options) == 0 && a->small_size == b->small_size &&
	       a->small_segment == b->small_segment && a->large_segment == b->large_segment &&
	       a->large_round == b->large_round && a->max_split == b->max_split &&
	       a->roundup_divisions == b->roundup_divisions && a->release_threshold == b->release_threshold &&
	       a->oom_retry == b->oom_retry && a->hold_peak == b->hold_peak && a->free_mode == b->free_mode && a->epoch_blocks == b->epoch_blocks &&
	       a->epoch_bytes == b->epoch_bytes && a->pending_limit == b->pending_limit && a->meminfo_cached == b->meminfo_cached &&
	       a->pinned == b->pinned && a->runtime_shims == b->runtime_shims && a->arenas == b->arenas &&
	       a->teardown_wait == b->teardown_wait && a->vmm == b->vmm &&
	       a->vmm_reap_ms == b->vmm_reap_ms && strcmp(a->ipc_dir, b->ipc_dir) == 0 && a->poison == b->poison;
}

/* ------------------------------------------------------------------------
 * Defaults and the full table
 * ------------------------------------------------------------------------ */

static void expect_documented_defaults(const struct emm_options *o)
{
	expect_false(o->disable);
	expect_int_eq(o->verbose, 0);
	expect_false(o->stats);
	expect_str_eq(o->log_file, "");
	expect_str_eq(o->backend, "driver");
	expect_str_eq(o->backend_options, "");
	expect_u64_eq(o->small_size, 1u << 20);
	expect_u64_eq(o->small_segment, 2u << 20);
	expect_u64_eq(o->large_segment, 20u << 20);
	expect_u64_eq(o->large_round, 2u << 20);
	expect_u64_eq(o->max_split, SIZE_MAX);
	expect_int_eq(o->roundup_divisions, 0);
	expect_u64_eq(o->release_threshold, SIZE_MAX);
	expect_true(o->oom_retry);
	expect_true(o->hold_peak);
	expect_int_eq(o->free_mode, EMM_OPT_FREE_FENCE);
	expect_int_eq(o->epoch_blocks, 64);
	expect_int_eq(o->arenas, 0);
	expect_int_eq(o->teardown_wait, 2000);
	expect_int_eq(o->vmm_reap_ms, 5);
	expect_int_eq(o->poison, 256);
	expect_u64_eq(o->epoch_bytes, 64u << 20);
	expect_u64_eq(o->pending_limit, 1024u << 20);
	expect_true(o->meminfo_cached);
	expect_true(o->pinned);
	expect_true(o->runtime_shims);
	expect_int_eq(o->vmm, EMM_OPT_VMM_CACHE);
	expect_str_eq(o->ipc_dir, "/dev/shm");
}

TEST_BEGIN(test_defaults_when_unset)
{
	/* Other variables, reserved EMM_TEST_/EMM_BENCH_ ones and malformed
	 * entries without '=' are no options and no warnings. */
	static const char *const env[] = {
		"PATH=/usr/bin", "HOME=/root", "EMM_TEST_DELAY=5", "EMM_BENCH_ITERS=10",
		"EMM_VERBOSE",	 "XEMM_VERBOSE=9", "emm_verbose=9", NULL,
	};
	struct parsed p;

	parse_env(&p, env);
	expect_int_eq(p.lines, 0);
	expect_documented_defaults(&p.o);
	for (int i = 0; i < EMM_OPT__COUNT; i++)
		expect_int_eq(p.src[i], EMM_OPTION_DEFAULT);

	/* A NULL envp and a NULL sources array are allowed too. */
	capture_begin();
	emm_options_parse_secure(NULL, &p.o, NULL, false);
	expect_int_eq(capture_end(p.log, sizeof(p.log)), 0);
	expect_documented_defaults(&p.o);
}
TEST_END

TEST_BEGIN(test_every_option_from_env)
{
	static const char *const env[] = {
		"EMM_DISABLE=yes",
		"EMM_VERBOSE=3",
		"EMM_STATS=ON",
		"EMM_STATS_SIGNAL=SIGUSR2",
		"EMM_SNAPSHOT=/tmp/emm-%p.pickle",
		"EMM_LOG=/tmp/emm trace.csv",
		"EMM_BACKEND=/opt/emm/libemm-backend-vmm.so",
		"EMM_BACKEND_OPTIONS=granularity=2M,foo=bar",
		"EMM_SMALL_SIZE=512K",
		"EMM_SMALL_SEGMENT=4MiB",
		"EMM_LARGE_SEGMENT=64MB",
		"EMM_LARGE_ROUND=1m",
		"EMM_MAX_SPLIT=1G",
		"EMM_ROUNDUP_DIVISIONS=8",
		"EMM_RELEASE_THRESHOLD=0",
		"EMM_OOM_RETRY=off",
		"EMM_HOLD_PEAK=off",
		"EMM_FREE_MODE=Stream",
		"EMM_EPOCH_BLOCKS=65536",
		"EMM_EPOCH_BYTES=1T",
		"EMM_PENDING_LIMIT=256M",
		"EMM_MEMINFO_CACHED=False",
		"EMM_PINNED=0",
		"EMM_RUNTIME_SHIMS=NO",
		"EMM_CONTEXT_CHECK=on",
		"EMM_ARENAS=4",
		"EMM_THREAD_CACHE=on",
		"EMM_TEARDOWN_WAIT=250",
		"EMM_VMM=Count",
		"EMM_VMM_REAP_MS=250",
		"EMM_IPC_DIR=/run/user/1000",
		"EMM_POISON=165",
		"EMM_ANNOTATE=off",
		NULL,
	};
	struct parsed p;

	_Static_assert(EMM_ARRAY_SIZE(env) == EMM_OPT__COUNT + 1, "one variable per option");
	parse_env(&p, env);
	expect_int_eq(p.lines, 0);
	if (p.lines)
		fprintf(stderr, "%s", p.log);
	expect_true(p.o.disable);
	expect_int_eq(p.o.verbose, 3);
	expect_true(p.o.stats);
	expect_false(p.o.stats_json);
	expect_int_eq(p.o.stats_signal, SIGUSR2);
	expect_str_eq(p.o.snapshot_file, "/tmp/emm-%p.pickle");
	expect_str_eq(p.o.log_file, "/tmp/emm trace.csv");
	expect_str_eq(p.o.backend, "/opt/emm/libemm-backend-vmm.so");
	expect_str_eq(p.o.backend_options, "granularity=2M,foo=bar");
	expect_u64_eq(p.o.small_size, 512u << 10);
	expect_u64_eq(p.o.small_segment, 4u << 20);
	expect_u64_eq(p.o.large_segment, 64u << 20);
	expect_u64_eq(p.o.large_round, 1u << 20);
	expect_u64_eq(p.o.max_split, 1u << 30);
	expect_int_eq(p.o.roundup_divisions, 8);
	expect_u64_eq(p.o.release_threshold, 0);
	expect_false(p.o.oom_retry);
	expect_false(p.o.hold_peak);
	expect_int_eq(p.o.teardown_wait, 250);
	expect_int_eq(p.o.vmm_reap_ms, 250);
	expect_int_eq(p.o.poison, 165);
	expect_false(p.o.annotate);
	expect_int_eq(p.o.free_mode, EMM_OPT_FREE_STREAM);
	expect_int_eq(p.o.epoch_blocks, 65536);
	expect_u64_eq(p.o.epoch_bytes, (uint64_t)1 << 40);
	expect_u64_eq(p.o.pending_limit, 256u << 20);
	expect_false(p.o.meminfo_cached);
	expect_false(p.o.pinned);
	expect_false(p.o.runtime_shims);
	expect_true(p.o.context_check);
	expect_int_eq(p.o.arenas, 4);
	expect_true(p.o.thread_cache);
	expect_int_eq(p.o.vmm, EMM_OPT_VMM_COUNT);
	expect_str_eq(p.o.ipc_dir, "/run/user/1000");
	for (int i = 0; i < EMM_OPT__COUNT; i++)
		expect_int_eq(p.src[i], EMM_OPTION_ENV);
}
TEST_END

TEST_BEGIN(test_option_names)
{
	/* The names the table gives follow enum order (the table also checks
	 * this at compile time). */
	static const char *const names[EMM_OPT__COUNT] = {
		"DISABLE",	 "VERBOSE",	"STATS",	  "STATS_SIGNAL", "SNAPSHOT", "LOG", "BACKEND",
		"BACKEND_OPTIONS", "SMALL_SIZE", "SMALL_SEGMENT", "LARGE_SEGMENT", "LARGE_ROUND",
		"MAX_SPLIT",	 "ROUNDUP_DIVISIONS", "RELEASE_THRESHOLD", "OOM_RETRY", "HOLD_PEAK", "FREE_MODE",
		"EPOCH_BLOCKS",	 "EPOCH_BYTES", "PENDING_LIMIT", "MEMINFO_CACHED", "PINNED",	       "RUNTIME_SHIMS",
		"CONTEXT_CHECK", "ARENAS",	 "THREAD_CACHE", "TEARDOWN_WAIT", "VMM", "VMM_REAP_MS", "IPC_DIR", "POISON",
		"ANNOTATE",
	};
	_Static_assert(EMM_ARRAY_SIZE(names) == EMM_OPT__COUNT, "one name per option");

	for (int i = 0; i < EMM_OPT__COUNT; i++) {
		assert_ptr_not_null(emm_option_name((enum emm_option_id)i));
		expect_str_eq(emm_option_name((enum emm_option_id)i), names[i]);
	}
	expect_ptr_null(emm_option_name(EMM_OPT__COUNT));
}
TEST_END

/* ------------------------------------------------------------------------
 * The grammar, through the exposed helpers
 * ------------------------------------------------------------------------ */

TEST_BEGIN(test_parse_stats)
{
	static const struct {
		const char *in;
		int ret;
		bool on, json;
		const char *file;
	} cases[] = {
		{"1", 0, true, false, ""},		{"off", 0, false, false, ""},
		{"table", 0, true, false, ""},		{"JSON", 0, true, true, ""},
		{"/tmp/s.json", 0, true, true, "/tmp/s.json"}, {"stats-%p.json", 0, true, true, "stats-%p.json"},
		{"./stats", 0, true, true, "./stats"},	{"yes please", -EINVAL, false, false, ""},
		{"stats.txt", -EINVAL, false, false, ""}, {"", -EINVAL, false, false, ""},
	};

	for (size_t i = 0; i < EMM_ARRAY_SIZE(cases); i++) {
		bool on = !cases[i].on, json = !cases[i].json;
		char file[64] = "untouched";

		expect_int_eq(emm_parse_stats(cases[i].in, &on, &json, file, sizeof(file)), cases[i].ret);
		if (cases[i].ret < 0) {
			expect_str_eq(file, "untouched");
			continue;
		}
		expect_int_eq(on, cases[i].on);
		expect_int_eq(json, cases[i].json);
		expect_str_eq(file, cases[i].file);
	}
}
TEST_END

TEST_BEGIN(test_parse_signal)
{
	static const struct {
		const char *in;
		int ret;
		unsigned sig;
	} cases[] = {
		{"SIGUSR2", 0, SIGUSR2}, {"usr1", 0, SIGUSR1}, {"12", 0, 12},	 {"off", 0, 0},
		{"SigHup", 0, SIGHUP},	 {"RTMIN+2", 0, 0},	{"9", -EINVAL, 0}, {"SIGKILL", -EINVAL, 0},
		{"SIGSEGV", -EINVAL, 0}, {"11", -EINVAL, 0},	{"USR3", -EINVAL, 0}, {"", -EINVAL, 0},
		{"999", -EINVAL, 0},    {"32", -EINVAL, 0},	/* kept by the C library */
		{"33", -EINVAL, 0},
	};
	char name[32];

	for (size_t i = 0; i < EMM_ARRAY_SIZE(cases); i++) {
		unsigned sig = 777;
		unsigned want = strcmp(cases[i].in, "RTMIN+2") == 0 ? (unsigned)SIGRTMIN + 2 : cases[i].sig;

		expect_int_eq(emm_parse_signal(cases[i].in, &sig), cases[i].ret);
		expect_int_eq(sig, cases[i].ret < 0 ? 777u : want);
	}
	emm_format_signal(SIGUSR2, name, sizeof(name));
	expect_str_eq(name, "SIGUSR2");
	emm_format_signal((unsigned)SIGRTMIN + 1, name, sizeof(name));
	expect_str_eq(name, "SIGRTMIN+1");
	emm_format_signal(0, name, sizeof(name));
	expect_str_eq(name, "off");
}
TEST_END

TEST_BEGIN(test_parse_bool)
{
	static const char *const yes[] = {"1", "true", "yes", "on", "TRUE", "Yes", "ON", "tRuE"};
	static const char *const no[] = {"0", "false", "no", "off", "FALSE", "No", "OFF", "oFf"};
	static const char *const bad[] = {"", "2", "-1", "tru", "yess", "onn", "of", " 1", "1 ", "y", "n", "01", "enable"};

	for (size_t i = 0; i < EMM_ARRAY_SIZE(yes); i++) {
		bool v = false;
		expect_int_eq(emm_parse_bool(yes[i], &v), 0);
		expect_true(v);
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(no); i++) {
		bool v = true;
		expect_int_eq(emm_parse_bool(no[i], &v), 0);
		expect_false(v);
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(bad); i++) {
		bool v = true;
		if (emm_parse_bool(bad[i], &v) != -EINVAL)
			emm_test_fail_("'%s' accepted as a bool", bad[i]);
		expect_true(v); /* untouched */
	}
	expect_int_eq(emm_parse_bool(NULL, &(bool){0}), -EINVAL);
}
TEST_END

TEST_BEGIN(test_parse_size)
{
	static const struct {
		const char *s;
		size_t v;
	} good[] = {
		{"0", 0},
		{"1", 1},
		{"512", 512},
		{"512B", 512},
		{"512b", 512},
		{"1K", 1024},
		{"1k", 1024},
		{"1KB", 1024},
		{"1kb", 1024},
		{"1KiB", 1024},
		{"1kib", 1024},
		{"3K", 3072},
		{"2M", 2u << 20},
		{"2m", 2u << 20},
		{"2MB", 2u << 20},
		{"2MiB", 2u << 20},
		{"20M", 20u << 20},
		{"3G", (size_t)3 << 30},
		{"3GiB", (size_t)3 << 30},
		{"3GB", (size_t)3 << 30},
		{"1T", (size_t)1 << 40},
		{"1TiB", (size_t)1 << 40},
		{"16777215T", (size_t)16777215 << 40},
		{"0M", 0},
		{"007K", 7 << 10},
		{"18446744073709551615", SIZE_MAX},
	};
	static const char *const bad[] = {
		"",
		"-1",
		"-1M",
		"+1",
		"M",
		"K",
		"KiB",
		"iB",
		"B",
		"abc",
		"1X",
		"1Q",
		"1MiBB",
		"1KBB",
		"1Mi",
		"1iB",
		"1BB",
		"1 M",
		" 1M",
		"1M ",
		"1.5M",
		"0x10",
		"1e6",
		"1,000",
		"99999999999999999999G",
		"99999999999999999999",
		"18446744073709551616",
		"16777216T",
		"17179869184G",
		"unlimitedd",
		"inf",
	};
	static const char *const unlimited[] = {"unlimited", "UNLIMITED", "Unlimited", "none", "NONE"};

	for (size_t i = 0; i < EMM_ARRAY_SIZE(good); i++) {
		size_t v = 12345;
		if (emm_parse_size(good[i].s, false, &v) != 0 || v != good[i].v)
			emm_test_fail_("'%s': got %zu, expected %zu", good[i].s, v, good[i].v);
		v = 12345;
		if (emm_parse_size(good[i].s, true, &v) != 0 || v != good[i].v)
			emm_test_fail_("'%s' (unlimited allowed): got %zu, expected %zu", good[i].s, v, good[i].v);
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(bad); i++) {
		size_t v = 12345;
		if (emm_parse_size(bad[i], true, &v) != -EINVAL)
			emm_test_fail_("'%s' accepted as a size", bad[i]);
		expect_u64_eq(v, 12345); /* untouched */
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(unlimited); i++) {
		size_t v = 12345;
		expect_int_eq(emm_parse_size(unlimited[i], true, &v), 0);
		expect_u64_eq(v, SIZE_MAX);
		v = 12345;
		expect_int_eq(emm_parse_size(unlimited[i], false, &v), -EINVAL);
		expect_u64_eq(v, 12345);
	}
	expect_int_eq(emm_parse_size(NULL, true, &(size_t){0}), -EINVAL);
}
TEST_END

TEST_BEGIN(test_parse_uint)
{
	unsigned v;

	v = 99;
	expect_int_eq(emm_parse_uint("0", 0, 3, &v), 0);
	expect_int_eq(v, 0);
	expect_int_eq(emm_parse_uint("3", 0, 3, &v), 0);
	expect_int_eq(v, 3);
	expect_int_eq(emm_parse_uint("65536", 1, 65536, &v), 0);
	expect_int_eq(v, 65536);
	expect_int_eq(emm_parse_uint("4294967295", 0, UINT32_MAX, &v), 0);
	expect_u64_eq(v, UINT32_MAX);

	static const char *const bad[] = {"", "4", "-1", "-0", "+1", "abc", "1x", " 1", "1 ", "1.0", "0x1",
					  "4294967296", "99999999999999999999"};
	for (size_t i = 0; i < EMM_ARRAY_SIZE(bad); i++) {
		v = 77;
		if (emm_parse_uint(bad[i], 0, 3, &v) != -EINVAL)
			emm_test_fail_("'%s' accepted as an integer 0..3", bad[i]);
		expect_int_eq(v, 77);
	}
	v = 77;
	expect_int_eq(emm_parse_uint("0", 1, 10, &v), -EINVAL);
	expect_int_eq(emm_parse_uint("11", 1, 10, &v), -EINVAL);
	expect_int_eq(emm_parse_uint("4294967296", 0, UINT32_MAX, &v), -EINVAL);
	expect_int_eq(v, 77);
	expect_int_eq(emm_parse_uint(NULL, 0, 3, &v), -EINVAL);
}
TEST_END

/* ------------------------------------------------------------------------
 * Bad values in the environment: one warning each, default kept
 * ------------------------------------------------------------------------ */

/* Check that `var` ("EMM_X=value") gives exactly one warning line, of the
 * documented shape, and leaves every option at its default. */
static void expect_one_invalid(const char *var, enum emm_option_id id)
{
	char prefix[300], value[300];
	const char *eq = strchr(var, '=');
	struct emm_options def = defaults();
	struct parsed p;

	parse1(&p, var);
	snprintf(value, sizeof(value), "%s", eq + 1);
	snprintf(prefix, sizeof(prefix), "emm: warning: EMM_%s='", emm_option_name(id));
	if (p.lines != 1) {
		emm_test_fail_("%s: %d lines of output, expected 1:\n%s", var, p.lines, p.log);
		return;
	}
	if (strncmp(p.log, prefix, strlen(prefix)) != 0)
		emm_test_fail_("%s: the warning does not start with \"%s\": %s", var, prefix, p.log);
	if (strlen(value) < 64 && strncmp(p.log + strlen(prefix), value, strlen(value)) != 0)
		emm_test_fail_("%s: the warning does not quote the value: %s", var, p.log);
	if (!strstr(p.log, "' is not valid: expected ") || !strstr(p.log, "; using default "))
		emm_test_fail_("%s: the warning is not of the documented shape: %s", var, p.log);
	if (!options_equal(&p.o, &def))
		emm_test_fail_("%s: a setting changed", var);
	for (int i = 0; i < EMM_OPT__COUNT; i++)
		if (p.src[i] != (i == (int)id ? EMM_OPTION_INVALID : EMM_OPTION_DEFAULT))
			emm_test_fail_("%s: source of EMM_%s is %d", var, emm_option_name((enum emm_option_id)i),
				       (int)p.src[i]);
}

static void expect_invalid_values(enum emm_option_id id, const char *const *values, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char var[400];
		snprintf(var, sizeof(var), "EMM_%s=%s", emm_option_name(id), values[i]);
		expect_one_invalid(var, id);
	}
}

#define EXPECT_INVALID(id, ...)                                              \
	do {                                                                 \
		const char *const v_[] = {__VA_ARGS__};                      \
		expect_invalid_values(id, v_, EMM_ARRAY_SIZE(v_));           \
	} while (0)

#define BAD_BOOL "", "2", "-1", "maybe", "yes please", "o", "10"
#define BAD_SIZE                                                                                  \
	"", "-1", "-2M", "abc", "99999999999999999999G", "99999999999999999999", "16777216T", "M", \
		"KiB", "1.5M", "12Q", "1 M", "0x100", "unlimitedd"

TEST_BEGIN(test_invalid_bools)
{
	static const enum emm_option_id bools[] = {EMM_OPT_DISABLE,   EMM_OPT_STATS,	     EMM_OPT_OOM_RETRY,
						   EMM_OPT_MEMINFO_CACHED, EMM_OPT_PINNED, EMM_OPT_RUNTIME_SHIMS,
						   EMM_OPT_CONTEXT_CHECK};
	for (size_t i = 0; i < EMM_ARRAY_SIZE(bools); i++)
		EXPECT_INVALID(bools[i], BAD_BOOL);
}
TEST_END

TEST_BEGIN(test_invalid_sizes)
{
	/* Every size option; the ones without "unlimited" also refuse it. */
	EXPECT_INVALID(EMM_OPT_SMALL_SIZE, BAD_SIZE, "unlimited", "none");
	EXPECT_INVALID(EMM_OPT_SMALL_SEGMENT, BAD_SIZE, "unlimited", "0", "1000", "513", "1");
	EXPECT_INVALID(EMM_OPT_LARGE_SEGMENT, BAD_SIZE, "unlimited", "0", "1000", "100B");
	EXPECT_INVALID(EMM_OPT_LARGE_ROUND, BAD_SIZE, "unlimited", "0", "0M", "1000", "511");
	EXPECT_INVALID(EMM_OPT_MAX_SPLIT, BAD_SIZE, "nothing");
	EXPECT_INVALID(EMM_OPT_RELEASE_THRESHOLD, BAD_SIZE, "never");
	EXPECT_INVALID(EMM_OPT_EPOCH_BYTES, BAD_SIZE, "unlimited", "0");
}
TEST_END

TEST_BEGIN(test_invalid_uints)
{
	EXPECT_INVALID(EMM_OPT_VERBOSE, "", "4", "-1", "99999999999", "abc", "1.0", "2x", "on", "+1");
	EXPECT_INVALID(EMM_OPT_EPOCH_BLOCKS, "", "0", "65537", "-16", "99999999999999999999", "16K", "lots");
	EXPECT_INVALID(EMM_OPT_ARENAS, "", "65", "-1", "auto", "1.5", "99999999999");
	/* 0 or a power of two up to 64. */
	EXPECT_INVALID(EMM_OPT_ROUNDUP_DIVISIONS, "", "3", "6", "12", "63", "65", "128", "-4", "abc", "4294967296");
}
TEST_END

TEST_BEGIN(test_invalid_enum)
{
	EXPECT_INVALID(EMM_OPT_FREE_MODE, "", "fast", "fenc", "fences", "fence,strict", " fence", "0", "1", "default");
	EXPECT_INVALID(EMM_OPT_VMM, "", "on", "1", "caches", "cache,count", "none");
}
TEST_END

TEST_BEGIN(test_invalid_strings)
{
	char long_value[300];

	/* 256 bytes do not fit (the buffer keeps a NUL): warning, default kept.
	 * The warning quotes a shortened value. */
	memset(long_value, 'x', 256);
	long_value[256] = '\0';
	EXPECT_INVALID(EMM_OPT_LOG, long_value);
	EXPECT_INVALID(EMM_OPT_BACKEND, long_value, "");
	EXPECT_INVALID(EMM_OPT_BACKEND_OPTIONS, long_value);

	/* 255 bytes fit exactly. */
	{
		char var[sizeof(long_value) + 16];
		struct parsed p;

		long_value[255] = '\0';
		snprintf(var, sizeof(var), "EMM_LOG=%s", long_value);
		parse1(&p, var);
		expect_int_eq(p.lines, 0);
		expect_str_eq(p.o.log_file, long_value);
		expect_int_eq(p.src[EMM_OPT_LOG], EMM_OPTION_ENV);
	}
	/* An empty log path is a valid "off". */
	{
		struct parsed p;
		parse1(&p, "EMM_LOG=");
		expect_int_eq(p.lines, 0);
		expect_str_eq(p.o.log_file, "");
		expect_int_eq(p.src[EMM_OPT_LOG], EMM_OPTION_ENV);
	}
}
TEST_END

TEST_BEGIN(test_warning_text)
{
	struct parsed p;
	char value[200];

	parse1(&p, "EMM_VERBOSE=7");
	expect_str_eq(p.log,
		      "emm: warning: EMM_VERBOSE='7' is not valid: expected an integer from 0 to 3; using default 0\n");
	parse1(&p, "EMM_OOM_RETRY=maybe");
	expect_str_eq(p.log, "emm: warning: EMM_OOM_RETRY='maybe' is not valid: expected 1/true/yes/on or "
			     "0/false/no/off; using default on\n");
	parse1(&p, "EMM_FREE_MODE=fast");
	expect_str_eq(p.log, "emm: warning: EMM_FREE_MODE='fast' is not valid: expected one of fence, strict, "
			     "stream; using default fence\n");
	parse1(&p, "EMM_ROUNDUP_DIVISIONS=3");
	expect_str_eq(p.log, "emm: warning: EMM_ROUNDUP_DIVISIONS='3' is not valid: expected 0 or a power of two "
			     "up to 64; using default 0\n");
	parse1(&p, "EMM_MAX_SPLIT=-1");
	expect_str_eq(p.log, "emm: warning: EMM_MAX_SPLIT='-1' is not valid: expected a size in bytes with an "
			     "optional K/M/G/T suffix (e.g. 512K, 2M, 1GiB), or unlimited; using default unlimited\n");
	parse1(&p, "EMM_LARGE_ROUND=1000");
	expect_str_eq(p.log, "emm: warning: EMM_LARGE_ROUND='1000' is not valid: expected a non-zero multiple of "
			     "512 bytes with an optional K/M/G/T suffix (e.g. 512K, 2M, 1GiB); using default 2M\n");
	parse1(&p, "EMM_BACKEND=");
	expect_str_eq(p.log, "emm: warning: EMM_BACKEND='' is not valid: expected a non-empty string of at most "
			     "255 bytes; using default driver\n");

	/* Control characters are not echoed; long values are cut. */
	parse1(&p, "EMM_STATS=a\033[2Jb");
	expect_true(strstr(p.log, "EMM_STATS='a?[2Jb'") != NULL);
	memset(value, '9', sizeof(value) - 1);
	value[sizeof(value) - 1] = '\0';
	{
		char var[250];
		snprintf(var, sizeof(var), "EMM_VERBOSE=%s", value);
		parse1(&p, var);
	}
	expect_int_eq(p.lines, 1);
	expect_true(strstr(p.log, "99...' is not valid") != NULL);
	expect_true(strlen(p.log) < 250);
}
TEST_END

/* Sizes in the environment: suffixes, "unlimited", plain bytes. */
TEST_BEGIN(test_size_forms_in_env)
{
	struct parsed p;

	parse1(&p, "EMM_RELEASE_THRESHOLD=unlimited");
	expect_int_eq(p.lines, 0);
	expect_u64_eq(p.o.release_threshold, SIZE_MAX);
	expect_int_eq(p.src[EMM_OPT_RELEASE_THRESHOLD], EMM_OPTION_ENV);

	parse1(&p, "EMM_MAX_SPLIT=None");
	expect_int_eq(p.lines, 0);
	expect_u64_eq(p.o.max_split, SIZE_MAX);
	expect_int_eq(p.src[EMM_OPT_MAX_SPLIT], EMM_OPTION_ENV);

	parse1(&p, "EMM_RELEASE_THRESHOLD=1073741824");
	expect_u64_eq(p.o.release_threshold, (uint64_t)1 << 30);

	parse1(&p, "EMM_EPOCH_BYTES=100KiB");
	expect_u64_eq(p.o.epoch_bytes, 100u << 10);

	parse1(&p, "EMM_SMALL_SEGMENT=1536K");
	expect_int_eq(p.lines, 0);
	expect_u64_eq(p.o.small_segment, 1536u << 10);

	parse1(&p, "EMM_SMALL_SIZE=0");
	expect_int_eq(p.lines, 0);
	expect_u64_eq(p.o.small_size, 0);
	expect_int_eq(p.src[EMM_OPT_SMALL_SIZE], EMM_OPTION_ENV);

	/* A value equal to the default still counts as set from the env. */
	parse1(&p, "EMM_LARGE_SEGMENT=20M");
	expect_int_eq(p.src[EMM_OPT_LARGE_SEGMENT], EMM_OPTION_ENV);
}
TEST_END

TEST_BEGIN(test_uint_and_enum_forms_in_env)
{
	static const unsigned divisions[] = {0, 1, 2, 4, 8, 16, 32, 64};
	static const char *const modes[] = {"fence", "strict", "stream"};
	struct parsed p;

	for (size_t i = 0; i < EMM_ARRAY_SIZE(divisions); i++) {
		char var[64];
		snprintf(var, sizeof(var), "EMM_ROUNDUP_DIVISIONS=%u", divisions[i]);
		parse1(&p, var);
		expect_int_eq(p.lines, 0);
		expect_int_eq(p.o.roundup_divisions, divisions[i]);
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(modes); i++) {
		char var[64];
		snprintf(var, sizeof(var), "EMM_FREE_MODE=%s", modes[i]);
		parse1(&p, var);
		expect_int_eq(p.lines, 0);
		expect_int_eq(p.o.free_mode, (int)i);
	}
	parse1(&p, "EMM_FREE_MODE=STRICT");
	expect_int_eq(p.o.free_mode, EMM_OPT_FREE_STRICT);
	parse1(&p, "EMM_VMM=off");
	expect_int_eq(p.lines, 0);
	expect_int_eq(p.o.vmm, EMM_OPT_VMM_OFF);
	parse1(&p, "EMM_VMM=cache");
	expect_int_eq(p.o.vmm, EMM_OPT_VMM_CACHE);
	parse1(&p, "EMM_EPOCH_BLOCKS=1");
	expect_int_eq(p.lines, 0);
	expect_int_eq(p.o.epoch_blocks, 1);
	parse1(&p, "EMM_VERBOSE=0");
	expect_int_eq(p.src[EMM_OPT_VERBOSE], EMM_OPTION_ENV);
}
TEST_END

TEST_BEGIN(test_first_occurrence_wins)
{
	/* As with getenv: the first entry counts, later ones are not parsed
	 * (and not warned about). */
	static const char *const env[] = {"EMM_VERBOSE=2", "EMM_VERBOSE=1", "EMM_VERBOSE=bad", NULL};
	static const char *const env2[] = {"EMM_STATS=bad", "EMM_STATS=1", NULL};
	struct parsed p;

	parse_env(&p, env);
	expect_int_eq(p.lines, 0);
	expect_int_eq(p.o.verbose, 2);
	parse_env(&p, env2);
	expect_int_eq(p.lines, 1);
	expect_false(p.o.stats);
	expect_int_eq(p.src[EMM_OPT_STATS], EMM_OPTION_INVALID);
}
TEST_END

TEST_BEGIN(test_several_bad_values)
{
	/* One line per bad variable, the good ones still apply. */
	static const char *const env[] = {"EMM_VERBOSE=9", "EMM_STATS=1",	    "EMM_SMALL_SIZE=lots",
					  "EMM_PINNED=0",  "EMM_FREE_MODE=never", "EMM_NOPE=1",
					  NULL};
	struct parsed p;

	parse_env(&p, env);
	expect_int_eq(p.lines, 4);
	expect_true(strstr(p.log, "EMM_VERBOSE='9'") != NULL);
	expect_true(strstr(p.log, "EMM_SMALL_SIZE='lots'") != NULL);
	expect_true(strstr(p.log, "EMM_FREE_MODE='never'") != NULL);
	expect_true(strstr(p.log, "unknown variable EMM_NOPE") != NULL);
	expect_true(p.o.stats);
	expect_false(p.o.pinned);
	expect_int_eq(p.src[EMM_OPT_VERBOSE], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_STATS], EMM_OPTION_ENV);
	expect_int_eq(p.src[EMM_OPT_SMALL_SIZE], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_PINNED], EMM_OPTION_ENV);
	expect_int_eq(p.src[EMM_OPT_FREE_MODE], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_BACKEND], EMM_OPTION_DEFAULT);
}
TEST_END

/* ------------------------------------------------------------------------
 * Cross-option checks
 * ------------------------------------------------------------------------ */

TEST_BEGIN(test_cross_option_checks)
{
	struct parsed p;

	/* SMALL_SIZE above the default SMALL_SEGMENT: SMALL_SIZE goes back. */
	parse1(&p, "EMM_SMALL_SIZE=4M");
	expect_int_eq(p.lines, 1);
	expect_str_eq(p.log, "emm: warning: EMM_SMALL_SIZE=4M must be at most EMM_SMALL_SEGMENT=2M; using "
			     "default EMM_SMALL_SIZE=1M\n");
	expect_u64_eq(p.o.small_size, 1u << 20);
	expect_int_eq(p.src[EMM_OPT_SMALL_SIZE], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_SMALL_SEGMENT], EMM_OPTION_DEFAULT);

	/* Both set and inconsistent: both go back. */
	{
		static const char *const env[] = {"EMM_SMALL_SIZE=1M", "EMM_SMALL_SEGMENT=512K", NULL};
		parse_env(&p, env);
		expect_int_eq(p.lines, 1);
		expect_true(strstr(p.log, "using default EMM_SMALL_SIZE=1M and EMM_SMALL_SEGMENT=2M") != NULL);
		expect_u64_eq(p.o.small_size, 1u << 20);
		expect_u64_eq(p.o.small_segment, 2u << 20);
		expect_int_eq(p.src[EMM_OPT_SMALL_SIZE], EMM_OPTION_INVALID);
		expect_int_eq(p.src[EMM_OPT_SMALL_SEGMENT], EMM_OPTION_INVALID);
	}
	/* Consistent pairs are fine, equality included. */
	{
		static const char *const env[] = {"EMM_SMALL_SIZE=4M", "EMM_SMALL_SEGMENT=4M", NULL};
		parse_env(&p, env);
		expect_int_eq(p.lines, 0);
		expect_u64_eq(p.o.small_size, 4u << 20);
		expect_u64_eq(p.o.small_segment, 4u << 20);
	}

	/* LARGE_ROUND above LARGE_SEGMENT. */
	parse1(&p, "EMM_LARGE_ROUND=32M");
	expect_int_eq(p.lines, 1);
	expect_true(strstr(p.log, "EMM_LARGE_ROUND=32M must be at most EMM_LARGE_SEGMENT=20M") != NULL);
	expect_u64_eq(p.o.large_round, 2u << 20);

	/* MAX_SPLIT must leave large segments splittable. */
	parse1(&p, "EMM_MAX_SPLIT=20M");
	expect_int_eq(p.lines, 1);
	expect_true(strstr(p.log, "EMM_LARGE_SEGMENT=20M must be smaller than EMM_MAX_SPLIT=20M") != NULL);
	expect_u64_eq(p.o.max_split, SIZE_MAX);
	expect_int_eq(p.src[EMM_OPT_MAX_SPLIT], EMM_OPTION_INVALID);
	parse1(&p, "EMM_MAX_SPLIT=40M");
	expect_int_eq(p.lines, 0);
	expect_u64_eq(p.o.max_split, 40u << 20);

	/* A reset by one relation can break an earlier one: that is checked
	 * again, so what comes out is consistent. */
	{
		static const char *const env[] = {"EMM_LARGE_SEGMENT=100M", "EMM_LARGE_ROUND=50M",
						  "EMM_MAX_SPLIT=60M", NULL};
		parse_env(&p, env);
		expect_int_eq(p.lines, 2);
		expect_true(p.o.large_round <= p.o.large_segment);
		expect_true(p.o.large_segment < p.o.max_split);
		expect_u64_eq(p.o.large_segment, 20u << 20);
		expect_u64_eq(p.o.large_round, 2u << 20);
	}
	/* An invalid value is one warning only, not a second relation warning. */
	parse1(&p, "EMM_SMALL_SEGMENT=1000");
	expect_int_eq(p.lines, 1);
	expect_u64_eq(p.o.small_segment, 2u << 20);
}
TEST_END

/* ------------------------------------------------------------------------
 * Unknown variables
 * ------------------------------------------------------------------------ */

static void expect_unknown(const char *var, const char *expected_line)
{
	struct emm_options def = defaults();
	struct parsed p;

	parse1(&p, var);
	if (p.lines != 1 || strcmp(p.log, expected_line) != 0)
		emm_test_fail_("%s: got \"%s\", expected \"%s\"", var, p.log, expected_line);
	if (!options_equal(&p.o, &def))
		emm_test_fail_("%s: changed a setting", var);
	for (int i = 0; i < EMM_OPT__COUNT; i++)
		expect_int_eq(p.src[i], EMM_OPTION_DEFAULT);
}

TEST_BEGIN(test_unknown_variables)
{
	expect_unknown("EMM_VERBOS=1", "emm: warning: unknown variable EMM_VERBOS; did you mean EMM_VERBOSE?\n");
	expect_unknown("EMM_VERBOSEE=1",
		       "emm: warning: unknown variable EMM_VERBOSEE; did you mean EMM_VERBOSE?\n");
	expect_unknown("EMM_verbose=1", "emm: warning: unknown variable EMM_verbose; did you mean EMM_VERBOSE?\n");
	expect_unknown("EMM_SMALL_SEGMET=4M",
		       "emm: warning: unknown variable EMM_SMALL_SEGMET; did you mean EMM_SMALL_SEGMENT?\n");
	expect_unknown("EMM_FREEMODE=strict",
		       "emm: warning: unknown variable EMM_FREEMODE; did you mean EMM_FREE_MODE?\n");
	expect_unknown("EMM_ROUNDUP_DIVISION=4",
		       "emm: warning: unknown variable EMM_ROUNDUP_DIVISION; did you mean EMM_ROUNDUP_DIVISIONS?\n");
	expect_unknown("EMM_STAT=1", "emm: warning: unknown variable EMM_STAT; did you mean EMM_STATS?\n");
	/* Nothing close: no suggestion. */
	expect_unknown("EMM_FOO=1", "emm: warning: unknown variable EMM_FOO\n");
	expect_unknown("EMM_GARBAGE_COLLECT=1", "emm: warning: unknown variable EMM_GARBAGE_COLLECT\n");
	expect_unknown("EMM_=1", "emm: warning: unknown variable EMM_\n");
	expect_unknown("EMM_TEST=1", "emm: warning: unknown variable EMM_TEST\n");
	/* A very long name is cut in the message. */
	{
		char var[200], line[200];
		memset(var, 'A', sizeof(var));
		memcpy(var, "EMM_", 4);
		strcpy(var + 150, "=1");
		snprintf(line, sizeof(line), "emm: warning: unknown variable %.64s...\n", var);
		expect_unknown(var, line);
	}

	/* The unknown variable does not disturb the others. */
	{
		static const char *const env[] = {"EMM_VERBOS=1", "EMM_VERBOSE=2", NULL};
		struct parsed p;
		parse_env(&p, env);
		expect_int_eq(p.lines, 1);
		expect_int_eq(p.o.verbose, 2);
	}
}
TEST_END

/* ------------------------------------------------------------------------
 * Secure mode (setuid programs)
 * ------------------------------------------------------------------------ */

TEST_BEGIN(test_secure_mode)
{
	static const char *const env[] = {"EMM_BACKEND=/tmp/evil.so", "EMM_LOG=/etc/passwd",
					  "EMM_BACKEND_OPTIONS=x=1", "EMM_VERBOSE=1", "EMM_IPC_DIR=/tmp/evil", NULL};
	struct parsed p;

	parse_env_mode(&p, env, true);
	expect_int_eq(p.lines, 3);
	expect_true(strstr(p.log, "emm: warning: EMM_IPC_DIR is ignored in a setuid/setgid program; using "
				  "default /dev/shm\n") != NULL);
	expect_str_eq(p.o.ipc_dir, "/dev/shm");
	expect_true(strstr(p.log, "emm: warning: EMM_BACKEND is ignored in a setuid/setgid program; using "
				  "default driver\n") != NULL);
	expect_true(strstr(p.log, "emm: warning: EMM_LOG is ignored in a setuid/setgid program; using "
				  "default \"\"\n") != NULL);
	expect_str_eq(p.o.backend, "driver");
	expect_str_eq(p.o.log_file, "");
	expect_str_eq(p.o.backend_options, "x=1");
	expect_int_eq(p.o.verbose, 1);
	expect_int_eq(p.src[EMM_OPT_BACKEND], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_LOG], EMM_OPTION_INVALID);
	expect_int_eq(p.src[EMM_OPT_BACKEND_OPTIONS], EMM_OPTION_ENV);

	/* The same environment, not secure: all taken. */
	parse_env_mode(&p, env, false);
	expect_int_eq(p.lines, 0);
	expect_str_eq(p.o.backend, "/tmp/evil.so");
	expect_str_eq(p.o.log_file, "/etc/passwd");
	expect_str_eq(p.o.ipc_dir, "/tmp/evil");

	/* This test program is not setuid: emm_options_parse is not secure. */
	capture_begin();
	emm_options_parse((char *const *)env, &p.o, p.src);
	expect_int_eq(capture_end(p.log, sizeof(p.log)), 0);
	expect_str_eq(p.o.backend, "/tmp/evil.so");
}
TEST_END

/* ------------------------------------------------------------------------
 * Printing
 * ------------------------------------------------------------------------ */

TEST_BEGIN(test_print)
{
	static const char *const env[] = {"EMM_VERBOSE=1", "EMM_STATS=maybe", "EMM_MAX_SPLIT=64M",
					  "EMM_EPOCH_BYTES=3072", "EMM_SMALL_SEGMENT=1536K", NULL};
	struct parsed p;
	char out[8192];
	int lines;

	parse_env(&p, env);
	expect_int_eq(p.lines, 1);
	capture_begin();
	emm_options_print(&p.o, p.src);
	lines = capture_end(out, sizeof(out));
	expect_int_eq(lines, EMM_OPT__COUNT);

	/* One line per option, in table order, each "emm: EMM_NAME = value (source)". */
	{
		const char *line = out;
		for (int i = 0; i < EMM_OPT__COUNT && *line; i++) {
			char name[64];
			const char *nl = strchr(line, '\n');
			snprintf(name, sizeof(name), "emm: EMM_%s ", emm_option_name((enum emm_option_id)i));
			if (strncmp(line, name, strlen(name)) != 0)
				emm_test_fail_("line %d is \"%.*s\", expected it to start \"%s\"", i,
					       (int)(nl - line), line, name);
			line = nl + 1;
		}
	}
#define EXPECT_LINE(name, rest)                                                      \
	do {                                                                         \
		const char *l_ = strstr(out, "emm: EMM_" name " ");                 \
		if (!l_ || !strstr(l_, rest) || strstr(l_, rest) > strchr(l_, '\n')) \
			emm_test_fail_("no line \"" name " ... " rest "\" in:\n%s", out); \
	} while (0)
	EXPECT_LINE("VERBOSE", "= 1 (env)\n");
	EXPECT_LINE("STATS", "= off (invalid, using default)\n");
	EXPECT_LINE("DISABLE", "= off (default)\n");
	EXPECT_LINE("BACKEND", "= driver (default)\n");
	EXPECT_LINE("LOG", "= \"\" (default)\n");
	EXPECT_LINE("SMALL_SIZE", "= 1M (default)\n");
	EXPECT_LINE("SMALL_SEGMENT", "= 1536K (env)\n");
	EXPECT_LINE("LARGE_SEGMENT", "= 20M (default)\n");
	EXPECT_LINE("MAX_SPLIT", "= 64M (env)\n");
	EXPECT_LINE("RELEASE_THRESHOLD", "= unlimited (default)\n");
	EXPECT_LINE("EPOCH_BYTES", "= 3K (env)\n");
	EXPECT_LINE("FREE_MODE", "= fence (default)\n");
	EXPECT_LINE("OOM_RETRY", "= on (default)\n");
	EXPECT_LINE("EPOCH_BLOCKS", "= 64 (default)\n");

	/* Without sources every line says default. */
	capture_begin();
	emm_options_print(&p.o, NULL);
	lines = capture_end(out, sizeof(out));
	expect_int_eq(lines, EMM_OPT__COUNT);
	expect_true(strstr(out, "(env)") == NULL);
}
TEST_END

/* Printed sizes parse back to the same value. */
TEST_BEGIN(test_printed_sizes_parse_back)
{
	static const char *const sizes[] = {"0", "1", "511", "512", "1536", "1K", "1025K", "3M", "1G", "5T",
					    "2048T", "unlimited", "123456789"};
	for (size_t i = 0; i < EMM_ARRAY_SIZE(sizes); i++) {
		char var[64], out[8192], printed[64] = "";
		const char *l;
		struct parsed p;
		size_t v;

		snprintf(var, sizeof(var), "EMM_RELEASE_THRESHOLD=%s", sizes[i]);
		parse1(&p, var);
		expect_int_eq(p.lines, 0);
		capture_begin();
		emm_options_print(&p.o, p.src);
		capture_end(out, sizeof(out));
		l = strstr(out, "EMM_RELEASE_THRESHOLD");
		assert_ptr_not_null(l);
		assert_int_eq(sscanf(strchr(l, '=') + 1, " %63s", printed), 1);
		expect_int_eq(emm_parse_size(printed, true, &v), 0);
		expect_u64_eq(v, p.o.release_threshold);
	}
}
TEST_END

TEST_BEGIN(test_markdown)
{
	FILE *f = tmpfile();
	char buf[16384];
	size_t len;
	int lines = 0;
	const char *line;

	assert_ptr_not_null(f);
	emm_options_write_markdown(f);
	rewind(f);
	len = fread(buf, 1, sizeof(buf) - 1, f);
	buf[len] = '\0';
	fclose(f);

	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n';
	expect_int_eq(lines, 2 + EMM_OPT__COUNT);
	{
		static const char head[] = "| Variable | Type | Default | Description |\n|---|---|---|---|\n";
		expect_true(strncmp(buf, head, strlen(head)) == 0);
	}

	/* Each row: `EMM_NAME`, in table order, exactly five '|' (so no
	 * description breaks the table), no line over 200 characters. */
	line = strchr(strchr(buf, '\n') + 1, '\n') + 1;
	for (int i = 0; i < EMM_OPT__COUNT && *line; i++) {
		char start[64];
		const char *nl = strchr(line, '\n');
		int bars = 0;

		snprintf(start, sizeof(start), "| `EMM_%s` | ", emm_option_name((enum emm_option_id)i));
		if (strncmp(line, start, strlen(start)) != 0)
			emm_test_fail_("row %d: \"%.*s\"", i, (int)(nl - line), line);
		for (const char *c = line; c < nl; c++)
			bars += *c == '|';
		expect_int_eq(bars, 5);
		expect_true(nl - line < 260);
		line = nl + 1;
	}
	expect_true(strstr(buf, "| `EMM_SMALL_SIZE` | size (bytes) | `1M` | ") != NULL);
	expect_true(strstr(buf, "| `EMM_MAX_SPLIT` | size (bytes) or `unlimited` | `unlimited` | ") != NULL);
	expect_true(strstr(buf, "| `EMM_FREE_MODE` | one of fence, strict, stream | `fence` | ") != NULL);
	expect_true(strstr(buf, "| `EMM_BACKEND` | string (name or path) | `driver` | ") != NULL);
	expect_true(strstr(buf, "| `EMM_OOM_RETRY` | bool | `on` | ") != NULL);
}
TEST_END

/* ------------------------------------------------------------------------
 * The process's settings
 * ------------------------------------------------------------------------ */

TEST_BEGIN(test_process_settings)
{
	/* Whatever the real environment says (meson may set EMM_ variables),
	 * the settings are parsed once: the same object every time, and the
	 * same result as parsing environ again. */
	extern char **environ;
	const struct emm_options *a, *b;
	const enum emm_option_source *sa;
	struct parsed p;

	capture_begin();
	a = emm_options_get();
	b = emm_options_get();
	sa = emm_options_sources();
	(void)capture_end(p.log, sizeof(p.log));
	assert_ptr_not_null(a);
	assert_ptr_not_null(sa);
	expect_ptr_eq(a, b);
	expect_ptr_eq(sa, emm_options_sources());

	parse_env(&p, (const char *const *)environ);
	expect_true(options_equal(&p.o, a));
	expect_true(memcmp(p.src, sa, sizeof(p.src)) == 0);
}
TEST_END

int main(void)
{
	return emm_test_run(test_defaults_when_unset, test_every_option_from_env, test_option_names,
			    test_parse_bool, test_parse_size, test_parse_stats, test_parse_signal, test_parse_uint, test_invalid_bools,
			    test_invalid_sizes, test_invalid_uints, test_invalid_enum, test_invalid_strings,
			    test_warning_text, test_size_forms_in_env, test_uint_and_enum_forms_in_env,
			    test_first_occurrence_wins, test_several_bad_values, test_cross_option_checks,
			    test_unknown_variables, test_secure_mode, test_print, test_printed_sizes_parse_back,
			    test_markdown, test_process_settings, NULL);
}
