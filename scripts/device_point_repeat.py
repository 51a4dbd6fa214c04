"""Is the sweep's slow copy alone in kosmos FC1 points (run25/run26: 2261 vs 2138-2145 us in
the baselines' points of the same shape) a property of the kosmos point or of the process's
history? One process runs harness.run_point for one shape as the sweep does, in the order
PR_ORDER (default k,o,k,u,o: kosmos, nccl-overlap, kosmos, kosmos untraced, nccl-overlap) and
prints each row's times with the addresses copy alone used (its device destination, the
pinned shards). PR_HOST_EMPTY=1 empties torch's pinned-host cache before every point.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_point_repeat.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import os

import pandas as pd
import torch

from kosmos_bench import harness
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.point import Point
from _host_point import W, script_args  # scripts/: shared host-fabric set-up


def main() -> None:
    out, ((M, N, K), *_), _ = script_args("/tmp/point-repeat")
    kw = dict(op="ag-gemm", M=M, N=N, K=K, world=W, fabric="host", backend="gpu", warmup=2, reps=10, seed=0)
    kos = Point(impl="kosmos", policy="self", queue_order="demand", local_first=True, builder="sm90", mover="ce",
                trace=True, **kw)
    ovl = Point(impl="nccl-overlap", trace=True, **kw)
    kinds = {"k": ("kosmos", kos), "o": ("nccl-overlap", ovl), "u": ("kosmos untraced", kos.replace(trace=False))}
    order = os.environ.get("PR_ORDER", "k,o,k,u,o").split(",")
    seen: dict = {}
    real_comm = nccl_impls.comm_alone

    def comm_alone(p, ctx, inputs):  # note where copy alone reads and writes
        host = nccl_impls.host_peers(p, ctx, inputs)
        seen["shard_ptrs"] = ",".join(hex(t.data_ptr()) for t in host.shards if t is not None)
        fn = real_comm(p, ctx, inputs)
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        seen["dst_ptr"] = hex(cells["dst"].data_ptr()) if "dst" in cells else ""
        return fn

    harness.nccl_impls.comm_alone = comm_alone
    rows = []
    for n, key in enumerate(order):
        name, p = kinds[key]
        if os.environ.get("PR_HOST_EMPTY") == "1" and hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()
        seen.clear()
        row, _ = harness.run_point(p, rank=0, procs=1)
        rows.append({"n": n, "run": name, **{k: row.get(k) for k in ("status", "t_median_us", "t_gemm_us",
                                                                     "t_comm_us", "overlap_efficiency", "error")},
                     **seen, "reserved_mb": torch.cuda.memory_reserved() / 2 ** 20})
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/point_repeat.parquet")
    print(df.drop(columns=["error"]).round(1).to_string(index=False))


if __name__ == "__main__":
    main()
