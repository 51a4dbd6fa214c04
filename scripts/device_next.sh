#!/usr/bin/env bash
# carry=[".kb-cache"]: the lookahead claim's wait on an mbarrier (try_wait sleeps in hardware)
# instead of a polled shared-memory word: 1. the GPU test files (tail saved to $OUT/tests.txt);
# 2. the landed kernel, the fused call, cuBLAS and our world-1 builder back to back with the
# claim 24 blocks ahead / at the tile's start / none (energy.parquet, tags b24 / b100000 / b-1):
# does the polled wait's ~40 W (710 W landed vs 670 W without the claim, run37) go away?;
# 3. the CE host sweep (kosmos self + nccl-overlap) twice with the default (run38-<i>.parquet).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
[ -n "${SKIP_TESTS:-}" ] || timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py \
    tests/test_builder_sm90_gpu.py 2>&1 | tail -4 > "$OUT/tests.txt"
cat "$OUT/tests.txt" 2>/dev/null
LV_SHAPES=8192x106496x16384 LV_FNS=landed,kosmos,cublas,sm90 \
LV_VARIANTS="b24:KOSMOS_AHEAD_BLOCKS=24 b100000:KOSMOS_AHEAD_BLOCKS=100000 b-1:KOSMOS_AHEAD_BLOCKS=-1" \
    bash scripts/device_landed_variants.sh 2>&1 | grep -v "bitwise = fused call: True"
Y=$OUT/sweep.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for i in 1 2; do
  timeout 100 kosmos-bench sweep "$Y" -o "$OUT/run38-$i" 2>&1 | grep -E "^ag-gemm" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
  kosmos-bench compact "$OUT/run38-$i" -o "$OUT/run38-$i.parquet" >/dev/null && rm -rf "$OUT/run38-$i"
done
echo "== tests"; cat "$OUT/tests.txt"
