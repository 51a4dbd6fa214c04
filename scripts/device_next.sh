#!/usr/bin/env bash
# carry=[".kb-cache"]: where does the fused kernel at world 1 lose ~3% to our standalone builder
# at the 700 W limit (405b FC1 rank GEMM 8192x13312x16384, same mainloop, lower clock at the same
# power)? The tile raster sets the HBM traffic: the standalone GEMM with raster groups of 6 / 8 /
# 11 / 16 bands, then the world-1 kernel with its own-band groups regular (KOSMOS_LOCAL_HALVE=0)
# at those sizes (KOSMOS_LOCAL_GROUP).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
LV_SHAPES=8192x106496x16384 LV_FNS=cublas,sm90,sm90g6,sm90g11,sm90g16,world1 LV_VARIANTS="def:" \
  bash scripts/device_landed_variants.sh
LV_SHAPES=8192x106496x16384 LV_FNS=sm90,world1 \
  LV_VARIANTS="g8:KOSMOS_LOCAL_HALVE=0;KOSMOS_LOCAL_GROUP=8 g11:KOSMOS_LOCAL_HALVE=0 g16:KOSMOS_LOCAL_HALVE=0;KOSMOS_LOCAL_GROUP=16 g6:KOSMOS_LOCAL_HALVE=0;KOSMOS_LOCAL_GROUP=6 g22:KOSMOS_LOCAL_HALVE=0;KOSMOS_LOCAL_GROUP=22" \
  bash scripts/device_landed_variants.sh
