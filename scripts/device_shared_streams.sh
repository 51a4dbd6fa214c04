#!/usr/bin/env bash
# carry=[".kb-cache"]: the CE plans' process-wide stream pair (kosmos.plan_streams): four runners
# made one after another (was: every second one 5% slow), the kosmos GPU tests, then the
# issue-4 host sweep (all its points run in one worker process).
#   KOSMOS_GIT_SHA=<HEAD here> RUN_NAME=host-ce-shared-streams bash scripts/device_shared_streams.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT/b"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
(cd scripts && timeout 60 python3 device_stream_pairs.py 2>&1 | grep pair)
(cd scripts && B2B_REPS=20 B2B_RUNNERS=4 B2B_TAG=shared timeout 150 python3 device_b2b_variant.py "$OUT/b" 8192x57344x8192 \
    2>&1 | grep "#" | cut -c1-110)
bash scripts/device_issue4_sweep.sh
