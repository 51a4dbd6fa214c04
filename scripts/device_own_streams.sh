#!/usr/bin/env bash
# carry=[".kb-cache"]: the CE plan on the library's own streams (t14): builder GPU tests, the
# copy-stream probe with dirty pool streams (variant A), then the issue-4 host sweep
# (its kosmos + nvml GPU tests first).
#   KOSMOS_GIT_SHA=<HEAD here> RUN_NAME=host-ce-own-streams bash scripts/device_own_streams.sh
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_builder_sm90_gpu.py 2>&1 | tail -1
(cd scripts && CS_TAG=A-own CS_REPS=6 timeout 90 python3 device_copy_streams.py "$OUT" 8192x57344x8192 2>&1 \
    | grep -E "^\[|kosmos|sweep loop|streams")
bash scripts/device_issue4_sweep.sh
