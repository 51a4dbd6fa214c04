"""One host-fabric AG+GEMM point (W=8, policy self): default mma builder vs the opt-in sm90
builder (csrc/ag_gemm_sm90.cu). Prints a 3-line table (median of 5 calls after 2 warm-up,
device events; `wrong` from check_output on the first call).

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache PYTHONPATH=. python3 scripts/device_ag_sm90.py [M N K]
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from kosmos_bench.impls.base import RankCtx
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.ops import get_op
from kosmos_bench.ops.base import check_output
from kosmos_bench.point import Point

DEV = torch.device("cuda", 0)
W = 8
M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (16384, 57344, 8192)


def main() -> None:
    p = Point(op="ag-gemm", impl="kosmos", M=M, N=N, K=K, world=W, fabric="host", policy="self", seed=0)
    ctx = RankCtx(rank=0, world=W, procs=1, device=DEV, fabric="host", backend="gpu")
    o = get_op("ag-gemm")
    inputs, A, B = o.inputs(p, list(range(W)), DEV, seed=1)
    ref = o.reference(A, B, 0, W)
    rows = []
    for builder in ("mma", "sm90"):
        r = IMPLS[0].prepare(p, ctx, inputs, builder=builder)
        try:
            out = r.outputs[0]
            out.fill_(float("nan"))
            r.run()
            r.check()
            wrong, err = check_output(out, ref, "bf16")
            for _ in range(2):
                r.run()
            r.check()
            st = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
            en = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
            for i in range(5):
                st[i].record()
                r.run()
                en[i].record()
            r.check()
            t = float(np.median([s.elapsed_time(e) * 1e3 for s, e in zip(st, en)]))
            rows.append((builder, t, wrong, r.info["num_wgs"]))
        finally:
            r.close()
    print(f"builder  M={M} N={N} K={K} W={W} host self   t_us      wrong  ctas")
    for b, t, w, g in rows:
        print(f"{b:<8} {'':38} {t:9.1f} {w:8d} {g:5d}   ({rows[0][1] / t:.2f}x vs mma)")


if __name__ == "__main__":
    main()
