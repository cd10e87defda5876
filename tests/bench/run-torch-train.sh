#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/run-torch-train.sh - a fragmentation-heavy PyTorch training loop
# (tests/bench/torch_train.py: a 6-layer transformer, sequence length
# changing every step) under each way of allocating, interleaved ROUNDS
# times in one run: steps/s and NVML peak device memory, median over the
# rounds, as one Markdown table.
#
#   tests/bench/run-torch-train.sh [BUILDDIR] [ROUNDS] [BACKENDS]
#
# Variants: PyTorch's caching allocator; its expandable segments; caching off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1) under libemm with each backend named in
# BACKENDS (default "driver"; e.g. "driver vmm"). Exit 77 without torch or a GPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-rel}
rounds=${2:-3}
backends=${3:-driver}
lib=$(cd "$build" && pwd)/libemm.so
steps=${TORCH_TRAIN_STEPS:-60}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # NAME ENV...
	local name=$1
	shift
	env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING -u PYTORCH_CUDA_ALLOC_CONF "$@" \
		python3 "$here/torch_train.py" "$name" --steps "$steps" >>"$tmp/out.txt" 2>"$tmp/err-$name.txt"
	local rc=$?
	if [ $rc -eq 77 ]; then
		cat "$tmp/err-$name.txt" "$tmp/out.txt"
		exit 77
	fi
	[ $rc -eq 0 ] || { echo "variant $name failed ($rc):"; tail -20 "$tmp/err-$name.txt"; }
}

for r in $(seq 1 "$rounds"); do
	run torch-caching
	run torch-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
	for b in $backends; do
		run "emm-$b" PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$lib" EMM_BACKEND="$b"
	done
done
cat "$tmp/out.txt" >&2
python3 - "$tmp/out.txt" "$rounds" "$steps" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if not line.startswith("TORCH-TRAIN "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    rows[kv["variant"]].append(kv)
print("PyTorch training loop (6-layer transformer, d_model 1024, batch 16, sequence length 64-1023 changing "
      "every step, %s steps), median of %s interleaved rounds:" % (sys.argv[3], sys.argv[2]))
print()
print("| variant | steps/s | NVML peak GiB | last loss (each round) |")
print("|---|---|---|---|")
for name, rs in rows.items():
    sps = statistics.median(float(r["steps_per_s"]) for r in rs)
    peak = statistics.median(float(r["peak_nvml_gib"]) for r in rs)
    print("| %s | %.2f | %.2f | %s |" % (name, sps, peak, " ".join(r["loss"] for r in rs)))
PY
