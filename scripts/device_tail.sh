#!/usr/bin/env bash
# carry=[".kb-cache"]: the fused call's time split at the last byte (scripts/device_tail_probe.py),
# fresh process per variant: the default, the last copy's releases on the copy stream
# (KOSMOS_CE_TAIL_INLINE=1), 4 K-slices, every release inline; after the GPU tests of the path.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py -k "${TESTS_K:-copy_engine}" 2>&1 | tail -${TESTS_TAIL:-2}
B2B_SCRIPT=device_tail_probe.py B2B_REPS=${B2B_REPS:-30} \
B2B_VARIANTS=${B2B_VARIANTS:-"s2: tinl:KOSMOS_CE_TAIL_INLINE=1 s4:KOSMOS_CE_SLICES=4 s4tinl:KOSMOS_CE_SLICES=4;KOSMOS_CE_TAIL_INLINE=1 inl:KOSMOS_CE_INLINE_RELEASE=1 s2b: tinlb:KOSMOS_CE_TAIL_INLINE=1"} \
    bash scripts/device_b2b_variants.sh
