#!/usr/bin/env bash
# carry=[".kb-cache"]: scripts/device_copy_streams.py in fresh processes that differ in the
# streams made before the kosmos runner (70b FC1 8k). CS_TESTS=1 runs the kosmos GPU tests first.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache CS_REPS=${CS_REPS:-6}
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
[ "${CS_TESTS:-0}" = 1 ] && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 | tail -2
cd scripts
probe() { timeout 90 env "$@" python3 device_copy_streams.py "$OUT" 8192x57344x8192 2>&1 | grep -v -i warn | grep -v "^ *_warn" | cut -c1-220; }
probe CS_TAG=A
probe CS_TAG=B CS_USE=0
probe CS_TAG=C CS_HI=0
probe CS_TAG=D CS_LOW=0 CS_HI=0
probe CS_TAG=E CUDA_DEVICE_MAX_CONNECTIONS=32
probe CS_TAG=F CS_LOW=0
