#!/usr/bin/env bash
# Issue 4 on 1x H200 (libraries prebuilt here into .kb-cache; carry=[".kb-cache"]):
#   1. every kernel GPU test (fused, sm90, copy-engine movers, world-1 gemm kernels)
#   2. the host-fabric AG+GEMM sweep with the Hopper builder: WG movers (self, fixed:k),
#      copy-engine movers, and the copy-engine baselines nccl-seq / nccl-overlap
#   3. the world-1 builder sweep (fused AG+GEMM kernel at world 1 vs cuBLAS), and the
#      standalone builder on builder-quick for comparison
# Prints the tables; run directories are tarred under $OUT.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 \
  | tail -12 | tee "$OUT/pytest.log"
timeout 60 python3 scripts/device_ce_plan.py 16384 10240 8192 2>&1 | tee "$OUT/ce_plan.log"
timeout 240 kosmos-bench sweep h200-host-ag-gemm-sm90 --trace -o "$OUT/host" > "$OUT/host.log" 2>&1
grep -v "skipped" "$OUT/host.log" | tail -50
timeout 200 kosmos-bench sweep builder -o "$OUT/builder" > "$OUT/builder.log" 2>&1; tail -6 "$OUT/builder.log"
KOSMOS_GEMM_KERNEL=standalone timeout 60 kosmos-bench sweep builder-quick --impl kosmos -o "$OUT/standalone" \
  > "$OUT/standalone.log" 2>&1; tail -3 "$OUT/standalone.log"
(cd "$OUT" && tar czf runs.tgz */*/points */*/manifest.json */*/traces 2>/dev/null)
