#!/usr/bin/env bash
# Issue 4 (carry=[".kb-cache"]): kosmos GPU tests, then the host-fabric CE sweep with the
# default plan (last group in 2 K-slices, demand_group sizes) against nccl-seq / nccl-overlap, traced, 10 reps.
# Pass the commit from the machine that holds the repo (the device copy's .git can be stale):
#   KOSMOS_GIT_SHA=<git rev-parse HEAD here> RUN_NAME=... bash scripts/device_issue4_sweep.sh
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_nvml.py 2>&1 | tail -2
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/reps: 5/reps: 10/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
timeout 200 kosmos-bench sweep "$Y" --trace -o "$OUT/${RUN_NAME:-host-ce}" 2>&1 | grep -E "^ag-gemm|^# verd|^#op"
(cd "$OUT" && tar czf runs.tgz */*/points */*/manifest.json */*/traces)
