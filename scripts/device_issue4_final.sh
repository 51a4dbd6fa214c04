#!/usr/bin/env bash
# Issue 4, host-fabric copy-engine movers after the launch-path fixes (carry=[".kb-cache"]):
# kosmos GPU tests, the CE-only host sweep traced with whole bands (KOSMOS_CE_SLICES=1) and
# with the default plan (last group in K-slices), the SM clock / power probe, and (RUN_VARIANTS=1)
# interleaved variants on shared pages.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
KOSMOS_CE_SLICES=1 timeout 100 kosmos-bench sweep "$Y" --trace -o "$OUT/host-ce-whole" 2>&1 | grep -E "^ag-gemm|^# verd"
timeout 100 kosmos-bench sweep "$Y" --trace -o "$OUT/host-ce-k8" 2>&1 | grep -E "^ag-gemm|^# verd"
[ "${RUN_VARIANTS:-0}" = 1 ] && CE_VARIANTS=1,4,8 timeout 240 python3 scripts/device_ce_variants.py "$OUT/ce_variants.parquet" 9 2>&1 | grep -v Warn | tail -7
timeout 60 python3 scripts/device_clock_probe.py 8192 106496 16384 1.5 2>&1 | grep -v Warn | tail -9
(cd "$OUT" && tar czf runs.tgz */*/points */*/manifest.json */*/traces)
