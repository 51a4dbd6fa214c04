"""Shared set-up of the host-fabric AG+GEMM device scripts: a rank-0 view (W = 8) of one
shape with copy-engine movers and the Hopper builder, its inputs, and the nccl-overlap
baseline on the same inputs (so every function reads the same pinned peer shards)."""
from __future__ import annotations

from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.ops import get_op
from kosmos_bench.point import Point

W = 8


def script_args(default_out: str, default_shapes: str = "8192x57344x8192"):
    """A device script's `OUT_DIR [MxNxK,...]` arguments: (output dir, made; [(M, N, K)];
    cuda:0), after binding this process to the GPU's NUMA node (pinned peer pages)."""
    import os
    import sys

    import torch

    from kosmos_bench.runtime import numa

    out = sys.argv[1] if len(sys.argv) > 1 else default_out
    os.makedirs(out, exist_ok=True)
    spec = sys.argv[2] if len(sys.argv) > 2 else default_shapes
    shapes = [tuple(int(v) for v in s.split("x")) for s in spec.split(",")]
    print(f"numa node {numa.bind_near(0)}", flush=True)
    return out, shapes, torch.device("cuda", 0)


def host_ce_point(M: int, N: int, K: int, dev, with_ref: bool = False):
    """(kosmos Point, RankCtx, inputs) of one host-fabric shape (seed 1 inputs); with_ref: also
    the full A and B (for harness._check)."""
    p = Point(op="ag-gemm", impl="kosmos", M=M, N=N, K=K, world=W, fabric="host", policy="self", seed=0,
              builder="sm90", mover="ce")
    ctx = RankCtx(rank=0, world=W, procs=1, device=dev, fabric="host", backend="gpu")
    inputs, A, B = get_op("ag-gemm").inputs(p, list(range(W)), dev, seed=1)
    return (p, ctx, inputs, A, B) if with_ref else (p, ctx, inputs)


def nccl_overlap_run(p: Point, ctx: RankCtx, inputs, impl: str = "nccl-overlap"):
    """The nccl-overlap (or nccl-seq) baseline's call on the same inputs."""
    po = Point(op="ag-gemm", impl=impl, M=p.M, N=p.N, K=p.K, world=W, fabric="host", seed=0)
    return nccl_impls.NcclBaseline(impl, impl == "nccl-overlap").prepare(po, ctx, inputs).run


def append_rows(out: str, name: str, rows: list[dict]) -> None:
    """Append rows to OUT/name (a Parquet file that fresh-process variants share)."""
    from pathlib import Path

    import pandas as pd

    path = Path(out) / name
    df = pd.DataFrame(rows)
    if path.exists():
        df = pd.concat([pd.read_parquet(path), df], ignore_index=True)
    df.to_parquet(path)
