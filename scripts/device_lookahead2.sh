#!/usr/bin/env bash
# carry=[".kb-cache"]: the lookahead claim moved to kAheadBlocks before the tile's last load.
# 1. the sm90 kernel tests; 2. run37: the host sweep, kosmos CE (self) and nccl-overlap only,
# twice (fresh workers); 3. the landed kernel vs cuBLAS back to back on 405b FC1 8k.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k sm90 2>&1 | tail -1
Y=$OUT/sweep.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for i in 1 2; do
  timeout 100 kosmos-bench sweep "$Y" -o "$OUT/run37-$i" 2>&1 | grep -E "^ag-gemm" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
  kosmos-bench compact "$OUT/run37-$i" -o "$OUT/run37-$i.parquet" >/dev/null
done
(cd scripts && B2B_TAG=look2 ENERGY_FNS=landed,kosmos,cublas timeout 60 python3 device_energy_probe.py "$OUT" 8192x106496x16384 1.0 \
    2>&1 | grep -v -i -E "warn|rep [01]:|numa node|sm90 vs|cuBLAS kernels|bitwise" | tail -4)
