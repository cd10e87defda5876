# SPDX-License-Identifier: MIT
"""tests/bench/bench_table.py - the Markdown table of an application
benchmark's interleaved rounds (tests/bench/run-torch-train.sh,
run-cupy.sh): lines "PREFIX key=value ..." with at least variant,
steps_per_s and peak_nvml_gib, grouped by variant, medians over the rounds.

    python3 bench_table.py FILE PREFIX BASE EXTRA TITLE

BASE: the variant the others' steps/s are divided by; EXTRA: the key whose
value each round is listed too (a loss, a checksum: equal results).
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


if __name__ == "__main__":
    main()
