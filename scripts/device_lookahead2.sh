#!/usr/bin/env bash
# carry=[".kb-cache"]: the sm90 AG kernel's lookahead claim (KOSMOS_AHEAD_BLOCKS; default 24
# k-blocks before a tile's last load). 1. the sm90 kernel tests; 2. the host sweep, kosmos CE
# (self) and nccl-overlap only, in fresh workers with the claim 24 blocks ahead, none (-1), at
# the tile's first load (100000), 24 again (run37-<ahead>-<i>.parquet); 3. the landed kernel and
# the fused call vs cuBLAS back to back with 24 / -1 (energy.parquet, tags a24 / a-1).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
[ -n "${GPU_TESTS_DONE:-}" ] || timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k sm90 2>&1 | tail -1
Y=$OUT/sweep.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
i=0
for a in ${AHEADS:-24 -1 100000 24}; do
  i=$((i + 1))
  echo "== KOSMOS_AHEAD_BLOCKS=$a"
  KOSMOS_AHEAD_BLOCKS=$a timeout 100 kosmos-bench sweep "$Y" -o "$OUT/run37-$i" 2>&1 | grep -E "^ag-gemm" \
      | awk '{print $2, $4, $5, $6, $7, $11, $13}'
  kosmos-bench compact "$OUT/run37-$i" -o "$OUT/run37-$i-ahead$a.parquet" >/dev/null
done
LV_VARIANTS="a24:KOSMOS_AHEAD_BLOCKS=24 a-1:KOSMOS_AHEAD_BLOCKS=-1" bash scripts/device_landed_variants.sh
