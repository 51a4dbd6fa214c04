#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (note of 2026-12-03 15:29-18:29).
# Nothing waits for device verification (the whole suite passed on the H200 at this session's
# code: 625 passed). 1. the GPU tests; 2. the issue-4 host sweep (kosmos self with CE and SM
# movers, fixed:16/32, nccl-seq, nccl-overlap; with the concurrency reference t_concurrent_us)
# -> OUT/run35.parquet (compacted) for the record of where a new session starts; 3. the preloaded
# probe (scripts/device_preload.sh, written and never run: no device time was left): is the fused
# call's extra energy on 405b FC1 the kernel's own or the arrivals'?
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
Y=$OUT/sweep.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self, fixed:16, fixed:32]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
timeout 300 kosmos-bench sweep "$Y" -o "$OUT/run35" 2>&1 | grep -E "^ag-gemm|^# (verd|geo)" | grep -v skipped \
    | awk '{print $2, $4, $5, $6, $7, $11, $12, $13}'
kosmos-bench compact "$OUT/run35" -o "$OUT/run35.parquet"
bash scripts/device_preload.sh
