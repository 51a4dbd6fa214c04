"""Does a CUDA graph remove the event hop before a side stream's first copy? (host fabric)
Times 7 host->device copies of one peer shard each (M/8 x K bf16, pinned) from an event on
the main stream to the copies' end, interleaved rep by rep after an L2 flush:
  main        the copies on the main stream itself (copy alone: no hop)
  fork        main -> event -> side stream copies -> main waits (the CE plan's shape: one hop)
  graph       the fork captured in a CUDA graph, replayed on main
  graph-main  the copies captured on one stream in a graph, replayed on main
    python3 scripts/device_graph_hop.py OUT [MxK]
Prints medians; writes OUT/graph_hop.parquet."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing

W, REPS, WARMUP = 8, 40, 5


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/graph-hop"
    M, K = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "8192x8192").split("x"))
    dev = torch.device("cuda")
    m = M // W
    src = [torch.randn(m, K, dtype=torch.bfloat16).pin_memory() for _ in range(W - 1)]
    dst = torch.empty(M, K, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream(dev)

    def copies(s):
        with torch.cuda.stream(s):
            for i, t in enumerate(src):
                dst[(i + 1) * m:(i + 2) * m].copy_(t, non_blocking=True)

    def on_main():
        copies(torch.cuda.current_stream(dev))

    def fork():
        main = torch.cuda.current_stream(dev)
        side.wait_stream(main)
        copies(side)
        main.wait_stream(side)

    cap = torch.cuda.Stream(dev)
    g_fork, g_main = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g_fork, stream=cap):
        fork()
    with torch.cuda.graph(g_main, stream=cap):
        on_main()
    fns = {"main": on_main, "fork": fork, "graph": g_fork.replay, "graph-main": g_main.replay}
    res = timing.bench(fns, device=dev, warmup=WARMUP, reps=REPS)
    rows = [{"M": M, "K": K, "what": k, "t_median_us": float(np.median(v)), "t_min_us": float(v.min())}
            for k, v in res.items()]
    df = pd.DataFrame(rows)
    import os
    os.makedirs(out, exist_ok=True)
    df.to_parquet(f"{out}/graph_hop.parquet")
    base = df.set_index("what")["t_median_us"]["main"]
    for r in rows:
        print(f"{r['what']:<11} {r['t_median_us']:8.1f} us (min {r['t_min_us']:8.1f})  vs main {r['t_median_us'] - base:+6.1f}")


if __name__ == "__main__":
    main()
