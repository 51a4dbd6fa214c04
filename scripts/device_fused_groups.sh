#!/usr/bin/env bash
# carry=[".kb-cache"]: the fused call (405b FC1 8k) back to back vs cuBLAS, fresh process per remote
# band-group shape: default (6-band balanced groups, ramp, halving), no ramp + no halving with 6 or
# 8 bands, no ramp, no halving (the landed kernel was 2.2% faster with 8 flat: does the fused call follow?).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
LV_SHAPES=8192x106496x16384 LV_FNS=kosmos,cublas LV_SECS=1.0 \
LV_VARIANTS="f-def:KOSMOS_AHEAD_BLOCKS=24 f-flat6:KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0 f-flat8:KOSMOS_BAND_GROUP=8;KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0 f-noramp:KOSMOS_BAND_RAMP=0 f-nohalve:KOSMOS_BAND_HALVE=0" \
    bash scripts/device_landed_variants.sh 2>&1 | grep -v "bitwise = fused call: True"
