#!/usr/bin/env bash
# carry=[".kb-cache"]: the GPU test files, then the CE host sweep (kosmos self + nccl-overlap)
# SWEEPS times (default 2), each in a fresh worker, as the day's reference ($OUT/sweep-<i>.parquet).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 \
    | tail -1 > "$OUT/tests.txt"
Y=$OUT/sweep.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for i in $(seq 1 "${SWEEPS:-2}"); do
  echo "== sweep $i"
  timeout 150 kosmos-bench sweep "$Y" -o "$OUT/sweep-$i" 2>&1 | grep -E "^ag-gemm" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
  kosmos-bench compact "$OUT/sweep-$i" -o "$OUT/sweep-$i.parquet" >/dev/null && rm -rf "$OUT/sweep-$i"
done
echo "== tests"; cat "$OUT/tests.txt"
