#!/usr/bin/env bash
# Issue 4 diagnosis on 1x H200 (carry=[".kb-cache"]): copy-engine mover streams 1/2/4 on three
# host-fabric shapes (traced at 2 streams: where does the fused kernel's time go?), and the
# world-1 builder: fused AG+GEMM kernel vs the standalone builder vs cuBLAS (builder-quick).
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
Y=$OUT/diag.yaml
cat > "$Y" <<'YAML'
op: ag-gemm
impls: [kosmos, nccl-overlap]
world: [8]
fabric: host
shapes: [{M: 16384, N: 10240, K: 8192}, {M: 8192, N: 57344, K: 8192}, {M: 16384, N: 106496, K: 16384}]
kosmos: {policy: [self], builder: [sm90], mover: [ce]}
timing: {warmup: 2, reps: 5}
YAML
for s in 1 2 4; do
  tr=""; [ $s = 2 ] && tr="--trace"
  KOSMOS_CE_STREAMS=$s timeout 100 kosmos-bench sweep "$Y" $tr -o "$OUT/ce$s" > "$OUT/ce$s.log" 2>&1
done
sed -i 's/mover: \[ce\]/mover: [sm]/' "$Y"; timeout 80 kosmos-bench sweep "$Y" --trace --impl kosmos -o "$OUT/sm" > "$OUT/sm.log" 2>&1
timeout 120 kosmos-bench sweep builder-quick -o "$OUT/bq" > "$OUT/bq.log" 2>&1
KOSMOS_GEMM_KERNEL=standalone timeout 80 kosmos-bench sweep builder-quick --impl kosmos -o "$OUT/bqs" > "$OUT/bqs.log" 2>&1
python3 - "$OUT" <<'PY'
import glob, sys, pandas as pd
out = sys.argv[1]
cols = ["variant", "M", "N", "K", "t_median_us", "t_gemm_us", "t_comm_us", "overlap_efficiency", "busy_frac_build",
        "wait_frac", "first_build_us", "tail_after_move_us", "wg_busy_frac_min", "tflops"]
pd.set_option("display.width", 250)
for d in ("ce1", "ce2", "ce4", "sm", "bq", "bqs"):
    fs = glob.glob(f"{out}/{d}/*/points/*.parquet")
    if not fs:
        print(d, "no points"); continue
    df = pd.concat([pd.read_parquet(f) for f in fs])
    df = df[[c for c in cols if c in df.columns]].sort_values(["M", "N", "K", "variant"])
    print(f"== {d}"); print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
PY
(cd "$OUT" && tar czf diag.tgz */*/points */*/manifest.json */*/traces 2>/dev/null; ls -la diag.tgz)
