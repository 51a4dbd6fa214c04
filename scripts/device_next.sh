#!/usr/bin/env bash
# carry=[".kb-cache"]: session 2026-12-03 14:28 device call 3: the host sweep with 6-band
# balanced groups (new default; 405b FC1 is the only balanced shape), then 405b FC1 alone with
# groups of 3 (the old default) and 6, alternating, in sweep conditions.
set -uo pipefail
O=${OUT:-/tmp/kb-out}
OUT=$O/full SWEEP_ENV=KOSMOS_BAND_GROUP SWEEP_VALUES="g6=0" bash scripts/device_env_sweeps.sh
OUT=$O/fc1 SWEEP_SED='s/names: \[llama3-70b, llama3-405b\]/names: [llama3-405b]/;s/layers: \[qkv, fc1\]/layers: [fc1]/' \
    SWEEP_ENV=KOSMOS_BAND_GROUP SWEEP_VALUES="g3=3 g6b=0 g3b=3 g6c=0" bash scripts/device_env_sweeps.sh
