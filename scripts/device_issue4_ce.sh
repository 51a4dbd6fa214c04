#!/usr/bin/env bash
# Issue 4, copy-engine movers only (carry=[".kb-cache"]): their GPU tests, the CE plan alone
# against one memcpy, and the host-fabric sweep's kosmos[self,sm90,ce-mover] points with
# nccl-overlap timed in the same run (traced).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -3
timeout 40 python3 scripts/device_ce_plan.py 16384 10240 8192
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
timeout 150 kosmos-bench sweep "$Y" --trace -o "$OUT/host-ce" 2>&1 | grep -E "^ag-gemm|^#" | tail -24
(cd "$OUT" && tar czf runs.tgz */*/points */*/manifest.json */*/traces 2>/dev/null)
