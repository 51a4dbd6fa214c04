#!/usr/bin/env bash
# carry=[".kb-cache"]: the new defaults (own bands in regular groups, the remote ramp only where
# the own bands do not cover the first group's copy): the whole GPU test suite, then the CE host
# sweep twice (A: defaults, every point) with B = KOSMOS_LOCAL_HALVE=1 (the old own groups) on
# 70b FC1, the one layer besides 405b FC1 whose schedule the change moves.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tail -2
ROUNDS=2 AB_ENV="KOSMOS_LOCAL_HALVE=1" bash scripts/device_sweep_ab.sh
