#!/usr/bin/env bash
# carry=[".kb-cache"]: split tail tiles (KOSMOS_SPLIT_K=bands:parts, AG_PART K-parts with a
# last-arriver fp32 sum): the GPU test files, then the tail probe back to back in fresh processes
# (70b FC1 8k and 16k unless SPLIT_SHAPES), default vs split settings.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider -x tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py \
      -k "${TEST_K:-sm90}" 2>&1 | tail -4 > "$OUT/tests.txt"
  cat "$OUT/tests.txt"
fi
OUT=$OUT B2B_SCRIPT=device_tail_probe.py B2B_SHAPES=${SPLIT_SHAPES:-8192x57344x8192,16384x57344x8192} \
  B2B_VARIANTS="${SPLIT_VARIANTS:-def: s4x4:KOSMOS_SPLIT_K=4:4 s4x4k1:KOSMOS_SPLIT_K=4:4;KOSMOS_CE_SLICES=1 s2x4k1:KOSMOS_SPLIT_K=2:4;KOSMOS_CE_SLICES=1 s1x4k1:KOSMOS_SPLIT_K=1:4;KOSMOS_CE_SLICES=1 s8x4k1:KOSMOS_SPLIT_K=8:4;KOSMOS_CE_SLICES=1 def2:}" \
  bash scripts/device_b2b_variants.sh
