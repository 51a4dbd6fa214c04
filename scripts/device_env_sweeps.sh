#!/usr/bin/env bash
# carry=[".kb-cache"]: the issue-4 host sweep (kosmos self + CE movers, nccl-seq, nccl-overlap,
# 10 reps) once per value of one kosmos environment knob, into OUT/<tag>; then OUT/runs.tgz.
#   SWEEP_ENV=KOSMOS_CE_TAIL_INLINE SWEEP_VALUES="tail-inline-1=1 tail-inline-0=0" bash scripts/device_env_sweeps.sh
#   SWEEP_ENV=KOSMOS_CE_PLAN_STREAMS SWEEP_VALUES="streams-process=process streams-runner=runner streams-process2=process"
# (what made run27 as device_stream_sweeps.sh, and run29 as device_tail_sweeps.sh with "1 0" / "0 1").
# SWEEP_SED: more sed expressions for the sweep file, e.g. only 405b FC1:
#   SWEEP_SED='s/names: \[llama3-70b, llama3-405b\]/names: [llama3-405b]/;s/layers: \[qkv, fc1\]/layers: [fc1]/'
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
Y=$OUT/ce.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e 's/reps: 5/reps: 10/' -e "${SWEEP_SED:-}" sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
tags=()
for tv in ${SWEEP_VALUES:?tag=value ...}; do
  tag=${tv%%=*}; val=${tv#*=}; tags+=("$tag")
  echo "== $SWEEP_ENV=$val ($tag)"
  env "${SWEEP_ENV:?}=$val" timeout 170 kosmos-bench sweep "$Y" -o "$OUT/$tag" 2>&1 | grep -E "^ag-gemm|^# verd" \
      | awk '{print $2, $4, $5, $6, $7, $10, $11, $12}'
done
(cd "$OUT" && tar czf runs.tgz $(for t in "${tags[@]}"; do echo "$t"/*/points "$t"/*/manifest.json; done))
