#!/usr/bin/env bash
# carry=[".kb-cache"]: where does the landed fused kernel's extra energy come from (405b FC1 8k,
# run38: landed 5600-5640 us / 3.75-3.86 J at 1395-1410 MHz vs our world-1 builder 5300 us /
# 3.48-3.60 J at 1455-1470)? Back to back, fresh process per variant: the standalone builder
# (sm90), the fused kernel at world 1 (world1: its machinery, no deps), landed with the default
# schedule, and landed with world-1's tile order (8-band groups, no ramp, no halving).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
LV_SHAPES=8192x106496x16384 LV_FNS=sm90,world1,landed,cublas \
LV_VARIANTS="e-def:KOSMOS_AHEAD_BLOCKS=24 e-g8flat:KOSMOS_BAND_GROUP=8;KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0" \
    bash scripts/device_landed_variants.sh 2>&1 | grep -v "bitwise = fused call: True"
