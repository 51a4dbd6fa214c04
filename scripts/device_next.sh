#!/usr/bin/env bash
# carry=[".kb-cache"]: session 2026-12-03 14:28 device call 5: the GPU tests, then the host sweep
# twice with this session's defaults (copy-bound last group of copy_bound_tail_bands = 3 bands,
# balanced groups of 6 bands) -> run30.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
SWEEP_ENV=KOSMOS_CE_HEAD_MAIN SWEEP_VALUES="first=0 second=0" bash scripts/device_env_sweeps.sh
