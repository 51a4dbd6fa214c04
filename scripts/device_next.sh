#!/usr/bin/env bash
# carry=[".kb-cache"]: session 2026-12-03 14:28 device call 4: the QKV (copy-bound) layers'
# tail. Their default last group is one band (groups of 1): its 5-9 tiles, on as many CTAs,
# start on slice 0 and still hold most of a tile's K when the last slice lands (each tile
# computes faster than one slice arrives only when the group has >= 3 bands). The simulator
# puts 2-8 tail bands 1.3-1.6% ahead. Split at the last byte (tail probe), A/B/A/B.
set -uo pipefail
B2B_SCRIPT=device_tail_probe.py B2B_SHAPES=8192x10240x8192,16384x10240x8192,8192x18432x16384,16384x18432x16384 \
B2B_VARIANTS="d: tb2:KOSMOS_CE_TAIL_BANDS=2 tb4:KOSMOS_CE_TAIL_BANDS=4 tb4s8:KOSMOS_CE_TAIL_BANDS=4;KOSMOS_CE_SLICES=8 d2: tb4b:KOSMOS_CE_TAIL_BANDS=4" \
    bash scripts/device_b2b_variants.sh
