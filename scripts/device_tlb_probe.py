"""Why is the host-fabric kosmos call ~10% slower in the interleaved loop than back to back
(scripts/device_regime.py, 70b FC1 8k: 2459 vs 2233 us, SM clock 1980 MHz in both)? Two-function
interleaved loops of kosmos (and of copy alone / nccl-overlap) with one other function each:
a copy, a GEMM, a sparse reader that touches one element per 2 MB page of a 4 GB buffer (GPU
address translations evicted, almost no bytes moved) and a 1 GB memset (bytes and pages).
``kosmos+warm`` first touches one element per 2 MB page of the call's own buffers (gathered
buffer, B, C, A_r) with torch ops, inside the timed region. (Commit 2bfd638 also had the kernel do it at
entry, Params.warm_pages: 5% slower, removed.)

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_tlb_probe.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from _host_point import host_ce_point, nccl_overlap_run, script_args  # scripts/: shared host-fabric set-up

PAGE = 2 << 20
REPS = int(os.environ.get("TLB_REPS", "10"))


def page_toucher(tensors):
    """One element per 2 MB page of each tensor, summed (one small gather kernel per tensor)."""
    views = [t.view(-1)[::max(1, PAGE // t.element_size())] for t in tensors]
    sink = torch.zeros((), device=tensors[0].device, dtype=torch.float32)

    def run():
        for v in views:
            sink.add_(v.float().sum())
    return run


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/tlb")
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    runner = IMPLS[0].prepare(p, ctx, inputs)
    kosmos = runner.run
    warm = page_toucher([runner.ce_work, runner.outputs[0], inputs.B[0], inputs.A[0]])

    def kosmos_warm():
        warm()
        kosmos()

    big = torch.ones(4 << 30, dtype=torch.uint8, device=dev)
    sparse = page_toucher([big])
    gig = big[:1 << 30]
    others = {"copy": nccl_impls.comm_alone(p, ctx, inputs), "gemm": nccl_impls.gemm_alone(p, ctx, inputs),
              "sparse-4GB": sparse, "memset-1GB": lambda: gig.zero_()}
    nccl = nccl_overlap_run(p, ctx, inputs)
    mains = {"kosmos": kosmos, "kosmos+warm": kosmos_warm, "copy": others["copy"], "nccl-overlap": nccl}
    rows = []
    for mname, mfn in mains.items():
        res = timing.bench({"main": mfn}, device=dev, warmup=3, reps=REPS)
        rows.append({"main": mname, "with": "(alone)", "median_us": float(np.median(res["main"]))})
        for oname, ofn in others.items():
            if oname == mname:
                continue
            res = timing.bench({"main": mfn, "other": ofn}, device=dev, warmup=3, reps=REPS)
            rows.append({"main": mname, "with": oname, "median_us": float(np.median(res["main"])),
                         "other_us": float(np.median(res["other"]))})
    runner.check()
    runner.close()
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/tlb.parquet")
    print(f"\n{M}x{N}x{K}: median us of `main` in a 2-function interleaved loop with `with`")
    print(df.pivot(index="main", columns="with", values="median_us").round(0).to_string())
    print("\nthe other function's own time:")
    print(df.dropna(subset=["other_us"]).pivot(index="main", columns="with", values="other_us").round(0).to_string())


if __name__ == "__main__":
    main()
