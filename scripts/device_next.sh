#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (note of 2026-12-03 14:28-17:28).
# Nothing is waiting for device verification (the whole suite passed on the H200 at e03f72c).
# 1. the GPU tests; 2. the full issue-4 host sweep with this session's defaults (copy-bound last
#    group of 3 bands, 6-band balanced groups): kosmos self with CE and SM movers and fixed:8/16/32
#    (SM movers) against nccl-seq / nccl-overlap: the margin over the best fixed:k, re-measured.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
timeout 360 kosmos-bench sweep sweeps/h200-host-ag-gemm-sm90.yaml -o "$OUT/run32" 2>&1 | grep -E "^ag-gemm|^# " \
    | awk '{print $2, $4, $5, $6, $7, $10, $11, $12}'
(cd "$OUT" && tar czf run32.tgz run32/*/points run32/*/manifest.json)
