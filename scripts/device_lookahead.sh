#!/usr/bin/env bash
# carry=[".kb-cache"]: the sm90 AG kernel with the scheduler's lookahead claim (thread 32 claims
# the next ready tile while warp 0 issues the current tile's loads). 1. the landed kernel vs
# cuBLAS and world 1, back to back, with traced tile gaps (device_landed_variants.sh "def");
# 2. run36: the issue-4 host sweep (kosmos CE + SM movers, fixed:16/32, nccl-seq, nccl-overlap);
# 3. the GPU tests of the kernels.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
LV_VARIANTS="look:ENERGY_TRACE=1" bash scripts/device_landed_variants.sh
Y=$OUT/sweep.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self, fixed:16, fixed:32]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
timeout 200 kosmos-bench sweep "$Y" -o "$OUT/run36" 2>&1 | grep -E "^ag-gemm|^# (verd|geo)" | grep -v skipped \
    | awk '{print $2, $4, $5, $6, $7, $11, $12, $13}'
kosmos-bench compact "$OUT/run36" -o "$OUT/run36.parquet"
timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -3
