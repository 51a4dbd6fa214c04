"""Is the copy engine the PCIe link's limit? Host -> device bytes per second of the copy
engine alone (the 7 peers' pinned shards of one host-fabric shape, one copy per peer), of SM
loads alone (a Triton kernel on G CTAs pulling another pinned host buffer through its mapped
address, 16-byte loads), and of both started together on two streams. If both together move
more bytes per second than the engine alone, a fused call whose movers are the engine *and* a
few SM pullers could beat "copy alone"; if not, the engine is at the link's limit.

    python3 scripts/device_pcie_aggregate.py OUT_DIR [MxNxK] [G,G,...]
Prints one line per configuration (GB/s = 1e9 bytes/s); writes OUT_DIR/pcie_aggregate.parquet.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import torch
import triton
import triton.language as tl

from _host_point import W, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("PA_REPS", "10"))


@triton.jit
def _pull(src, dst, n, BLOCK: tl.constexpr):
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m, cache_modifier=".cg"), mask=m)


class Mapped:
    """A pinned host tensor passed to Triton by its address (UVA: the host pointer of a
    cudaHostAlloc'd block is its device address)."""

    def __init__(self, t: torch.Tensor):
        self.t, self.dtype = t, t.dtype

    def data_ptr(self) -> int:
        return self.t.data_ptr()


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/pcie-aggregate")
    grids = [int(g) for g in (sys.argv[3] if len(sys.argv) > 3 else "4,8,16,32,66,132").split(",")]
    m = M // W
    srcs = [torch.randn(m, K).to(torch.bfloat16).pin_memory() for _ in range(1, W)]
    dst = torch.empty((M, K), dtype=torch.bfloat16, device=dev)
    ce_bytes = sum(s.numel() * 2 for s in srcs)
    sm_src = torch.randint(0, 1 << 30, (ce_bytes // 4,), dtype=torch.int32).pin_memory()
    sm_dst = torch.empty(sm_src.numel(), dtype=torch.int32, device=dev)
    sm_bytes = sm_src.numel() * 4
    cs, ss = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    main = torch.cuda.current_stream(dev)

    def ce(stream):
        with torch.cuda.stream(stream):
            for q, s in enumerate(srcs, start=1):
                dst[q * m:(q + 1) * m].copy_(s, non_blocking=True)

    def sm(stream, g):
        with torch.cuda.stream(stream):
            _pull[(g,)](Mapped(sm_src), sm_dst, sm_src.numel(), BLOCK=4096, num_warps=4)

    sm(ss, 8)  # compile; check the bytes
    torch.cuda.synchronize(dev)
    assert torch.equal(sm_dst.cpu(), sm_src), "SM pull read wrong bytes"

    def timed(ce_on: bool, g: int) -> tuple[float, float]:
        """(us until the engine's last byte, us until the SM pull's), median over REPS."""
        t_ce, t_sm = [], []
        for _ in range(2 + REPS):
            t0 = torch.cuda.Event(enable_timing=True)
            e_ce, e_sm = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record(main)
            for s in (cs, ss):
                s.wait_event(t0)
            if ce_on:
                ce(cs)
                e_ce.record(cs)
            if g:
                sm(ss, g)
                e_sm.record(ss)
            torch.cuda.synchronize(dev)
            t_ce.append(t0.elapsed_time(e_ce) * 1e3 if ce_on else np.nan)
            t_sm.append(t0.elapsed_time(e_sm) * 1e3 if g else np.nan)
        return float(np.median(t_ce[2:])), float(np.median(t_sm[2:]))

    rows = []
    for rnd in range(2):
        c, _ = timed(True, 0)
        rows.append(dict(round=rnd, grid=0, mode="ce", t_ce_us=c, t_sm_us=np.nan, gbps=ce_bytes / c / 1e3))
        for g in grids:
            _, s = timed(False, g)
            rows.append(dict(round=rnd, grid=g, mode="sm", t_ce_us=np.nan, t_sm_us=s, gbps=sm_bytes / s / 1e3))
            c, s = timed(True, g)
            rows.append(dict(round=rnd, grid=g, mode="both", t_ce_us=c, t_sm_us=s,
                             gbps=(ce_bytes + sm_bytes) / max(c, s) / 1e3))
    df = pd.DataFrame(rows)
    df["ce_mb"], df["sm_mb"], df["shape"] = ce_bytes / 2**20, sm_bytes / 2**20, f"{M}x{N}x{K}"
    df.to_parquet(os.path.join(out, "pcie_aggregate.parquet"))
    for r in rows:
        print(f"r{r['round']} {r['mode']:>4} G={r['grid']:<3} ce {r['t_ce_us']:7.0f} us  sm {r['t_sm_us']:7.0f} us  "
              f"{r['gbps']:5.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
