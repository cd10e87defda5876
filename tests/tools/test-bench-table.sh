#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tools/test-bench-table.sh BENCH_TABLE - the application benchmarks'
# table maker (tests/bench/bench_table.py) on fixed rounds: medians, the
# ratio to the base variant, every round listed, and the allocator-cost
# table only where the rounds carry allocs_per_step and alloc_us (its
# share of the step and a free allocator's best gain over the base), the
# memory table only where they carry torch_train.py's MiB keys.
set -u
bt=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-bt.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failed=0
check() { # WHAT PATTERN
	if grep -qF -- "$2" "$tmp/out"; then echo "ok: $1"; else echo "FAILED: $1 (no '$2')"; failed=1; fi
}

cat >"$tmp/in" <<'IN'
noise
X variant=pool steps_per_s=500 peak_nvml_gib=1.19 checksum=7 allocs_per_step=50 alloc_us=2.0
X variant=emm steps_per_s=600 peak_nvml_gib=1.20 checksum=7 emm_allocs=90 allocs_per_step=50 alloc_us=1.0
X variant=pool steps_per_s=400 peak_nvml_gib=1.21 checksum=7 allocs_per_step=50 alloc_us=3.0
X variant=emm steps_per_s=1000 peak_nvml_gib=1.20 checksum=7 emm_allocs=90 allocs_per_step=50 alloc_us=0.5
X variant=pool steps_per_s=450 peak_nvml_gib=1.20 checksum=7 allocs_per_step=50 alloc_us=2.5
X variant=emm steps_per_s=700 peak_nvml_gib=1.20 checksum=7 emm_allocs=90 allocs_per_step=50 alloc_us=0.8
IN
python3 "$bt" "$tmp/in" X pool checksum "Title:" >"$tmp/out" 2>&1 || { echo "FAILED: exit $?"; cat "$tmp/out"; exit 1; }
check "title first" "Title:"
check "base median and ratio" "| pool | 450.00 | 1.00x | 1.20 | 7 7 7 | 500 400 450 |"
check "other variant, libemm's count" "| emm (libemm served 90) | 700.00 | 1.56x | 1.20 |"
# pool: 50 x 2.5 us = 125 us of a 2222 us step (5.6 %); best 2222/(2222-125) = 1.06x
check "pool's allocator cost" "| pool | 50.0 | 2.500 (2.0 3.0 2.5) | 125.0 | 5.6 % | 1.06x |"
check "emm's allocator cost" "| emm | 50.0 | 0.800 (1.0 0.5 0.8) | 40.0 | 2.8 % | - |"

grep -v alloc_us "$tmp/in" | sed 's/ allocs_per_step=50//' >"$tmp/in2"
python3 "$bt" "$tmp/in2" X pool checksum "Title:" >"$tmp/out" 2>&1
if grep -q "allocations a step" "$tmp/out"; then echo "FAILED: cost table without costs"; failed=1; else echo "ok: no cost table without costs"; fi
if grep -q "NVML at the loop's start" "$tmp/out"; then echo "FAILED: memory table without its keys"; failed=1; else echo "ok: no memory table without its keys"; fi

# torch_train.py's memory keys: medians at MiB precision, peak minus start per round
cat >"$tmp/in3" <<'IN'
X variant=pool steps_per_s=8 peak_nvml_gib=18.94 loss=1 peak_nvml_mib=19400.0 base_nvml_mib=1000.0 pool_peak_mib=18000.0
X variant=emm steps_per_s=8 peak_nvml_gib=18.95 loss=1 peak_nvml_mib=19410.0 base_nvml_mib=1004.0 pool_peak_mib=18002.0
X variant=pool steps_per_s=8 peak_nvml_gib=18.94 loss=1 peak_nvml_mib=19402.0 base_nvml_mib=1000.0 pool_peak_mib=18000.0
X variant=emm steps_per_s=8 peak_nvml_gib=18.95 loss=1 peak_nvml_mib=19414.0 base_nvml_mib=1002.0 pool_peak_mib=18006.0
IN
python3 "$bt" "$tmp/in3" X pool loss "Title:" >"$tmp/out" 2>&1
check "pool's memory" "| pool | 1000.0 | 19401.0 | 18401.0 | 18000.0 (18000.0 18000.0) |"
check "emm's memory" "| emm | 1003.0 | 19412.0 | 18409.0 | 18004.0 (18002.0 18006.0) |"
exit $failed
