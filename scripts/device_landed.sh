#!/usr/bin/env bash
# carry=[".kb-cache"]: is the fused call's extra energy on FC1 the kernel's own or the arrivals'?
# (device_preload.sh's KOSMOS_CE_HEAD_MAIN + HEAD_MB run overlapped, not serial: checked here.)
# 1. what the head-on-main runner enqueues, and one call's time against copy alone;
# 2. energy back to back at the power limit: cuBLAS, the fused call, the fused kernel alone with
#    its data landed ("landed"), copy plan then kernel ("serial"), cuBLAS + copy concurrently.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
cd scripts
KOSMOS_CE_HEAD_MAIN=1 KOSMOS_CE_HEAD_MB=100000 timeout 60 python3 - <<'PY' 2>&1 | grep -v -i warn
import torch
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.impls import nccl as nccl_impls
from _host_point import host_ce_point
dev = torch.device("cuda", 0)
p, ctx, inputs = host_ce_point(8192, 57344, 8192, dev)
r = IMPLS[0].prepare(p, ctx, inputs)
print("head_main", r.ce.head_main, "head", r.ce_head, "of", len(r.ce_entries), "entries,", r.ce_copies, "copies")
copy = nccl_impls.comm_alone(p, ctx, inputs)
for name, f in (("copy", copy), ("headmain", r.run)) * 3:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); a.record(); f(); b.record(); torch.cuda.synchronize()
    print(f"{name} {a.elapsed_time(b) * 1e3:.0f} us")
PY
ENERGY_FNS=${ENERGY_FNS:-cublas,kosmos,landed,serial,both} timeout 240 python3 device_energy_probe.py "$OUT" \
    ${SHAPES:-8192x106496x16384,8192x57344x8192} 1.5 2>&1 | grep -v -i warn | grep -v "rep [01]:" | tail -16
