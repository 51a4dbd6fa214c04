"""Is a kosmos runner's host-fabric call slower for being created later (its copy and flag
streams: torch pool streams on the driver's hardware queues)? Three identical runners A, B,
C (created in that order) and one with its flag releases on the copy stream (I,
KOSMOS_CE_INLINE_RELEASE=1), each timed back to back, in a 2-function loop with copy alone
and in the sweep's loop (call, GEMM alone, copy alone); then all in one interleaved loop.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_runner_order.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from _host_point import host_ce_point, nccl_overlap_run, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("RO_REPS", "10"))


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/runner-order")
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    runners = {k: IMPLS[0].prepare(p, ctx, inputs) for k in ("A", "B", "C")}
    os.environ["KOSMOS_CE_INLINE_RELEASE"] = "1"
    runners["I"] = IMPLS[0].prepare(p, ctx, inputs)
    os.environ.pop("KOSMOS_CE_INLINE_RELEASE")
    gemm, copy = nccl_impls.gemm_alone(p, ctx, inputs), nccl_impls.comm_alone(p, ctx, inputs)
    nccl = nccl_overlap_run(p, ctx, inputs)
    rows = []

    def med(fns: dict, key: str) -> float:
        return float(np.median(timing.bench(fns, device=dev, warmup=3, reps=REPS)[key]))

    mains = {f"kosmos-{k}": r.run for k, r in runners.items()} | {"nccl-overlap": nccl}
    for name, fn in mains.items():
        rows.append({"fn": name, "loop": "b2b", "median_us": med({"x": fn}, "x")})
        rows.append({"fn": name, "loop": "with copy", "median_us": med({"x": fn, "copy": copy}, "x")})
        rows.append({"fn": name, "loop": "sweep (x, gemm, copy)", "median_us": med({"x": fn, "gemm": gemm, "copy": copy}, "x")})
    every = mains | {"gemm": gemm, "copy": copy}
    got = timing.bench(every, device=dev, warmup=3, reps=REPS)
    rows += [{"fn": k, "loop": "all interleaved", "median_us": float(np.median(v))} for k, v in got.items()]
    rows.append({"fn": "copy", "loop": "b2b", "median_us": med({"x": copy}, "x")})
    rows.append({"fn": "gemm", "loop": "b2b", "median_us": med({"x": gemm}, "x")})
    for r in runners.values():
        r.check()
        r.close()
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/runner_order.parquet")
    print(f"\n{M}x{N}x{K}: median us")
    print(df.pivot(index="fn", columns="loop", values="median_us").round(0).to_string())


if __name__ == "__main__":
    main()
