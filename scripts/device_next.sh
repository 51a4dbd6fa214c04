#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (note of 2026-12-03 16:52-19:52).
# The sm90 AG kernel's lookahead claim at kAheadBlocks before a tile's last load was compiled
# and never run: 1. the whole GPU test file of the kernels; 2. scripts/device_lookahead2.sh
# (the CE sweep with the claim 24 blocks ahead, none, at the tile's start, 24: do the copy-bound
# FC1 points come back to 2234-2280 / 4366-4404 us?; the landed kernel and the fused call vs
# cuBLAS back to back with 24 / none: 5541 / 5554 us on 405b FC1 8k with the tile-start claim).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
[ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
GPU_TESTS_DONE=$([ -n "${SKIP_TESTS:-}" ] || echo 1) bash scripts/device_lookahead2.sh  # its sm90 tests only if skipped here
