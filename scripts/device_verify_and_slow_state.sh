#!/usr/bin/env bash
# carry=[".kb-cache"]: what the 2026-12-03 10:20 session could not run on the device: the kosmos
# GPU tests (runner set-up/close split, assert fold, ce_regime), then the slow-copy state probe
# (scripts/device_point_repeat.py) as measured (k,o,k,u,o), with the pinned-host cache emptied
# before every point, and in another order.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
cd scripts
for v in "k,o,k,u,o 0" "k,o,k,u,o 1" "o,k,k,o,k 0"; do
  set -- $v
  echo "== PR_ORDER=$1 PR_HOST_EMPTY=$2"
  PR_ORDER=$1 PR_HOST_EMPTY=$2 timeout 150 python3 device_point_repeat.py "$OUT/pr-$1-$2" 8192x57344x8192 2>&1 \
      | grep -v -i warn | tail -7
done
