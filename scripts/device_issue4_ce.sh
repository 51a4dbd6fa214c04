#!/usr/bin/env bash
# Copy-engine mover tuning check on 1x H200 (carry=[".kb-cache"]): the CE plan alone vs one
# memcpy, then the fused kernel with CE movers at 1/2 streams on four host-fabric shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 60 python3 scripts/device_ce_plan.py 16384 10240 8192
timeout 60 python3 scripts/device_ce_plan.py 16384 106496 16384
Y=$OUT/ce.yaml
cat > "$Y" <<'YAML'
op: ag-gemm
impls: [kosmos, nccl-overlap]
world: [8]
fabric: host
shapes: [{M: 16384, N: 10240, K: 8192}, {M: 16384, N: 57344, K: 8192}, {M: 8192, N: 106496, K: 16384}, {M: 16384, N: 106496, K: 16384}]
kosmos: {policy: [self], builder: [sm90], mover: [ce]}
timing: {warmup: 2, reps: 5}
YAML
for s in 1 2; do
  KOSMOS_CE_STREAMS=$s timeout 100 kosmos-bench sweep "$Y" -o "$OUT/ce$s" 2>&1 | grep -E "kosmos|overlap" | grep -v "^#" | tail -8
done
