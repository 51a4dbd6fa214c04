#!/usr/bin/env bash
# carry=[".kb-cache"]: the issue-4 host sweep (kosmos self + ce, baselines) with the last copy's
# releases inline (the default since this script) and on the flag stream (KOSMOS_CE_TAIL_INLINE=0).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/reps: 5/reps: 10/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for v in ${TAIL_SWEEPS:-1 0}; do
  echo "== KOSMOS_CE_TAIL_INLINE=$v"
  KOSMOS_CE_TAIL_INLINE=$v timeout 170 kosmos-bench sweep "$Y" -o "$OUT/tail-inline-$v" 2>&1 | grep -E "^ag-gemm|^# verd" \
      | awk '{print $2, $4, $5, $6, $7, $10, $11, $12}'
done
(cd "$OUT" && tar czf runs.tgz tail-inline-*/*/points tail-inline-*/*/manifest.json)
