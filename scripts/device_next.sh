#!/usr/bin/env bash
# carry=[".kb-cache"]: this session's device call (2026-12-03 15:29 session).
# 1. the GPU tests (new: KOSMOS_MAX_INFLIGHT reaches the kernel; run_point's t_concurrent_us);
# 2. the issue-4 host sweep with the new t_concurrent_us column (GEMM alone + copy alone issued
#    together, no dependency: the overlap the chip allows) -> OUT/run33;
# 3. policy self with SM movers at in-flight mover caps 12/14/16/20/28 (the schedule's cap is 14)
#    against fixed:16 / fixed:32 in the same sweeps -> OUT/slots-*.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
timeout 200 kosmos-bench sweep sweeps/h200-host-ag-gemm-sm90.yaml -o "$OUT/run33" 2>&1 | grep -E "^ag-gemm|^# (verd|geo)" \
    | awk '{print $2, $4, $5, $6, $7, $11, $12, $13}'
(cd "$OUT" && tar czf run33.tgz run33/*/points run33/*/manifest.json)
OUT=$OUT/slots SWEEP_ENV=KOSMOS_MAX_INFLIGHT SWEEP_VALUES="cap14=14 cap12=12 cap16=16 cap20=20 cap28=28" \
    SWEEP_SED='s/policy: \[self\]/policy: [self, fixed:16, fixed:32]/;s/mover: \[ce\]/mover: [sm]/;s/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos]/;s/reps: 10/reps: 5/' \
    bash scripts/device_env_sweeps.sh
