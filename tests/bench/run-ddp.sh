#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/run-ddp.sh - a data-parallel PyTorch training loop
# (tests/bench/ddp_train.py: DistributedDataParallel over NCCL, one process
# per GPU under torchrun) under each way of allocating, interleaved ROUNDS
# times in one run: steps/s and NVML peak device memory per GPU, median over
# the rounds, as one Markdown table.
#
#   tests/bench/run-ddp.sh [BUILDDIR] [ROUNDS] [BACKENDS] [GPUS]
#
# Variants: PyTorch's caching allocator; caching off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1) with libemm preloaded in every rank,
# one variant per word of BACKENDS (default "driver"): a backend name,
# optionally followed by settings, e.g. "driver vmm driver:EMM_PENDING_LIMIT=0".
# GPUS defaults to 2. DDP_STEPS: timed steps (40); DDP_STATS=1 keeps each
# variant's EMM_STATS tables (stderr of the ranks) in the output.
# Exit 77 without torch, NCCL or two GPUs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-rel}
rounds=${2:-3}
backends=${3:-driver}
gpus=${4:-2}
lib=$(cd "$build" && pwd)/libemm.so
steps=${DDP_STEPS:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# NVLink multicast stays off on shared machines (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

run() { # NAME ENV...
	local name=$1
	shift
	env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING -u PYTORCH_CUDA_ALLOC_CONF "$@" \
		python3 -m torch.distributed.run --standalone --nproc-per-node="$gpus" \
		"$here/ddp_train.py" "$name" --steps "$steps" >>"$tmp/out.txt" 2>"$tmp/err-$name.txt"
	local rc=$?
	if grep -q '^SKIP' "$tmp/out.txt"; then
		cat "$tmp/out.txt"
		exit 77
	fi
	[ $rc -eq 0 ] || { echo "variant $name failed ($rc):"; tail -20 "$tmp/err-$name.txt"; }
}

for r in $(seq 1 "$rounds"); do
	run torch-caching
	for spec in $backends; do
		IFS=: read -r -a parts <<<"$spec"
		name="emm-${spec//:/,}"
		run "$name" PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$lib" EMM_BACKEND="${parts[0]}" \
			${DDP_STATS:+EMM_STATS=1} "${parts[@]:1}"
	done
done
cat "$tmp/out.txt" >&2
if [ -n "${DDP_STATS:-}" ]; then
	for f in "$tmp"/err-emm-*; do
		echo "--- ${f##*/err-}: EMM_STATS" >&2
		grep -v -E '^(W|I)[0-9]|warnings.warn|^ *$' "$f" | tail -70 >&2
	done
fi
python3 - "$tmp/out.txt" "$rounds" "$steps" "$gpus" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if not line.startswith("TORCH-DDP "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    rows[kv["variant"]].append(kv)
print("Data-parallel PyTorch training (DDP over NCCL, %s GPUs, one process each; 6-layer transformer, "
      "d_model 1024, batch 16 per GPU, sequence length 64-1023 changing every step, %s timed steps), "
      "median of %s interleaved rounds:" % (sys.argv[4], sys.argv[3], sys.argv[2]))
print()
print("| variant | steps/s | NVML peak GiB per GPU | last loss (each round) |")
print("|---|---|---|---|")
for name, rs in rows.items():
    sps = statistics.median(float(r["steps_per_s"]) for r in rs)
    per = [statistics.median(float(r["peak_nvml_gib"].split(",")[i]) for r in rs)
           for i in range(len(rs[0]["peak_nvml_gib"].split(",")))]
    print("| %s | %.2f | %s | %s |" % (name, sps, " / ".join("%.2f" % p for p in per),
                                       " ".join(r["loss"] for r in rs)))
PY
