#!/usr/bin/env bash
# Issue 4: where the host-fabric CE call's time goes (carry=[".kb-cache"]): NVML clock test,
# CUPTI timelines of kosmos (CE head 0 / 8 MB) vs nccl-overlap / GEMM / copy on the FC1 shapes,
# host time of run().
set -uo pipefail
export PYTHONPATH=$PWD KOSMOS_BENCH_CACHE=$PWD/.kb-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_nvml.py 2>&1 | tail -2
timeout 300 python3 scripts/device_timeline.py "$OUT" ${TL_SHAPES:-8192x57344x8192,8192x106496x16384,16384x57344x8192} 2>&1 | grep -v Warn
for h in 0 8; do KOSMOS_CE_HEAD_MB=$h timeout 60 python3 scripts/device_launch_host_time.py 8192 57344 8192 2>&1 | tail -5; done
