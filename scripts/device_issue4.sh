#!/usr/bin/env bash
# Issue 4 on 1x H200: every kernel GPU test, then the host-fabric AG+GEMM sweep with the
# Hopper builder (WG movers vs copy-engine movers vs fixed roles vs the copy-engine baselines).
# Libraries prebuilt here into .kb-cache (carry=[".kb-cache"]).
#   bash scripts/device_issue4.sh            # tests + host sweep
#   bash scripts/device_issue4.sh builder    # the world-1 builder sweeps (fused default, standalone)
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
if [ "${1:-}" = builder ]; then
  timeout 330 kosmos-bench sweep builder -o "$OUT/builder" 2>&1 | tail -8
  KOSMOS_GEMM_KERNEL=standalone timeout 120 kosmos-bench sweep builder-quick --impl kosmos -o "$OUT/standalone" 2>&1 | tail -4
  (cd "$OUT" && tar czf builder.tgz builder/*/points builder/*/manifest.json standalone/*/points standalone/*/manifest.json)
  exit 0
fi
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 \
  | tail -12 | tee "$OUT/pytest.log"
timeout 330 kosmos-bench sweep h200-host-ag-gemm-sm90 -o "$OUT/host" 2>&1 | tail -75
(cd "$OUT" && tar czf host.tgz host/*/points host/*/manifest.json)
