"""What slows the copy engine when a GEMM runs beside it? In the fused call the PCIe copy of
the peers' shards runs ~3.7% slower than alone, beside nccl-overlap's cuBLAS chunks ~1.6-2%
(results/issue4-h200-20261203/, t4). This times copy alone (the 7 peers' shards, host ->
device, on a stream of its own) while a partner workload runs on another stream:

  none | cublas (torch.matmul) | sm90 (our builder, 128x256 tiles, 1-CTA) | sm90-cluster (2-CTA
  clusters, B multicast: half the L2->SM bytes of B) | sm90-74 (74 CTAs: the fused kernel's
  ~56% builder duty) | alu (SMs busy, no memory traffic: power only) | hbm (elementwise over
  1 GB: HBM bandwidth) | l2 (elementwise over 16 MB: L2 bandwidth, no HBM)

Each partner is queued long enough to cover the copy; the copy starts once the partner has.
Prints copy us (median) per partner, the partner's own time alone, and the SM clock.

    python3 scripts/device_copy_contention.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch
import triton
import triton.language as tl

from kosmos_bench.harness import _gpu_uuid
from kosmos_bench.kernels import sm90_gemm
from kosmos_bench.runtime import nvml
from _host_point import W, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("CC_REPS", "10"))


@triton.jit
def _alu_burn(x_ptr, iters, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(iters):
        x = x * 1.0000001 + 0.0000001
    tl.store(x_ptr + offs, x)


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/copy-contention")
    m, n_loc = M // W, N // W
    srcs = [torch.randn(m, K).to(torch.bfloat16).pin_memory() for _ in range(1, W)]
    dst = torch.empty((M, K), dtype=torch.bfloat16, device=dev)
    A = torch.randn(M, K, device=dev).to(torch.bfloat16)
    B = torch.randn(K, n_loc, device=dev).to(torch.bfloat16)
    C = torch.empty(M, n_loc, device=dev, dtype=torch.bfloat16)
    big = torch.empty(1 << 29, device=dev, dtype=torch.bfloat16)  # 1 GB
    big2 = torch.empty_like(big)
    small = torch.randn(1 << 23, device=dev).to(torch.bfloat16)  # 16 MB: stays in L2
    small2 = torch.empty_like(small)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    burn = torch.randn(sms * 4 * 1024, device=dev)
    copy_s, part_s = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    def copies():
        for q in range(1, W):
            dst[q * m:(q + 1) * m].copy_(srcs[q - 1], non_blocking=True)

    one = {
        "none": None,
        "cublas": lambda: torch.matmul(A, B, out=C),
        "sm90": lambda: sm90_gemm.gemm(A, B, out=C),
        "sm90-cluster": lambda: sm90_gemm.gemm(A, B, out=C, variant=3),
        "sm90-74": lambda: sm90_gemm.gemm(A, B, out=C, max_ctas=74),
        "alu": lambda: _alu_burn[(sms * 4,)](burn, 20000, BLOCK=1024),
        "hbm": lambda: torch.add(big, 1.0, out=big2),
        "l2": lambda: torch.add(small, 1.0, out=small2),
    }

    def time_alone(fn, reps=5):
        with torch.cuda.stream(part_s):
            for _ in range(2):
                fn()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ts = []
            for _ in range(reps):
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e3)
        return float(np.median(ts))

    copy_alone = None  # the "none" row; partners are queued for 1.5x its time
    rows = []
    sampler = nvml.ClockSampler(_gpu_uuid(dev))
    with sampler:
        for name, fn in one.items():  # "none" first: copy_alone
            alone = time_alone(fn) if fn is not None else None
            calls = 0 if fn is None else max(1, int(np.ceil(1.5 * copy_alone / alone)))
            ts, mhz = [], []
            for rep in range(REPS + 2):
                torch.cuda.synchronize()
                started = torch.cuda.Event()
                c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(part_s):
                    if fn is not None:
                        fn()
                    started.record()
                    for _ in range(calls - 1):
                        fn()
                copy_s.wait_event(started)
                with torch.cuda.stream(copy_s):
                    c0.record()
                    copies()
                    c1.record()
                torch.cuda.synchronize()
                if rep >= 2:
                    ts.append(c0.elapsed_time(c1) * 1e3)
                    v = sampler.read()
                    if v is not None:
                        mhz.append(v)
            med = float(np.median(ts))
            if fn is None:
                copy_alone = med
            rows.append({"partner": name, "copy_us": med, "copy_min_us": float(np.min(ts)),
                         "slowdown": med / copy_alone - 1.0, "partner_alone_us": alone, "partner_calls": calls,
                         "mhz_after": float(np.median(mhz)) if mhz else None})
            print(f"{name:13s} copy {med:7.0f} us (min {np.min(ts):6.0f})  {100 * (med / copy_alone - 1):+5.1f}%  "
                  f"partner alone {alone or 0:7.1f} us x{calls}  MHz {rows[-1]['mhz_after']}", flush=True)
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/copy_contention.parquet")


if __name__ == "__main__":
    main()
