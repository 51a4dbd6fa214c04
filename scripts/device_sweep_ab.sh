#!/usr/bin/env bash
# carry=[".kb-cache"]: the CE host sweep (kosmos self + nccl-overlap, mover ce) with REPS timed
# repetitions (default 20, as the committed sweep file), alternating A (defaults, every point)
# and B (the environment in AB_ENV, e.g. "KOSMOS_CE_SLICES=6,4,2,1", on the points AB_SED keeps),
# ROUNDS times (default 2), each sweep in a fresh worker: $OUT/sweep-{a,b}<i>.parquet.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
Y=$OUT/sweep.yaml
sed -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' \
    -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/mover: \[sm, ce\]/mover: [ce]/' \
    -e "s/reps: [0-9]*/reps: ${REPS:-20}/" sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
sed -e "${AB_SED:-s/names: \[llama3-70b, llama3-405b\]/names: [llama3-70b]/; s/layers: \[qkv, fc1\]/layers: [fc1]/}" "$Y" > "$OUT/sweep-b.yaml"
one() {  # tag yaml [env...]
  local tag=$1 y=$2; shift 2
  echo "== $tag $*"
  env "$@" timeout 200 kosmos-bench sweep "$y" -o "$OUT/sweep-$tag" 2>&1 | grep -E "^ag-gemm" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
  kosmos-bench compact "$OUT/sweep-$tag" -o "$OUT/sweep-$tag.parquet" >/dev/null && rm -rf "$OUT/sweep-$tag"
}
for i in $(seq 1 "${ROUNDS:-2}"); do
  one a$i "$Y" KOSMOS_AB=a
  [ -n "${AB_ENV:-}" ] && one b$i "$OUT/sweep-b.yaml" ${AB_ENV}
done
