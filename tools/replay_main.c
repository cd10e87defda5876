/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_main.c - the emm-replay command: replays an allocation trace
 * (libemm's EMM_LOG or RMM's logging_resource_adaptor CSV) through libemm's
 * allocator on the host-simulation backend, with no GPU. Owns the command
 * line, the EMM_* settings of each run (parsed by config/options.c, mapped
 * onto struct emm_heap_params as the process layer does), --min-capacity's
 * bisection and --compare's table.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap_options.h"
#include "common/compiler.h"
#include "config/options.h"
#include "emm/emm_version.h"
#include "tools/replay_report.h"
#include "tools/replay_run.h"
#include "tools/replay_trace.h"

extern char **environ;

#define MIB (UINT64_C(1) << 20)
#define MAX_SETTINGS 32
#define MAX_TOKENS 32

static void usage(FILE *out)
{
	fprintf(out,
		"usage: emm-replay [options] TRACE.csv\n"
		"Replays an allocation trace (libemm's EMM_LOG, or RMM's logging_resource_adaptor CSV:\n"
		"Thread,Time,Action,Pointer,Size,Stream) through libemm's allocator on the host-simulation\n"
		"backend: no GPU needed. EMM_* variables in the environment set the allocator as in libemm.\n"
		"\n"
		"  --capacity SIZE       simulated device size (default 80G; K/M/G/T suffixes, binary)\n"
		"  --min-capacity        find the smallest simulated device the trace replays on\n"
		"  --step SIZE           granule of --min-capacity (default 2M)\n"
		"  --compare SETTING...  replay once per SETTING and print one Markdown table; a SETTING is\n"
		"                        'EMM_NAME=value' (several separated by spaces in one argument),\n"
		"                        or 'default'\n"
		"  --snapshot FILE       write the heap at the end of the replay (or at its failure) and the\n"
		"                        replayed events as a PyTorch memory snapshot (pytorch.org/memory_viz)\n"
		"  --timeline FILE       write the bytes after each event as CSV (- for stdout):\n"
		"                        Line,Time,Thread,Action,Size,Requested,Allocated,Reserved\n"
		"  --one-thread          replay every event on one thread (default: one replay thread per\n"
		"                        traced thread, taking turns in trace order)\n"
		"  --fences LAG          simulate the GPU's event fences, as libemm has on a device: an event\n"
		"                        completes LAG replayed events after it is recorded (0: at once, an\n"
		"                        idle GPU), so synchronous frees wait in epochs (EMM_EPOCH_BLOCKS,\n"
		"                        EMM_EPOCH_BYTES). Without it a free is reusable at once\n"
		"  --version, -h/--help\n"
		"\n"
		"Exit status: 0 replayed, 1 an allocation failed that the trace had succeed (the event is\n"
		"printed), 2 bad usage, trace or setting.\n");
}

struct setting {
	const char *label;
	struct emm_options opts;
	struct replay_setup setup;
};

/* Options that only matter inside a CUDA process. */
static bool no_effect_on_replay(int id)
{
	switch (id) {
	case EMM_OPT_DISABLE:
	case EMM_OPT_VERBOSE:
	case EMM_OPT_STATS:
	case EMM_OPT_LOG:
	case EMM_OPT_MEMINFO_CACHED:
	case EMM_OPT_PINNED:
	case EMM_OPT_RUNTIME_SHIMS:
	case EMM_OPT_TEARDOWN_WAIT:
		return true;
	default:
		return false;
	}
}

static int option_id(const char *name, size_t len)
{
	for (int id = 0; id < EMM_OPT__COUNT; id++) {
		const char *n = emm_option_name((enum emm_option_id)id);
		if (strlen(n) == len && strncmp(n, name, len) == 0)
			return id;
	}
	return -1;
}

/*
 * Settings from `text` ("EMM_A=1 EMM_B=2", "default" or NULL) on top of the
 * environment, through config/'s parser. 0, or -EINVAL after an error line.
 */
static int setting_parse(const char *text, struct setting *s, char *buf, size_t buf_size)
{
	char *tokens[MAX_TOKENS + 1];
	int ids[MAX_TOKENS];
	enum emm_option_source sources[EMM_OPT__COUNT];
	char *envp_store[MAX_TOKENS + 512];
	char **envp = envp_store;
	size_t n = 0, nenv = 0;

	s->label = text ? text : "environment";
	if (text && strcmp(text, "default") != 0) {
		snprintf(buf, buf_size, "%s", text);
		for (char *tok = strtok(buf, " \t"); tok; tok = strtok(NULL, " \t")) {
			char *eq = strchr(tok, '=');

			if (n == MAX_TOKENS) {
				fprintf(stderr, "emm-replay: error: more than %d settings in '%s'\n", MAX_TOKENS, text);
				return -EINVAL;
			}
			if (strncmp(tok, "EMM_", 4) != 0 || !eq ||
			    (ids[n] = option_id(tok + 4, (size_t)(eq - tok - 4))) < 0) {
				char *alone[2] = {tok, NULL};
				struct emm_options ignored;

				/* config/ names the option meant, when one is close. */
				emm_options_parse(alone, &ignored, NULL);
				fprintf(stderr, "emm-replay: error: '%s' is not a known EMM_NAME=value setting "
						"(emm-options lists them)\n",
					tok);
				return -EINVAL;
			}
			if (no_effect_on_replay(ids[n]))
				fprintf(stderr, "emm-replay: warning: %.*s has no effect on a replay\n",
					(int)(eq - tok), tok);
			tokens[n++] = tok;
		}
	}
	/* The setting's own values first: the first occurrence wins. */
	for (size_t i = 0; i < n; i++)
		envp[nenv++] = tokens[i];
	for (char **e = environ; e && *e; e++) {
		if (nenv + 1 >= EMM_ARRAY_SIZE(envp_store))
			break;
		if (strncmp(*e, "EMM_", 4) == 0)
			envp[nenv++] = *e;
	}
	envp[nenv] = NULL;
	emm_options_parse(envp, &s->opts, sources);
	for (size_t i = 0; i < n; i++) {
		if (sources[ids[i]] == EMM_OPTION_INVALID) {
			fprintf(stderr, "emm-replay: error: setting '%s' is not valid (see the warning above)\n",
				tokens[i]);
			return -EINVAL;
		}
	}
	emm_heap_params_from_options(&s->opts, sources, &s->setup.params);
	s->setup.backend = strcmp(s->opts.backend, "driver") == 0 ? "hostsim" : s->opts.backend;
	s->setup.backend_options = s->opts.backend_options;
	return 0;
}

/* Segment sizes larger than the simulated device: libemm refuses them at
 * start-up (using half the device instead), and the replay does the same;
 * say so. */
static void warn_segments(const struct replay_setup *s)
{
	struct emm_heap_params p = s->params;
	char a[32], b[32], c[32];

	if (!s->capacity || !emm_heap_params_fit(&p, s->capacity))
		return;
	if (p.large_segment != s->params.large_segment)
		fprintf(stderr, "emm-replay: note: EMM_LARGE_SEGMENT (%s) is larger than the simulated device (%s): "
			"libemm refuses it and uses %s, and so does this replay\n",
			replay_format_size(s->params.large_segment, a, sizeof(a)),
			replay_format_size(s->capacity, b, sizeof(b)), replay_format_size(p.large_segment, c, sizeof(c)));
	if (p.small_segment != s->params.small_segment)
		fprintf(stderr, "emm-replay: note: EMM_SMALL_SEGMENT (%s) is larger than the simulated device (%s): "
			"libemm refuses it and uses %s, and so does this replay\n",
			replay_format_size(s->params.small_segment, a, sizeof(a)),
			replay_format_size(s->capacity, b, sizeof(b)), replay_format_size(p.small_segment, c, sizeof(c)));
}

static int run_or_report(struct replayer *rp, const struct replay_setup *setup, struct replay_result *res)
{
	char err[512];
	int r = replayer_run(rp, setup, res, err, sizeof(err));

	if (r < 0)
		fprintf(stderr, "emm-replay: error: %s\n", err);
	return r;
}

/* --compare: one run per setting, one table. */
static int compare(struct replayer *rp, struct setting *settings, size_t count, uint64_t capacity,
		   const struct replay_trace *t)
{
	int status = 0;

	replay_print_table_header(stdout);
	for (size_t i = 0; i < count; i++) {
		struct replay_result res;

		settings[i].setup.capacity = capacity;
		warn_segments(&settings[i].setup);
		if (run_or_report(rp, &settings[i].setup, &res) < 0)
			return 2;
		replay_print_table_row(stdout, settings[i].label, t, &res);
		if (!res.ok) {
			fflush(stdout);
			fprintf(stderr, "emm-replay: with %s:\n", settings[i].label);
			replay_print_failure(stderr, t, &res);
			status = 1;
		}
		replay_result_free(&res);
	}
	return status;
}

/* --min-capacity: bisect in steps between 0 and the peak reserved of an
 * unconstrained replay, then check the answer and one step below. */
static int min_capacity(struct replayer *rp, struct replay_setup *setup, uint64_t step,
			const struct replay_trace *t, const char *timeline, const char *snapshot)
{
	struct replay_result res, below;
	uint64_t lo, hi, answer;
	unsigned runs = 0;
	char a[32], b[32];
	int r;

	if (run_or_report(rp, setup, &res) < 0)
		return 2;
	runs++;
	if (!res.ok) {
		printf("emm-replay: the trace does not replay even on the starting capacity\n");
		replay_print_failure(stdout, t, &res);
		return 1;
	}
	hi = (res.peak_reserved + step - 1) / step;
	hi = hi ? hi : 1;
	lo = 0; /* no device at all: fails, unless nothing is allocated */
	replay_result_free(&res);
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		setup->capacity = mid * step;
		if (run_or_report(rp, setup, &res) < 0)
			return 2;
		runs++;
		if (res.ok)
			hi = mid;
		else
			lo = mid;
		replay_result_free(&res);
	}
	answer = hi * step;

	/* The check: at the answer, and one step below. */
	setup->capacity = answer;
	setup->timeline = timeline != NULL;
	setup->snapshot = snapshot;
	if (run_or_report(rp, setup, &res) < 0)
		return 2;
	setup->timeline = false;
	setup->snapshot = NULL;
	printf("minimum capacity %s (%llu B), in steps of %s, after %u replays\n",
	       replay_format_mib(answer, a, sizeof(a)), (unsigned long long)answer,
	       replay_format_mib(step, b, sizeof(b)), runs + 1);
	if (!res.ok) {
		printf("emm-replay: error: the check at %s failed:\n", a);
		replay_print_failure(stdout, t, &res);
		replay_result_free(&res);
		return 1;
	}
	printf("check            replays at %s\n", a);
	if (answer > step) {
		setup->capacity = answer - step;
		if (run_or_report(rp, setup, &below) < 0) {
			replay_result_free(&res);
			return 2;
		}
		replay_format_mib(answer - step, b, sizeof(b));
		if (below.ok) {
			printf("check            ALSO replays at %s: replay success does not grow steadily with "
			       "capacity for this trace; the bisection's answer is kept\n",
			       b);
		} else {
			printf("check            fails at %s:\n", b);
			replay_print_failure(stdout, t, &below);
		}
		replay_result_free(&below);
	}
	replay_print_report(stdout, t, &res);
	if (timeline && (r = replay_write_timeline(timeline, t, &res)) < 0) {
		fprintf(stderr, "emm-replay: error: cannot write %s: %s\n", timeline, strerror(-r));
		replay_result_free(&res);
		return 2;
	}
	replay_result_free(&res);
	return 0;
}

static int parse_size_arg(const char *opt, const char *value, uint64_t *ret)
{
	size_t z;

	if (!value || emm_parse_size(value, false, &z) < 0 || z == 0) {
		fprintf(stderr, "emm-replay: error: %s wants a size like 16M or 80G, not '%s'\n", opt,
			value ? value : "");
		return -EINVAL;
	}
	*ret = z;
	return 0;
}

int main(int argc, char **argv)
{
	const char *trace_path = NULL, *timeline = NULL, *snapshot = NULL;
	const char *compare_texts[MAX_SETTINGS];
	static struct setting settings[MAX_SETTINGS];
	static char buffers[MAX_SETTINGS][1024];
	size_t ncompare = 0;
	uint64_t capacity = 0, step = 2 * MIB;
	bool find_min = false, one_thread = false, comparing = false, fences = false;
	uint64_t fence_lag = 0;
	struct replay_trace trace;
	struct replayer *rp;
	struct replay_result res;
	char err[600];
	int status = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--version") == 0) {
			printf("emm-replay %s\n", EMM_VERSION_STRING);
			return 0;
		} else if (strcmp(a, "--capacity") == 0) {
			if (parse_size_arg(a, i + 1 < argc ? argv[++i] : NULL, &capacity) < 0)
				return 2;
		} else if (strcmp(a, "--step") == 0) {
			if (parse_size_arg(a, i + 1 < argc ? argv[++i] : NULL, &step) < 0)
				return 2;
		} else if (strcmp(a, "--min-capacity") == 0) {
			find_min = true;
		} else if (strcmp(a, "--one-thread") == 0) {
			one_thread = true;
		} else if (strcmp(a, "--fences") == 0) {
			const char *v = i + 1 < argc ? argv[++i] : NULL;
			char *end = NULL;
			unsigned long long lag = v && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;

			if (!end || *end != '\0' || lag > (1ull << 40)) {
				fprintf(stderr, "emm-replay: error: --fences wants a number of events (0 or more), "
					"not '%s'\n", v ? v : "");
				return 2;
			}
			fences = true;
			fence_lag = lag;
		} else if (strcmp(a, "--timeline") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "emm-replay: error: --timeline wants a file (- for stdout)\n");
				return 2;
			}
			timeline = argv[++i];
		} else if (strcmp(a, "--snapshot") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "emm-replay: error: --snapshot wants a file\n");
				return 2;
			}
			snapshot = argv[++i];
		} else if (strcmp(a, "--compare") == 0) {
			comparing = true;
			while (i + 1 < argc && (strncmp(argv[i + 1], "EMM_", 4) == 0 ||
						strcmp(argv[i + 1], "default") == 0)) {
				if (ncompare == MAX_SETTINGS) {
					fprintf(stderr, "emm-replay: error: at most %d settings\n", MAX_SETTINGS);
					return 2;
				}
				compare_texts[ncompare++] = argv[++i];
			}
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "emm-replay: error: unknown option '%s'\n", a);
			usage(stderr);
			return 2;
		} else if (!trace_path) {
			trace_path = a;
		} else {
			fprintf(stderr, "emm-replay: error: one trace at a time ('%s' and '%s')\n", trace_path, a);
			return 2;
		}
	}
	if (!trace_path) {
		usage(stderr);
		return 2;
	}
	if (comparing && ncompare == 0) {
		fprintf(stderr, "emm-replay: error: --compare wants settings like 'EMM_ARENAS=1' 'EMM_ARENAS=8'\n");
		return 2;
	}
	if (comparing && (find_min || timeline || snapshot)) {
		fprintf(stderr, "emm-replay: error: --compare goes with none of --min-capacity, --timeline, "
			"--snapshot\n");
		return 2;
	}
	/* Every setting is checked before the trace is read. */
	if (!comparing && setting_parse(NULL, &settings[0], buffers[0], sizeof(buffers[0])) < 0)
		return 2;
	for (size_t i = 0; i < ncompare; i++)
		if (setting_parse(compare_texts[i], &settings[i], buffers[i], sizeof(buffers[i])) < 0)
			return 2;
	for (size_t i = 0; i < (ncompare ? ncompare : 1); i++) {
		settings[i].setup.fences = fences;
		settings[i].setup.fence_lag = fence_lag;
	}

	if (replay_trace_load(trace_path, &trace, err, sizeof(err)) < 0) {
		fprintf(stderr, "emm-replay: error: %s\n", err);
		return 2;
	}
	if (replayer_create(&trace, one_thread, &rp) < 0) {
		fprintf(stderr, "emm-replay: error: cannot start the replay threads\n");
		replay_trace_free(&trace);
		return 2;
	}
	replay_print_trace(stdout, trace_path, &trace);
	fflush(stdout);

	if (comparing) {
		status = compare(rp, settings, ncompare, capacity, &trace);
	} else if (find_min) {
		settings[0].setup.capacity = capacity;
		status = min_capacity(rp, &settings[0].setup, step, &trace, timeline, snapshot);
	} else {
		settings[0].setup.capacity = capacity;
		settings[0].setup.timeline = timeline != NULL;
		settings[0].setup.snapshot = snapshot;
		warn_segments(&settings[0].setup);
		if (run_or_report(rp, &settings[0].setup, &res) < 0) {
			status = 2;
		} else {
			if (!res.ok) {
				fflush(stdout);
				replay_print_failure(stderr, &trace, &res);
				status = 1;
			}
			replay_print_report(stdout, &trace, &res);
			int r = timeline ? replay_write_timeline(timeline, &trace, &res) : 0;

			if (r < 0) {
				fprintf(stderr, "emm-replay: error: cannot write %s: %s\n", timeline, strerror(-r));
				status = 2;
			}
			replay_result_free(&res);
		}
	}
	replayer_destroy(rp);
	replay_trace_free(&trace);
	return status;
}
