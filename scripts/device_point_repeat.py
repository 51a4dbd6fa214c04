"""Is the sweep's slow copy alone in kosmos FC1 points (run25/run26: 2261 vs 2138-2145 us in
the baselines' points of the same shape) a property of the kosmos point or of the process's
history? One process runs harness.run_point for one shape as the sweep does, in the order
kosmos, nccl-overlap, kosmos, kosmos without trace, nccl-overlap, and prints each row's times.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_point_repeat.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import pandas as pd

from kosmos_bench import harness
from kosmos_bench.point import Point
from _host_point import W, script_args  # scripts/: shared host-fabric set-up


def main() -> None:
    out, ((M, N, K), *_), _ = script_args("/tmp/point-repeat")
    kw = dict(op="ag-gemm", M=M, N=N, K=K, world=W, fabric="host", backend="gpu", warmup=2, reps=10, seed=0)
    kos = Point(impl="kosmos", policy="self", queue_order="demand", local_first=True, builder="sm90", mover="ce",
                trace=True, **kw)
    ovl = Point(impl="nccl-overlap", trace=True, **kw)
    rows = []
    for name, p in (("kosmos", kos), ("nccl-overlap", ovl), ("kosmos again", kos), ("kosmos untraced",
                    kos.replace(trace=False)), ("nccl-overlap again", ovl)):
        row, _ = harness.run_point(p, rank=0, procs=1)
        rows.append({"run": name, **{k: row.get(k) for k in ("status", "t_median_us", "t_gemm_us", "t_comm_us",
                                                               "overlap_efficiency", "error")}})
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/point_repeat.parquet")
    print(df.drop(columns=["error"]).round(1).to_string(index=False))


if __name__ == "__main__":
    main()
