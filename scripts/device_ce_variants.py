"""Host-fabric AG+GEMM (W=8) copy-engine-mover variants of the kosmos kernel, timed
interleaved in one process on the same pinned pages (one set per shape, shared by every
variant, nccl-overlap and copy-alone), after binding to the GPU's NUMA node.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_ce_variants.py OUT.parquet [reps]

Variants (CE_VARIANTS): "S" = ce_slices S (K-slices of the last remote group; 1 = whole
bands), "SxG" = S slices in each of the last G groups.
Prints one line per shape: GEMM alone, copy alone (one copy per peer), the k8 CE plan alone
(its copies and flag releases, no kernel), then time (us) and overlap efficiency
max(GEMM, copy)/t per variant.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.runtime import numa
from _host_point import host_ce_point, nccl_overlap_run  # scripts/: shared host-fabric set-up

SHAPES = [(8192, 57344, 8192), (16384, 57344, 8192), (8192, 106496, 16384), (16384, 106496, 16384),
          (8192, 10240, 8192), (8192, 18432, 16384)]
SLICES = os.environ.get("CE_VARIANTS", "1,8,8x3").split(",")  # slices[x tail groups]
if os.environ.get("CE_SHAPES"):  # e.g. "16384x106496x16384,8192x57344x8192"
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["CE_SHAPES"].split(",")]


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ce_variants.parquet"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    dev = torch.device("cuda", 0)
    print(f"numa node {numa.bind_near(0)}", flush=True)
    rows = []
    for M, N, K in SHAPES:
        p, ctx, inputs = host_ce_point(M, N, K, dev)
        fns, runners = {}, []
        for v in SLICES:
            s, _, g = v.partition("x")
            os.environ["KOSMOS_CE_TAIL_GROUPS"] = g or "1"
            r = IMPLS[0].prepare(p, ctx, inputs, ce_slices=int(s))
            runners.append(r)
            fns[f"k{v}"] = r.run
        os.environ["KOSMOS_CE_TAIL_GROUPS"] = "1"
        alone = IMPLS[0].prepare(p, ctx, inputs, ce_slices=8)  # never launched: its CE plan alone
        runners.append(alone)
        plan_alone = alone.run_ce_plan_alone

        fns["plan8"] = plan_alone
        fns["nccl-overlap"] = nccl_overlap_run(p, ctx, inputs)
        fns["gemm"] = nccl_impls.gemm_alone(p, ctx, inputs)
        fns["copy"] = nccl_impls.comm_alone(p, ctx, inputs)
        samples = timing.bench(fns, device=dev, warmup=3, reps=reps)
        for r in runners[:-1]:
            r.check()
        med = {k: float(np.median(v)) for k, v in samples.items()}
        floor = max(med["gemm"], med["copy"])
        line = f"{M:6d} {N:6d} {K:6d} gemm {med['gemm']:6.0f} copy {med['copy']:6.0f} plan8 {med['plan8']:6.0f} |"
        for k in [f"k{s}" for s in SLICES] + ["nccl-overlap"]:
            line += f" {k} {med[k]:6.0f} ({floor / med[k]:.3f})"
            rows.append(dict(M=M, N=N, K=K, variant=k, t_median_us=med[k], t_min_us=float(np.min(samples[k])),
                             t_gemm_us=med["gemm"], t_comm_us=med["copy"], t_plan_us=med["plan8"],
                             overlap_efficiency=floor / med[k], reps=reps))
        print(line, flush=True)
        for r in runners:
            r.close()
        del fns, runners, inputs
        torch.cuda.empty_cache()
    pd.DataFrame(rows).to_parquet(out)


if __name__ == "__main__":
    main()
