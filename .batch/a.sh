#!/usr/bin/env bash
# one device batch: build, full gpu+race suites, recorded traces, obs checks
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
set -o pipefail
date
(meson setup build-rel --buildtype=release -Dtests=false -Dbench=false && ninja -C build-rel) > $OUT/build-rel.log 2>&1 &
GPU_CHECK_NO_BENCH=1 GPU_CHECK_JOBS=6 timeout 420 scripts/gpu-check build-gpu > $OUT/gpu-check.out 2>&1; echo "gpu-check rc=$?"
wait
date
mkdir -p $OUT/data
timeout 100 tests/data/record-traces.sh build-rel > $OUT/record.log 2>&1; echo "record rc=$?"
cp tests/data/*.csv $OUT/data/ 2>/dev/null
for f in tests/data/pytorch-train.csv tests/data/cupy-pool-off.csv; do [ -f $f ] && build-rel/tools/emm-replay --min-capacity $f >> $OUT/record.log 2>&1; done
date
tail -60 $OUT/summary.md
grep -E "EMM-CONFIRM|after the exporter|given back: open|FAIL" $OUT/gpu-testlog.txt | head -30
