"""SM clock and power while each of GEMM alone, the kosmos kernel (host fabric, CE movers) and
nccl-overlap runs back to back for a while (nvidia-smi sampled every 20 ms): is the fused
kernel's tile rate below cuBLAS's because of the schedule or because of the power limit?

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_clock_probe.py [M N K] [seconds]
"""
from __future__ import annotations

import datetime
import subprocess
import sys
import time

import numpy as np
import torch

from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from _host_point import host_ce_point, nccl_overlap_run  # scripts/: shared host-fabric set-up



def main() -> None:
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (8192, 106496, 16384)
    secs = float(sys.argv[4]) if len(sys.argv) >= 5 else 1.5
    dev = torch.device("cuda", 0)
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    fns = {"gemm": nccl_impls.gemm_alone(p, ctx, inputs), "kosmos": IMPLS[0].prepare(p, ctx, inputs).run,
           "nccl-overlap": nccl_overlap_run(p, ctx, inputs),
           "copy": nccl_impls.comm_alone(p, ctx, inputs)}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)
    phases = []
    for name, f in list(fns.items()) * 2:
        time.sleep(0.3)  # idle between phases
        t0, n = time.time(), 0
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        while time.time() - t0 < secs:
            f()
            n += 1
            if n % 4 == 0:
                torch.cuda.synchronize()
        b.record()
        torch.cuda.synchronize()
        phases.append((name, t0 + 0.2, time.time(), a.elapsed_time(b) * 1e3 / n))
    time.sleep(0.1)
    smi.terminate()
    out = smi.communicate()[0].strip().splitlines()
    rows = []
    for line in out:  # "2026/12/03 01:20:00.123, 1980, 650.12"
        parts = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    vals = np.array([r[1:] for r in rows]).reshape(-1, 2)
    ts = np.array([r[0] for r in rows])
    print(f"M={M} N={N} K={K}: {len(vals)} samples")
    for name, t0, t1, us in phases:
        sel = vals[(ts >= t0) & (ts <= t1)]
        if len(sel):
            print(f"  {name:13s} {us:8.1f} us/call   SM clock median {np.median(sel[:, 0]):6.0f} MHz "
                  f"(min {sel[:, 0].min():.0f})   power median {np.median(sel[:, 1]):5.0f} W")


if __name__ == "__main__":
    main()
