#!/usr/bin/env bash
# carry=[".kb-cache"]: is the fused kernel's extra energy on 405b FC1 its own, or the arrivals'?
# "preloaded": KOSMOS_CE_HEAD_MAIN=1 KOSMOS_CE_HEAD_MB=100000 puts every copy and release of the
# plan on the main stream before the kernel, so the kernel finds all its data landed (no waits,
# no ramp, no K-slice tail): its call = copy + the fused kernel as a plain GEMM, to compare with
# nccl-seq (copy + cuBLAS) back to back at the power limit. 1. correctness and b2b time of the
# preloaded runner (device_b2b_variant.py); 2. energy of preloaded kosmos, nccl-seq, cuBLAS, copy.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
export KOSMOS_CE_HEAD_MAIN=1 KOSMOS_CE_HEAD_MB=100000 B2B_TAG=preloaded B2B_REPS=10
(cd scripts && timeout 90 python3 device_b2b_variant.py "$OUT" 8192x106496x16384 2>&1 | grep -v -i warn | tail -1)
(cd scripts && ENERGY_FNS=kosmos,seq,cublas,copy timeout 120 python3 device_energy_probe.py "$OUT" 8192x106496x16384 1.0 \
    2>&1 | grep -v -i warn | tail -6)
