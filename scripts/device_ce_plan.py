"""Copy-engine mover plan alone (no kernel), host fabric W=8: time the runner's copy-engine plan (kosmos_ce_plan_begin/end): copies
+ flag releases against one cudaMemcpyAsync of the same bytes, and the same copies without
the flag releases. Median of 5 after 2 warm-up, device events.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_ce_plan.py [M N K]
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from kosmos_bench.impls.kosmos import IMPLS
from _host_point import W, host_ce_point  # scripts/: shared host-fabric set-up

DEV = torch.device("cuda", 0)


def timed(fn, reps=5, warm=2):
    ts = []
    for i in range(warm + reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= warm:
            ts.append(a.elapsed_time(b) * 1e3)
    return float(np.median(ts))


def main() -> None:
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (16384, 10240, 8192)
    p, ctx, inputs = host_ce_point(M, N, K, DEV)
    r = IMPLS[0].prepare(p, ctx, inputs)
    host = torch.cat([r._host_A[q] for q in range(1, W)])  # one pinned block, same bytes
    host = host.pin_memory()
    dev = torch.empty_like(host, device=DEV)
    print(f"M={M} N={N} K={K} ce_slices={r.ce.slices}: {len(r.ce_entries)} releases, {r.ce_copies} copies, {host.numel() * 2 / 1e6:.0f} MB")
    print(f"  one memcpy                      {timed(lambda: dev.copy_(host, non_blocking=True)):8.1f} us")
    plan = r.run_ce_plan_alone

    print(f"  plan: copies + flag releases     {timed(plan):8.1f} us")
    m_loc = M // W
    pairs = [(r.ce_work[e.peer * m_loc + e.row0:e.peer * m_loc + e.row0 + e.rows, e.col0:e.col0 + e.cols],
              r._host_A[e.peer][e.row0:e.row0 + e.rows, e.col0:e.col0 + e.cols]) for e in r.ce_entries if e.rows]

    def copies_only():
        for d, s_ in pairs:
            d.copy_(s_, non_blocking=True)

    print(f"  plan copies only, 1 stream       {timed(copies_only):8.1f} us")
    r.close()


if __name__ == "__main__":
    main()
