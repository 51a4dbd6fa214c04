#!/usr/bin/env bash
# carry=[".kb-cache"]: this session's device calls (2026-12-03 15:29 session); call 4:
# 1. energy per call back to back at the power limit (the steady state of a training step): cuBLAS
#    alone, kosmos (self + CE), cuBLAS and the copy issued together with no dependency (both), the
#    nccl-overlap baseline, copy alone, on 405b FC1 8k and 70b FC1 8k -> OUT/energy.parquet;
# 2. the whole test suite on the H200 (CPU and GPU tests) at this session's code.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
ENERGY_FNS=cublas,kosmos,both,overlap,copy timeout 200 python3 scripts/device_energy_probe.py "$OUT" \
    8192x106496x16384,8192x57344x8192 1.5 2>&1 | grep -v "^numa"
timeout 330 python3 -m pytest -q -p no:cacheprovider -x tests/ 2>&1 | tail -3
