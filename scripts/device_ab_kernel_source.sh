#!/usr/bin/env bash
# carry=[".kb-cache", ".gl"]: A/B of the sm90 AG kernel's source in one device call, back to back
# at the power limit (device_landed_variants.sh: the builder alone, the fused kernel at world 1,
# the landed kernel; fresh process per variant). Each alternative source is a whole
# csrc/ag_gemm_sm90.cu kept under .gl/ (ignored, carried) whose library was built into .kb-cache
# on the CPU box beforehand (cp it over csrc/, build, restore: the device has no CUTLASS headers).
#   AB_SOURCES="v0=.gl/ag_v0.cu" AB_NOW="v1:KOSMOS_AHEAD_BLOCKS=24 v1g8:KOSMOS_BAND_GROUP=8" \
#     bash scripts/device_ab_kernel_source.sh        (AB_FNS, AB_SHAPES as LV_FNS, LV_SHAPES)
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
probe() { LV_SHAPES=${AB_SHAPES:-8192x106496x16384} LV_FNS=${AB_FNS:-sm90,world1,landed} LV_VARIANTS="$1" \
    bash scripts/device_landed_variants.sh 2>&1 | grep -v "bitwise = fused call: True"; }
cp csrc/ag_gemm_sm90.cu /tmp/ag_now.cu
trap 'cp /tmp/ag_now.cu csrc/ag_gemm_sm90.cu' EXIT
for s in ${AB_SOURCES:-}; do
  cp "${s#*=}" csrc/ag_gemm_sm90.cu
  probe "${s%%=*}:KOSMOS_AHEAD_BLOCKS=24"
done
cp /tmp/ag_now.cu csrc/ag_gemm_sm90.cu
NOW=${AB_NOW-now:KOSMOS_AHEAD_BLOCKS=24}  # AB_NOW="" skips the committed source
[ -z "$NOW" ] || probe "$NOW"
