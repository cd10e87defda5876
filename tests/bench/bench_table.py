# SPDX-License-Identifier: MIT
"""tests/bench/bench_table.py - the Markdown table of an application
benchmark's interleaved rounds (tests/bench/run-torch-train.sh,
run-cupy.sh): lines "PREFIX key=value ..." with at least variant,
steps_per_s and peak_nvml_gib, grouped by variant, medians over the rounds.

    python3 bench_table.py FILE PREFIX BASE EXTRA TITLE

BASE: the variant the others' steps/s are divided by; EXTRA: the key whose
value each round is listed too (a loss, a checksum: equal results).
Where rounds carry base_nvml_mib, peak_nvml_mib and pool_peak_mib
(torch_train.py), a table gives each variant's memory at MiB precision.
Where rounds carry allocs_per_step and alloc_us (cupy_bench.py
--alloc-pairs), a second table gives each variant's allocator time in a
step and the most that a free allocator would gain over BASE.
"""
import collections
import statistics
import sys


def main():
    path, prefix, base, extra, title = sys.argv[1:6]
    rows = collections.defaultdict(list)
    for line in open(path):
        if line.startswith(prefix + " "):
            kv = dict(f.split("=", 1) for f in line.split()[1:])
            rows[kv["variant"]].append(kv)

    def median(rs, key):
        return statistics.median(float(r[key]) for r in rs)

    ref = median(rows[base], "steps_per_s") if rows.get(base) else None
    print(title)
    print()
    print("| variant | steps/s | vs %s | NVML peak GiB | %s (each round) | steps/s each round |" % (base, extra))
    print("|---|---|---|---|---|---|")
    for name, rs in rows.items():
        sps = median(rs, "steps_per_s")
        served = " (libemm served %s)" % rs[-1]["emm_allocs"] if "emm_allocs" in rs[-1] else ""
        print("| %s%s | %.2f | %s | %.2f | %s | %s |" % (
            name, served, sps, "%.2fx" % (sps / ref) if ref else "-", median(rs, "peak_nvml_gib"),
            " ".join(r.get(extra, "?") for r in rs), " ".join(r["steps_per_s"] for r in rs)))

    mem = [(name, rs) for name, rs in rows.items() if all("pool_peak_mib" in r for r in rs)]
    if mem:
        print()
        print("| variant | NVML at the loop's start MiB | NVML peak MiB | peak minus start MiB |"
              " allocator's reserved peak MiB (each round) |")
        print("|---|---|---|---|---|")
        for name, rs in mem:
            print("| %s | %.1f | %.1f | %.1f | %.1f (%s) |" % (
                name, median(rs, "base_nvml_mib"), median(rs, "peak_nvml_mib"),
                statistics.median(float(r["peak_nvml_mib"]) - float(r["base_nvml_mib"]) for r in rs),
                median(rs, "pool_peak_mib"), " ".join(r["pool_peak_mib"] for r in rs)))

    cost = [(name, rs) for name, rs in rows.items() if all("alloc_us" in r for r in rs)]
    if not cost:
        return
    print()
    print("| variant | allocations a step | us an allocation and release (each round) | allocator us of a step |"
          " share of the step | a free allocator's best vs %s |" % base)
    print("|---|---|---|---|---|---|")
    for name, rs in cost:
        per_step = median(rs, "allocs_per_step") * median(rs, "alloc_us")
        step_us = 1e6 / median(rs, "steps_per_s")
        # The base's own step: what it would take with an allocator that cost nothing.
        best = "%.2fx" % (step_us / (step_us - per_step)) if name == base else "-"
        print("| %s | %.1f | %.3f (%s) | %.1f | %.1f %% | %s |" % (
            name, median(rs, "allocs_per_step"), median(rs, "alloc_us"), " ".join(r["alloc_us"] for r in rs),
            per_step, 100.0 * per_step / step_us, best))


if __name__ == "__main__":
    main()
