#!/usr/bin/env bash
# Issue 4: does the host-fabric AG+GEMM's time depend on how calls follow each other (power
# state, host run-ahead)? carry=[".kb-cache"]. Power/clock log from nvidia-smi dmon.
set -uo pipefail
export PYTHONPATH=$PWD KOSMOS_BENCH_CACHE=$PWD/.kb-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.txt" 2>&1 &
dmon=$!
timeout 420 python3 scripts/device_regime.py "$OUT" ${RG_SHAPES:-8192x57344x8192,8192x106496x16384,8192x10240x8192} 2>&1 | grep -v -i warn
echo "== CUDA_DEVICE_MAX_CONNECTIONS=32 (streams on their own hardware queues: false dependencies?)"
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 120 python3 scripts/device_regime.py "$OUT/conn32" 8192x57344x8192 2>&1 | grep -v -i warn
kill $dmon 2>/dev/null
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k "spin or copy_engine or warm" 2>&1 | tail -2
