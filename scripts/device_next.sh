#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (2026-12-03 13:18 note). Is the
# fused call on the power-limited 405b FC1 energy-bound by its demand groups' B traffic? A
# 3-band group streams B (436 MB on 405b FC1 8k) from HBM once per group: ~20 times per call
# against ~6 for 11-band groups. Energy per call, kosmos and cuBLAS back to back for 1.5 s
# (steady power state), fresh process per group size; then the GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
ENERGY_FNS=kosmos,cublas B2B_SCRIPT=device_energy_probe.py B2B_LINES=3 B2B_SHAPES=8192x106496x16384 \
B2B_VARIANTS="g3: g6:KOSMOS_BAND_GROUP=6 g11:KOSMOS_BAND_GROUP=11 g2:KOSMOS_BAND_GROUP=2 g3b:" \
    bash scripts/device_b2b_variants.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
