#!/usr/bin/env bash
# carry=[".kb-cache"]: this session's device calls (2026-12-03 15:29 session); call 3:
# 1. the GPU tests (new: concurrent timing off);
# 2. does timing the GEMM + copy concurrently (t_concurrent_us, new) change the op's time? The
#    issue-4 host sweep (kosmos self with SM and CE movers, nccl-overlap; 10 reps) with
#    --concurrent / --no-concurrent alternating, each sweep a fresh worker -> OUT/cc/{on,off}{1,2};
# 3. the band-group tile order at world 1 (no communication): the 405b FC1 rank GEMMs (8k, 16k) by the
#    KOSMOS kernel against cuBLAS interleaved, KOSMOS_BAND_GROUP 3/6/11(default)/16, 20 reps (power-
#    limited): how much of the fused call's lost rate on 405b FC1 is its 6-band tile order -> OUT/groups/g*.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT/cc" "$OUT/groups"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py 2>&1 | tail -2
Y=$OUT/cc.yaml
sed -e 's/policy: \[self, fixed:8, fixed:16, fixed:32\]/policy: [self]/' -e 's/reps: 5/reps: 10/' \
    -e 's/impls: \[kosmos, nccl-seq, nccl-overlap\]/impls: [kosmos, nccl-overlap]/' sweeps/h200-host-ag-gemm-sm90.yaml > "$Y"
for tag in on1 off1 on2 off2; do
  flag=--concurrent; [[ $tag == off* ]] && flag=--no-concurrent
  echo "== $tag ($flag)"
  timeout 150 kosmos-bench sweep "$Y" $flag -o "$OUT/cc/$tag" 2>&1 | grep -E "^ag-gemm|^# verd" | awk '{print $2, $4, $5, $6, $7, $11, $13}'
done
G=$OUT/groups.yaml
sed -e '/qkv/d' -e '/N: 7168/d' -e 's/reps: 10/reps: 20/' sweeps/builder-host-shards.yaml > "$G"
for g in 6 11 3 16 0; do
  echo "== KOSMOS_BAND_GROUP=$g"
  KOSMOS_BAND_GROUP=$g timeout 150 kosmos-bench sweep "$G" -o "$OUT/groups/g$g" 2>&1 | grep -E "^gemm|^# verd" | awk '{print $2, $4, $5, $6, $7, $8, $13, $14}'
done
(cd "$OUT" && tar czf runs.tgz cc/*/*/points cc/*/*/manifest.json groups/*/*/points groups/*/*/manifest.json)
