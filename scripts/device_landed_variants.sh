#!/usr/bin/env bash
# carry=[".kb-cache"]: the fused kernel alone with its data landed (device_energy_probe.py's
# "landed"), back to back at the power limit, one fresh process per variant of the schedule's
# remote band groups: where does it lose to cuBLAS on FC1? ENERGY_TRACE=1 adds one traced call
# of each runner (and of the world-1 kernel on the same rank GEMM): tile time, gaps, idle.
#   LV_VARIANTS="def: flat:KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0" bash scripts/device_landed_variants.sh
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
SHAPES=${LV_SHAPES:-8192x106496x16384,8192x57344x8192}
VARIANTS=${LV_VARIANTS:-"def:ENERGY_TRACE=1 flat:KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0;ENERGY_TRACE=1 s1:KOSMOS_CE_SLICES=1 flat11:KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0;KOSMOS_BAND_GROUP=11"}
cd scripts
for v in $VARIANTS; do
  tag=${v%%:*}; envs=${v#*:}
  env B2B_TAG=$tag ENERGY_FNS=${LV_FNS:-landed,kosmos,cublas} ${envs//;/ } timeout 200 python3 device_energy_probe.py \
      "$OUT" "$SHAPES" "${LV_SECS:-1.0}" 2>&1 \
      | grep -v -i -E "warn|rep [01]:|numa node|sm90 vs|cuBLAS kernels|^tag|J_per_call"
done
