/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_report.c - emm-replay's output: sizes, the report lines, the
 * failure, the comparison table and the timeline CSV.
 */
#include "tools/replay_report.h"

#include <errno.h>
#include <string.h>

const char *replay_format_size(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = -1;

	if (bytes < 1024) {
		snprintf(buf, size, "%llu B", (unsigned long long)bytes);
		return buf;
	}
	while (v >= 1024.0 && u < 3) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, size, "%.1f %s", v, units[u]);
	return buf;
}

const char *replay_format_mib(uint64_t bytes, char *buf, size_t size)
{
	if (bytes % (UINT64_C(1) << 20) == 0)
		snprintf(buf, size, "%llu MiB", (unsigned long long)(bytes >> 20));
	else
		snprintf(buf, size, "%llu B", (unsigned long long)bytes);
	return buf;
}

static const char *action_name(uint8_t action)
{
	switch (action) {
	case REPLAY_ALLOC:
		return "allocate";
	case REPLAY_FREE:
		return "free";
	default:
		return "allocate failure";
	}
}

void replay_print_trace(FILE *out, const char *path, const struct replay_trace *t)
{
	char peak[32];

	fprintf(out, "trace            %s: %zu events (%zu allocate, %zu free, %zu allocate failure), "
		     "%zu threads, %zu streams besides the default ones\n",
		path, t->count, t->allocs, t->frees, t->failures, t->nthreads, t->nstreams);
	fprintf(out, "traced peak      %s (%llu B) live at once, as the program asked\n",
		replay_format_size(t->peak_requested, peak, sizeof(peak)),
		(unsigned long long)t->peak_requested);
	if (t->other_memory)
		fprintf(out, "host memory      %zu pinned-host or managed events: skipped (the replay models the "
			     "device)\n",
			t->other_memory);
	if (t->unmatched_frees)
		fprintf(out, "untraced frees   %zu frees of pointers the trace never allocated "
			     "(tracing started late): skipped\n",
			t->unmatched_frees);
}

static double ops_per_second(const struct replay_result *r)
{
	return r->call_seconds > 0 ? (double)r->calls / r->call_seconds : 0.0;
}

void replay_print_report(FILE *out, const struct replay_trace *t, const struct replay_result *r)
{
	char a[32], b[32];

	fprintf(out, "peak allocated   %s (%llu B): most bytes handed out at once, rounded as the heap does\n",
		replay_format_size(r->peak_allocated, a, sizeof(a)), (unsigned long long)r->peak_allocated);
	fprintf(out, "peak reserved    %s (%llu B): most bytes held from the (simulated) device\n",
		replay_format_size(r->peak_reserved, a, sizeof(a)), (unsigned long long)r->peak_reserved);
	fprintf(out, "fragmentation    %.1f %%: 1 - allocated/reserved when allocated peaked "
		     "(%s allocated of %s reserved)\n",
		replay_fragmentation(r), replay_format_size(r->peak_allocated, a, sizeof(a)),
		replay_format_size(r->reserved_at_peak, b, sizeof(b)));
	fprintf(out, "backend calls    %llu segment allocs, %llu segment frees\n",
		(unsigned long long)r->stats.backend_allocs, (unsigned long long)r->stats.backend_frees);
	if (r->stats.page_unmaps || r->stats.page_maps || r->stats.segment_grows) {
		char u[32], m[32], g[32];

		fprintf(out, "pages            %llu unmaps (%s), %llu maps (%s), %llu grows (%s)\n",
			(unsigned long long)r->stats.page_unmaps,
			replay_format_size(r->stats.unmapped_bytes_total, u, sizeof(u)),
			(unsigned long long)r->stats.page_maps,
			replay_format_size(r->stats.remapped_bytes_total, m, sizeof(m)),
			(unsigned long long)r->stats.segment_grows,
			replay_format_size(r->stats.grown_bytes_total, g, sizeof(g)));
	}
	if (r->fences)
		fprintf(out, "fences           %llu epochs closed, %llu events recorded, %llu stream waits "
			     "(simulated: an event completes %llu events after its record)\n",
			(unsigned long long)r->stats.epochs_closed, (unsigned long long)r->stats.events_recorded,
			(unsigned long long)r->stats.stream_waits, (unsigned long long)r->fence_lag);
	fprintf(out, "cache            %llu hits, %llu misses, %llu splits, %llu merges, %llu OOM retries\n",
		(unsigned long long)r->stats.hits, (unsigned long long)r->stats.misses,
		(unsigned long long)r->stats.splits, (unsigned long long)r->stats.merges,
		(unsigned long long)r->stats.oom_retries);
	fprintf(out, "ops/s            %.2f M: allocator calls per second spent inside them "
		     "(%llu calls, %.4f s; wall %.4f s)\n",
		ops_per_second(r) / 1e6, (unsigned long long)r->calls, r->call_seconds, r->wall_seconds);
	if (r->expected_failures || r->unexpected_successes)
		fprintf(out, "traced failures  %zu failed here too, %zu succeeded here (freed at once; the "
			     "cache keeps their memory: --capacity gives the traced device's size)\n",
			r->expected_failures, r->unexpected_successes);
	if (r->skipped_frees)
		fprintf(out, "skipped frees    %zu\n", r->skipped_frees);
	(void)t;
}

void replay_print_failure(FILE *out, const struct replay_trace *t, const struct replay_result *r)
{
	const struct replay_event *ev = &t->events[r->fail_index];
	char a[32], b[32], c[32], d[32];

	fprintf(out,
		"emm-replay: FAILED at line %u (event %zu of %zu): thread %llu, %s of %llu B: %s\n"
		"emm-replay:   at that moment: %s live as asked, %s allocated, %s reserved, "
		"largest free block %s\n",
		ev->line, r->fail_index + 1, t->count, (unsigned long long)t->thread_ids[ev->thread],
		action_name(ev->action), (unsigned long long)ev->size,
		r->fail_error == -ENOMEM ? "out of memory" : strerror(-r->fail_error),
		replay_format_size(r->fail_requested, a, sizeof(a)),
		replay_format_size(r->fail_allocated, b, sizeof(b)),
		replay_format_size(r->fail_reserved, c, sizeof(c)),
		replay_format_size(r->fail_largest_free, d, sizeof(d)));
}

const char *replay_result_cell(const struct replay_trace *t, const struct replay_result *r, char *buf,
			       size_t size)
{
	if (r->ok)
		snprintf(buf, size, "ok");
	else
		snprintf(buf, size, "fails at line %u", t->events[r->fail_index].line);
	return buf;
}

void replay_print_table_header(FILE *out)
{
	fprintf(out, "| setting | peak allocated | peak reserved | fragmentation at peak | backend allocs "
		     "| backend frees | ops/s | result |\n");
	fprintf(out, "|---|---:|---:|---:|---:|---:|---:|---|\n");
}

void replay_print_table_row(FILE *out, const char *setting, const struct replay_trace *t,
			    const struct replay_result *r)
{
	char c[48];

	/* MiB throughout, so the rows compare at a glance. */
	fprintf(out, "| `%s` | %.1f MiB | %.1f MiB | %.1f %% | %llu | %llu | %.2f M | %s |\n", setting,
		(double)r->peak_allocated / 1048576.0, (double)r->peak_reserved / 1048576.0,
		replay_fragmentation(r), (unsigned long long)r->stats.backend_allocs,
		(unsigned long long)r->stats.backend_frees, ops_per_second(r) / 1e6,
		replay_result_cell(t, r, c, sizeof(c)));
}

int replay_write_timeline(const char *path, const struct replay_trace *t, const struct replay_result *r)
{
	FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
	uint64_t t0 = t->count ? t->events[0].time_ns : 0;
	int ret = 0;

	if (!f)
		return -errno;
	fprintf(f, "Line,Time,Thread,Action,Size,Requested,Allocated,Reserved\n");
	for (size_t i = 0; i < r->tl_count; i++) {
		const struct replay_event *ev = &t->events[i];

		fprintf(f, "%u,%.6f,%llu,%s,%llu,%llu,%llu,%llu\n", ev->line,
			(double)(ev->time_ns - t0) * 1e-9, (unsigned long long)t->thread_ids[ev->thread],
			action_name(ev->action), (unsigned long long)ev->size,
			(unsigned long long)r->tl_requested[i], (unsigned long long)r->tl_allocated[i],
			(unsigned long long)r->tl_reserved[i]);
	}
	if (fflush(f) != 0 || ferror(f))
		ret = -EIO;
	if (f != stdout && fclose(f) != 0 && ret == 0)
		ret = -EIO;
	return ret;
}
