"""What does one more copy cost the copy engine? The fused call's CE plan moves the 7 peers'
shards in 17 copies (demand-order groups cut peers' shards; the last group in 2-D K-slices),
copy alone in 7; scripts/device_copy_contention.py showed a concurrent GEMM does not slow a
plain copy, so the plan's shape is the suspect. Times, back to back (events, median us):

  whole           7 copies, one per peer (copy alone)
  pieces-4        every shard cut into 4 contiguous pieces (28 copies), one stream
  pieces-4-2s     the same, alternating between two streams
  plan-rows       the plan's copies as contiguous whole rows (its last group's K-slices merged)
  plan            the runner's C plan alone (copies, 2-D K-slices, events, fenced flag releases)
  plan-s1         the same with whole bands (ce_slices=1)
  plan-inline     the default plan with its releases on the copy stream (no events)
Each back to back (timing.bench, no L2 flush), in two passes (the second reversed). (torch's .copy_ of a 2-D slice is a
staging kernel, not cudaMemcpy2D: 6x slower, so 2-D copies are timed only inside the C plan.)

    python3 scripts/device_copy_split.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from kosmos_bench.impls.kosmos import KosmosImpl
from _host_point import W, host_ce_point, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("CS_REPS", "20"))


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/copy-split")
    m = M // W
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    k = KosmosImpl().prepare(p, ctx, inputs)  # never launched: its plan alone is timed
    ce = k.ce_entries
    srcs = k._host_A
    dst = torch.empty((M, K), dtype=torch.bfloat16, device=dev)
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    peers = [q for q in range(W) if q != 0]

    def on(stream, fn):
        with torch.cuda.stream(stream):
            fn()

    def whole():
        for q in peers:
            dst[q * m:(q + 1) * m].copy_(srcs[q], non_blocking=True)

    def pieces(P, two):
        def f():
            i = 0
            for q in peers:
                for j in range(P):
                    a, b = j * m // P, (j + 1) * m // P
                    s = s2 if two and i % 2 else s1
                    with torch.cuda.stream(s):
                        dst[q * m + a:q * m + b].copy_(srcs[q][a:b], non_blocking=True)
                    i += 1
        return f

    def plan_rows():  # the plan's copies as contiguous whole rows (its K-slices merged)
        seen = set()
        for e in ce:
            if e.rows and (e.peer, e.row0) not in seen:
                seen.add((e.peer, e.row0))
                dst[e.peer * m + e.row0:e.peer * m + e.row0 + e.rows].copy_(srcs[e.peer][e.row0:e.row0 + e.rows],
                                                                          non_blocking=True)

    spare = {"plan": k}
    spare["plan-s1"] = KosmosImpl().prepare(p, ctx, inputs, ce_slices=1)
    os.environ["KOSMOS_CE_INLINE_RELEASE"] = "1"
    spare["plan-inline"] = KosmosImpl().prepare(p, ctx, inputs)
    del os.environ["KOSMOS_CE_INLINE_RELEASE"]
    cur = torch.cuda.current_stream(dev)

    def joined(fn):
        def f():
            for s in (s1, s2):
                s.wait_stream(cur)
            fn()
            for s in (s1, s2):
                cur.wait_stream(s)
        return f

    fns = {"whole": joined(lambda: on(s1, whole)), "pieces-4": joined(pieces(4, False)),
           "pieces-4-2s": joined(pieces(4, True)), "plan-rows": joined(lambda: on(s1, plan_rows))}
    fns.update({name: r.run_ce_plan_alone for name, r in spare.items()})
    copies = {"whole": 7, "pieces-4": 28, "pieces-4-2s": 28, "plan-rows": len({(e.peer, e.row0) for e in ce if e.rows})}
    copies.update({name: r.ce_copies for name, r in spare.items()})
    rows = []
    for pas, names in enumerate((list(fns), list(fns)[::-1])):  # each back to back, two passes
        for name in names:
            ts = timing.bench({name: fns[name]}, device=dev, warmup=3, reps=REPS, flush_l2=False,
                              min_warmup_s=0.1)[name]
            rows.append({"fn": name, "pass": pas, "median_us": float(np.median(ts)), "min_us": float(np.min(ts)),
                         "copies": copies[name]})
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    base = df[df.fn == "whole"].median_us.mean()
    df["extra_us_per_extra_copy"] = [(t - base) / (c - 7) if c > 7 else None for t, c in zip(df.median_us, df.copies)]
    df.to_parquet(f"{out}/copy_split.parquet")
    print(df.pivot(index="fn", columns="pass", values="median_us").round(0).join(
        df.groupby("fn")[["copies", "extra_us_per_extra_copy"]].mean().round(2)).to_string(), flush=True)
    for r in spare.values():
        r.close()


if __name__ == "__main__":
    main()
