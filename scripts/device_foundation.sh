#!/usr/bin/env bash
# Device check of the foundation (issue 2): baselines vs torch.matmul on 1 GPU (world 1),
# the host fabric (W=8 rank-0 view), and the CPU gloo path. Usage on the GPU box:
#   OUT=/some/dir bash scripts/device_foundation.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
R="$OUT/results"
kosmos-bench doctor
kosmos-bench sweep ag-gemm --impl nccl-seq,nccl-overlap --world 1 -o "$R/world1"
kosmos-bench sweep gemm-rs --impl nccl-seq,nccl-overlap --world 1 -o "$R/world1"
kosmos-bench sweep smoke --backend cpu -o "$R/gloo"
kosmos-bench sweep gemm-rs-smoke --backend cpu -o "$R/gloo"
kosmos-bench sweep ag-gemm --impl nccl-seq,nccl-overlap -o "$R/host"
kosmos-bench sweep gemm-rs --impl nccl-seq,nccl-overlap -o "$R/host"
[ -f scripts/device_baselines.py ] && timeout 300 python3 scripts/device_baselines.py
(cd "$OUT" && tar czf results.tgz results && rm -rf results)
