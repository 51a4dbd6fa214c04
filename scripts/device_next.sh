#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (2026-12-03 13:18 note).
# 1. the GPU tests (ce_settings refactor and KOSMOS_CE_TAIL_BANDS are not device-tested yet);
# 2. a smaller last group in finer slices on 70b FC1 (the call split at its last byte): 2 bands
#    x 4 K-slices leaves a quarter tile's K after the last byte on 56 CTAs while the group before
#    (2-3 bands, whole) still fits beside it, where 4 bands x 2 slices leave half a tile's K;
# 3. is the power-limited 405b FC1 energy-bound by its demand groups' B traffic? (a 3-band group
#    streams B, 436 MB at 8k, from HBM once per group: ~20 times a call against ~6 for 11-band
#    groups): energy per call, kosmos and cuBLAS back to back for 1.5 s, per group size.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
B2B_SCRIPT=device_tail_probe.py \
B2B_VARIANTS="d: tb2s4:KOSMOS_CE_TAIL_BANDS=2;KOSMOS_CE_SLICES=4 tb3s4:KOSMOS_CE_TAIL_BANDS=3;KOSMOS_CE_SLICES=4 tb2:KOSMOS_CE_TAIL_BANDS=2 d2: tb2s4b:KOSMOS_CE_TAIL_BANDS=2;KOSMOS_CE_SLICES=4" \
    bash scripts/device_b2b_variants.sh
ENERGY_FNS=kosmos,cublas B2B_SCRIPT=device_energy_probe.py B2B_LINES=3 B2B_SHAPES=8192x106496x16384 \
B2B_VARIANTS="g3: g6:KOSMOS_BAND_GROUP=6 g11:KOSMOS_BAND_GROUP=11 g2:KOSMOS_BAND_GROUP=2 g3b:" \
    bash scripts/device_b2b_variants.sh
