#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call. Open on issue 4: at the 700 W limit
# the fused kernel at world 1 runs ~3.5% slower than our standalone builder on 405b FC1's rank
# GEMM (same mainloop, ~3% lower clock at the same power); the scheduler's wait, the per-tile
# release, setmaxnreg, the lookahead claim and the raster are ruled out
# (results/issue4-h200-20261204b/). First: traced calls (tile time, gaps, head, tail per CTA) of
# the world-1 and landed kernels beside cuBLAS / our builder back to back, to see whether the
# gap is per tile (clock) or between tiles.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
LV_SHAPES=8192x106496x16384 LV_FNS=cublas,sm90,world1,landed LV_VARIANTS="def:ENERGY_TRACE=1" \
  bash scripts/device_landed_variants.sh
