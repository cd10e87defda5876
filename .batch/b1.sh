#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
set -o pipefail
R=$OUT; L=/tmp/logs; mkdir -p $L
date
(meson setup build-rel --buildtype=release -Dgpu_tests=enabled && ninja -C build-rel) > $L/build-rel.log 2>&1 &
OUT=$L GPU_CHECK_NO_BENCH=1 GPU_CHECK_JOBS=8 timeout 400 scripts/gpu-check build-gpu > $L/gpu-check.out 2>&1; echo "gpu-check rc=$?"
wait; date
{
echo "== py-jax-vmm on one GPU"
CUDA_VISIBLE_DEVICES=0 LD_PRELOAD=$PWD/build-gpu/libemm.so timeout 120 python3 tests/gpu/py_jax_vmm.py 2>&1 | tail -4
echo "== JAX on two GPUs, EMM_VERBOSE=2: the VMM calls of one buffer's life"
LD_PRELOAD=$PWD/build-gpu/libemm.so EMM_VERBOSE=2 XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 100 python3 -c "
import jax, jax.numpy as jnp
x = jnp.ones((1024,1024)); y = (x @ x).block_until_ready(); del y
z = (x + 1).block_until_ready(); print('ok', float(z[0,0]))" 2>&1 | grep -E "vmm: " | head -40
} > $L/jax.log 2>&1
date
DDP_STEPS=30 timeout 150 tests/bench/run-ddp.sh build-rel 1 "driver vmm" 2 > $L/ddp.md 2>/dev/null; echo "ddp rc=$?"
timeout 80 tests/data/record-traces.sh build-rel > $L/record.log 2>&1; echo "record rc=$?"
tar czf $R/data.tgz tests/data/*.csv
cp $L/summary.md $R/ 2>/dev/null
tar czf $R/logs.tgz -C $L .
date
tail -40 $L/summary.md; cat $L/ddp.md; head -14 $L/jax.log
