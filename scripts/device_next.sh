#!/usr/bin/env bash
# carry=[".kb-cache"]: the next session's first device call (2026-12-03 note): the kosmos GPU tests
# (commits after 5f2759e: make_stream_pair, the KOSMOS_CE_PLAN_STREAMS check), then back to back
# in fresh processes: per-peer merged copies on 70b FC1 (the simulator: 0.2-0.8% faster) and the
# flag spin's sleep on the power-limited 405b FC1 8k, each A/B/A/B.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
B2B_VARIANTS="s2: merge:KOSMOS_CE_MERGE=1 s2b: mergeb:KOSMOS_CE_MERGE=1" bash scripts/device_b2b_variants.sh
B2B_SHAPES=8192x106496x16384 B2B_VARIANTS="spin32: spin1k:KOSMOS_SPIN_NS=1024 spin4k:KOSMOS_SPIN_NS=4096 spin32b:" \
    bash scripts/device_b2b_variants.sh
