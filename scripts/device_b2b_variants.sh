#!/usr/bin/env bash
# carry=[".kb-cache"]: scripts/device_b2b_variant.py in one fresh process per (variant, shape):
# the CE tail's K-slicing and the demand-group size, kosmos and copy alone back to back.
# B2B_SCRIPT=device_tail_probe.py runs that probe instead (same arguments; the call's time split
# at the last byte); B2B_LINES: how many of each process's last lines to print (default 1).
#   B2B_SHAPES=8192x57344x8192,16384x57344x8192 B2B_VARIANTS="s2: s4:KOSMOS_CE_SLICES=4" bash scripts/device_b2b_variants.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT/b2b"  # both scripts append to their parquet there
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
SHAPES=${B2B_SHAPES:-8192x57344x8192,16384x57344x8192}
VARIANTS=${B2B_VARIANTS:-"s2: s4:KOSMOS_CE_SLICES=4 s211:KOSMOS_CE_SLICES=2,1,1 s31:KOSMOS_CE_SLICES=3,1 g8:KOSMOS_BAND_GROUP=8 s2-again:"}
cd scripts
for v in $VARIANTS; do
  tag=${v%%:*}; envs=${v#*:}
  for shape in ${SHAPES//,/ }; do
    env B2B_TAG=$tag ${envs//;/ } timeout 120 python3 "${B2B_SCRIPT:-device_b2b_variant.py}" "$OUT/b2b" "$shape" 2>&1 | grep -v -i warn | tail -"${B2B_LINES:-1}"
  done
done
