#!/usr/bin/env bash
# carry=[".kb-cache"]: the fill-queue GPU tests, then fewer B streams on 405b FC1 (K = 16384:
# every demand group streams the 436 MB of B from HBM; a 1-2 band group is HBM-bound): no ramp
# (the 8 own bands cover the first 6-band group's copy), own bands in one group, both, no halving.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k "fill or copy_engine" 2>&1 | tail -2
SV_VARIANTS="def: nr:KOSMOS_BAND_RAMP=0 lh:KOSMOS_LOCAL_HALVE=0 nrlh:KOSMOS_BAND_RAMP=0;KOSMOS_LOCAL_HALVE=0 nrnh:KOSMOS_BAND_RAMP=0;KOSMOS_BAND_HALVE=0;KOSMOS_LOCAL_HALVE=0 def2: nrlh2:KOSMOS_BAND_RAMP=0;KOSMOS_LOCAL_HALVE=0" \
  bash scripts/device_sweep_variants.sh
