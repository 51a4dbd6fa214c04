#!/usr/bin/env bash
# Issue 4, streamed K-slices (carry=[".kb-cache"]). Stage "tests": the kosmos GPU tests, the
# CE plan alone for whole bands / K-sliced last group / every group sliced, then the
# host-fabric CE sweep with the default plan (traced). Stage "variants": the same sweep with
# whole bands only (KOSMOS_CE_SLICES=1, the previous plan) and with every group streamed
# (KOSMOS_CE_SLICE_MB=8), untraced, each with nccl-overlap timed in the same run.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
STAGE=${1:-tests}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
sweep() {  # name, extra args; env (and Y, the sweep file) set by the caller
  local t0=$SECONDS
  timeout 200 kosmos-bench sweep "${Y}" -o "$OUT/$1" "${@:2}" 2>&1 | grep -E "^ag-gemm|^#|rror" | tail -20
  echo "[$1: $((SECONDS - t0)) s]"
}
if [ "$STAGE" = tests ]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -4
  for cfg in "1 0" "8 0" "8 8"; do
    set -- $cfg
    KOSMOS_CE_SLICES=$1 KOSMOS_CE_SLICE_MB=$2 timeout 60 python3 scripts/device_ce_plan.py 8192 57344 8192 2>&1 | tail -4
  done
  sweep host-ce-k8 --trace
else
  KOSMOS_CE_SLICES=1 sweep host-ce-whole
  KOSMOS_CE_SLICE_MB=8 sweep host-ce-k8-mb8
  Y=sweeps/builder-host-shards.yaml sweep builder-host-shards
fi
(cd "$OUT" && tar czf runs.tgz */*/points */*/manifest.json */*/traces 2>/dev/null; ls -la runs.tgz)
