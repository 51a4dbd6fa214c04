#!/usr/bin/env bash
# carry=[".kb-cache"]: kosmos GPU tests (C changed), then scripts/device_copy_streams.py (copy speed
# by stream; kosmos with/without the NVML sampler), then the FC1 tail-split timeline.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 | tail -2
cd scripts
CS_TAG=p1 timeout 120 python3 device_copy_streams.py "$OUT" 8192x57344x8192 2>&1 | grep -v Warning | cut -c1-200
TL_REPS=8 TL_EXTRA= TL_VARIANTS=h0.s2,h0.s2-1-1,h0.s4 timeout 200 python3 device_timeline.py "$OUT/tl" \
    8192x57344x8192,16384x57344x8192 2>&1 | tail -30
