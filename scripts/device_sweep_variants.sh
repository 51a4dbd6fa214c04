#!/usr/bin/env bash
# carry=[".kb-cache"]: the CE host sweep (kosmos self + nccl-overlap, mover ce, REPS timed
# repetitions, default 20) on the points SV_SED keeps (default: 405b FC1), once per variant of
# SV_VARIANTS ("tag:ENV=v;ENV2=v tag2: ..."; an empty env = the defaults), each in a fresh worker,
# ROUNDS times (default 1), in order: $OUT/sweep-<tag><round>.parquet.
#   SV_VARIANTS="def: g11:KOSMOS_BAND_GROUP=11" bash scripts/device_sweep_variants.sh
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
Y=$OUT/sweep-variants.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e "s/reps: [0-9]*/reps: ${REPS:-20}/" \
    -e "${SV_SED:-s/names: \[llama3-70b, llama3-405b\]/names: [llama3-405b]/; s/layers: \[qkv, fc1\]/layers: [fc1]/}" \
    sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for i in $(seq 1 "${ROUNDS:-1}"); do
  for v in ${SV_VARIANTS:-def:}; do
    tag=${v%%:*}; envs=${v#*:}
    echo "== $tag$i $envs"
    env KOSMOS_SV=$tag ${envs//;/ } timeout 300 kosmos-bench sweep "$Y" -o "$OUT/sweep-$tag$i" 2>&1 | grep -E "^ag-gemm" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
    kosmos-bench compact "$OUT/sweep-$tag$i" -o "$OUT/sweep-$tag$i.parquet" >/dev/null && rm -rf "$OUT/sweep-$tag$i"
  done
done
