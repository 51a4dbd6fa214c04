#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call. The open question of issue 4 is
# 405b FC1 8k at the 700 W limit (the fused call ~5% over cuBLAS back to back; the landed
# kernel 5-6%, world 1 ~3%): does keeping the own bands in regular groups (KOSMOS_LOCAL_HALVE=0:
# B streamed once for them instead of four times) close part of it? CE GPU tests, then the
# landed / world-1 kernels against cuBLAS and our builder at the limit, then the sweep A/B.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k "copy_engine or host" 2>&1 | tail -1
LV_SHAPES=8192x106496x16384 LV_FNS=cublas,sm90,world1,landed \
  LV_VARIANTS="def: lh0:KOSMOS_LOCAL_HALVE=0 def2: lh0b:KOSMOS_LOCAL_HALVE=0" bash scripts/device_landed_variants.sh
SV_VARIANTS="def: lh0:KOSMOS_LOCAL_HALVE=0 def2: lh0b:KOSMOS_LOCAL_HALVE=0" bash scripts/device_sweep_variants.sh
