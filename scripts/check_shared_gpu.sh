#!/usr/bin/env bash
# Issue 33: the nvlink fabric in shared-GPU mode, checked on ONE GPU (an H200): the GPU tests
# (W = 2 and 4 rank processes on cuda:0) and the smoke sweep, then a short summary.
# Run from the repository root with the prebuilt libraries carried (.kb-cache). ~2-3 min.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=$(mktemp -d /tmp/kb-shared-XXXX)
echo "== GPU tests: tests/test_nvlink_shared_gpu.py"
timeout 420 python3 -m pytest -q -rs -s tests/test_nvlink_shared_gpu.py 2>&1 | grep -v "^$" | tail -70
rc_tests=${PIPESTATUS[0]}
echo "== sweep: smoke.yaml --fabric nvlink --world 2 --impl kosmos,symm-mem"
timeout 300 python3 -m kosmos_bench.cli sweep sweeps/smoke.yaml --fabric nvlink --world 2 --impl kosmos,symm-mem \
    --timeout 120 -o "$out" 2>&1 | tail -25
rc_sweep=${PIPESTATUS[0]}
python3 - "$out" <<'PY'
import sys
from kosmos_bench.store import load_rows
df = load_rows(sys.argv[1])
cols = [c for c in ("variant", "M", "N", "K", "status", "shared_gpu", "emulated", "peer_memory", "wrong",
                    "deterministic", "t_median_us", "error", "peer_memory_why") if c in df.columns]
print("== sweep rows")
for r in df[cols].to_dict(orient="records"):
    print("  " + " | ".join(f"{k}={r[k]}" for k in cols if r[k] is not None and r[k] == r[k]))
PY
echo "== SUMMARY: GPU tests rc=$rc_tests, sweep rc=$rc_sweep (0 and 0 = issue 33 done)"
