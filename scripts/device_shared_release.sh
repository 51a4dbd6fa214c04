#!/usr/bin/env bash
# carry=[".kb-cache"]: one flag release per copy (KOSMOS_CE_SHARED_RELEASE, ce_plan.share_flags)
# against one per band: the copy-engine GPU tests, the tail probe back to back in fresh
# processes (70b FC1 8k / 16k), a traced call (tile starts per band) and the CE host sweep A/B.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
python3 -m pytest -q -x tests/test_kosmos_gpu.py -k "copy_engine or host" 2>&1 | tail -3
B2B_SCRIPT=device_tail_probe.py B2B_SHAPES=${SR_SHAPES:-8192x57344x8192,16384x57344x8192} \
  B2B_VARIANTS="sh1: sh0:KOSMOS_CE_SHARED_RELEASE=0 sh1b: sh0b:KOSMOS_CE_SHARED_RELEASE=0" bash scripts/device_b2b_variants.sh
B2B_SCRIPT=device_split_trace.py B2B_LINES=9 B2B_SHAPES=8192x57344x8192 \
  B2B_VARIANTS="sh1: sh0:KOSMOS_CE_SHARED_RELEASE=0" bash scripts/device_b2b_variants.sh
[ "${SR_SWEEP:-1}" = 1 ] && AB_ENV="KOSMOS_CE_SHARED_RELEASE=0" ROUNDS=${ROUNDS:-1} bash scripts/device_sweep_ab.sh
