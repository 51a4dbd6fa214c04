#!/usr/bin/env bash
# Re-run every kernel GPU test after the persistent.cuh refactor, then the host-fabric
# AG+GEMM FC1 points with the sm90-builder fused kernel. carry=[".kb-cache"].
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 75 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 | tail -6
timeout 80 kosmos-bench sweep h200-host-ag-gemm-sm90 -o "$OUT/r" | tail -14
(cd "$OUT/r" && tar czf "$OUT/sm90host.tgz" */points */manifest.json)
