#!/usr/bin/env bash
# carry=[".kb-cache"]: the fill queue (KOSMOS_FILL_BANDS: own bands held back, taken by a CTA
# whose next remote tile is not ready instead of waiting). The GPU tests of the kosmos kernels
# (fill tiles on both kernels, every mover kind), then the CE host sweep on FC1 (70b, 405b) with
# 0 / 2 / 4 / 8 fill bands, the default and 4 twice.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
SV_SED="s/layers: \[qkv, fc1\]/layers: [fc1]/" \
  SV_VARIANTS="def: f2:KOSMOS_FILL_BANDS=2 f4:KOSMOS_FILL_BANDS=4 f8:KOSMOS_FILL_BANDS=8 def2: f4b:KOSMOS_FILL_BANDS=4" \
  bash scripts/device_sweep_variants.sh
