#!/usr/bin/env bash
# One device call for the session's measured results (single H200):
#  1. host-fabric AG+GEMM sweep, traced (kosmos self/fixed/predicted vs copy-engine baselines)
#  2. host-fabric GEMM+RS sweep
#  3. simulator calibration (h200-host-pcie profile from this GPU)
#  4. world-1 baselines vs torch.matmul (interleaved timing)
# Run with carry=[".kb-cache"] so the kernels are not rebuilt. Plots and validate-sim run
# on the CPU afterwards from the returned results.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
R="$OUT/r"
timeout 200 kosmos-bench sweep h200-host-ag-gemm --trace -o "$R/host-ag"
timeout 150 kosmos-bench sweep h200-host-gemm-rs -o "$R/host-rs"
timeout 60 kosmos-bench calibrate -o "$OUT/h200-host-pcie.calibrated.json" > "$OUT/calibrate.log" 2>&1; tail -3 "$OUT/calibrate.log"
timeout 60 kosmos-bench sweep ag-gemm --impl nccl-seq --world 1 --reps 10 --warmup 3 -o "$R/world1"
(cd "$R" && tar czf "$OUT/points.tgz" */*/points */*/manifest.json && tar czf "$OUT/traces.tgz" */*/traces 2>/dev/null)
ls -la "$OUT"
