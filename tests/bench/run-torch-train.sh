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
# BACKENDS (default "driver"; e.g. "driver vmm"; a backend may carry settings
# of its own after '+': "vmm vmm+EMM_HOLD_PEAK=off"); and, with "door" in
# TORCH_TRAIN_VARIANTS, libemm as PyTorch's allocator through the Python
# package without the preload (emm.torch.use(), stream-ordered). The variants
# run, in each round, in the order TORCH_TRAIN_VARIANTS names them (default
# "caching expandable emm"; "emm" is the preload with each backend):
#
#   TORCH_TRAIN_VARIANTS="caching door emm" tests/bench/run-torch-train.sh build-gpu 3
#
# Exit 77 without torch or a GPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-rel}
rounds=${2:-3}
backends=${3:-driver}
lib=$(cd "$build" && pwd)/libemm.so
steps=${TORCH_TRAIN_STEPS:-60}
variants=${TORCH_TRAIN_VARIANTS:-caching expandable emm}
pkg=$(cd "$here/../../python" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # NAME ENV...
	local name=$1
	shift
	env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING -u PYTORCH_CUDA_ALLOC_CONF -u TORCH_TRAIN_DOOR "$@" \
		python3 "$here/torch_train.py" "$name" --steps "$steps" >>"$tmp/out.txt" 2>"$tmp/err-$name.txt"
	local rc=$?
	if [ $rc -eq 77 ]; then
		cat "$tmp/err-$name.txt" "$tmp/out.txt"
		exit 77
	fi
	[ $rc -eq 0 ] || { echo "variant $name failed ($rc):"; tail -20 "$tmp/err-$name.txt"; }
}

for r in $(seq 1 "$rounds"); do
	for v in $variants; do
		case $v in
		caching) run torch-caching ;;
		expandable) run torch-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
		door) run emm-door TORCH_TRAIN_DOOR=1 PYTHONPATH="$pkg" LIBEMM_PATH="$lib" ;;
		emm) for b in $backends; do
			# "vmm+EMM_HOLD_PEAK=off": the backend, then settings of its own
			extra=()
			[ "${b%%+*}" = "$b" ] || IFS=+ read -r -a extra <<<"${b#*+}"
			run "emm-$b" PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH="$pkg" LD_PRELOAD="$lib" EMM_BACKEND="${b%%+*}" "${extra[@]}"
		done ;;
		*) echo "unknown variant '$v' (caching, expandable, door, emm)" >&2; exit 2 ;;
		esac
	done
done
cat "$tmp/out.txt" >&2
python3 "$here/bench_table.py" "$tmp/out.txt" TORCH-TRAIN torch-caching loss \
	"PyTorch training loop (6-layer transformer, d_model 1024, batch 16, sequence length 64-1023 changing every step, $steps steps), median of $rounds interleaved rounds:"
