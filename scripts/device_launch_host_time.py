"""Host time of one kosmos call (host fabric, CE movers): how long the CPU spends in run()
(CE plan head + cooperative launch with its 32 KB of parameters + the rest of the plan),
which the copy engine must not wait for. Median of 20 calls, device synchronised between.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_launch_host_time.py [M N K]
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

from kosmos_bench.impls.kosmos import IMPLS
from _host_point import host_ce_point  # scripts/: shared host-fabric set-up



def main() -> None:
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (8192, 57344, 8192)
    dev = torch.device("cuda", 0)
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    r = IMPLS[0].prepare(p, ctx, inputs)
    spent: dict[str, list[float]] = {}

    class Timed:  # times the C entry points run() calls, delegating everything else
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            fn = getattr(self._lib, name)
            if not name.startswith(("kosmos_ce_plan_begin", "kosmos_ce_plan_end", "kosmos_sm90_ag_launch",
                                    "kosmos_launch")):
                return fn

            def call(*a):
                t = time.perf_counter()
                rc = fn(*a)
                spent.setdefault(name, []).append((time.perf_counter() - t) * 1e6)
                return rc
            return call

    r.lib, r.sm90 = Timed(r.lib), Timed(r.sm90) if r.sm90 is not None else None
    ts = []
    for i in range(25):
        torch.cuda.synchronize()
        t = time.perf_counter()
        r.run()
        ts.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    r.check()
    print(f"  run()        host {np.median(ts[5:]):7.1f} us (median of 20)")
    for name, v in spent.items():
        print(f"  {name:28s} host {np.median(v[5:]):7.1f} us")
    print(f"M={M} N={N} K={K}: {r.ce_copies} copies, head {r.ce_head} of {len(r.ce_entries)} entries")


if __name__ == "__main__":
    main()
