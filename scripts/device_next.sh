#!/usr/bin/env bash
# carry=[".kb-cache"]: session 2026-12-03 14:28 device call 6 (last): the whole test suite on
# the H200 at this session's last code, then 8- vs 6-band balanced groups on 405b FC1 back to
# back (an 8-band group is one peer's shard at 8k: fewer B re-reads than 6, same-peer copies).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tail -4
B2B_SHAPES=8192x106496x16384,16384x106496x16384 B2B_VARIANTS="g6: g8:KOSMOS_BAND_GROUP=8" \
    bash scripts/device_b2b_variants.sh
