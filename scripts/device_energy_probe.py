"""Energy per call at the power limit: is the fused kernel's tile rate on 405b FC1 below
cuBLAS's because our builder tiles cost more energy (then the lever is less L2->SM traffic,
e.g. TMA multicast in 2-CTA clusters, as cuBLAS's kernel may use), or because of the fusion?

Each function runs back to back for SECS seconds (twice, phase order rotated), NVML's total
energy counter read around each phase; prints us/call, J/call, mean W and the median SM
clock, and the names of the GPU kernels cuBLAS runs for the GEMM alone (torch.profiler).

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_energy_probe.py OUT [MxNxK,...] [SECS]
    (N is the whole layer's N: rank 0's GEMM is M x N/8 x K, as in the host sweep)

ENERGY_FNS=kosmos,cublas limits the functions (also: both = cuBLAS and the copy issued together
with no dependency, the harness's t_concurrent_us; overlap / seq = the nccl-overlap / nccl-seq
baselines); B2B_TAG names the variant (kosmos knobs come from
the environment), so `B2B_SCRIPT=device_energy_probe.py B2B_VARIANTS="g3: g6:KOSMOS_BAND_GROUP=6"
bash scripts/device_b2b_variants.sh` compares variants in fresh processes; rows are appended to
OUT/energy.parquet.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time

import pandas as pd
import torch

from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.kernels import sm90_gemm
from kosmos_bench.runtime.nvml import ClockSampler, _lib
from _host_point import W, append_rows, host_ce_point, nccl_overlap_run, script_args


class Energy:
    """NVML total energy (mJ since driver load) of GPU 0."""

    def __init__(self):
        self.nv = _lib()
        self.h = ctypes.c_void_p()
        if self.nv is None or self.nv.nvmlInit_v2() != 0 or self.nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)):
            raise SystemExit("energy probe: NVML unavailable")

    def mj(self) -> int:
        v = ctypes.c_ulonglong()
        if self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(v)) != 0:
            raise SystemExit("energy probe: nvmlDeviceGetTotalEnergyConsumption failed")
        return int(v.value)


def kernel_names(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and "Memcpy" not in e.name and "Memset" not in e.name})


def phase(fn, secs: float, energy: Energy, sampler: ClockSampler) -> dict:
    time.sleep(0.3)  # idle between phases: each starts from the same rested state
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0, t0, n = energy.mj(), time.perf_counter(), 0
    a.record()
    while time.perf_counter() - t0 < secs:
        fn()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    b.record()
    torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), energy.mj()
    clk = [v for t, v in sampler.samples if t0 + 0.2 <= t <= t1]
    us = a.elapsed_time(b) * 1e3 / n
    return {"calls": n, "us": us, "J_per_call": (e1 - e0) / 1e3 / n, "W": (e1 - e0) / 1e3 / (t1 - t0),
            "MHz": float(pd.Series(clk).median()) if clk else None}


def main() -> None:
    out, shapes, dev = script_args("/tmp/energy", "8192x106496x16384,8192x57344x8192")
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
    energy = Energy()
    rows = []
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    for M, N, K in shapes:
        p, ctx, inputs = host_ce_point(M, N, K, dev)
        cublas = nccl_impls.gemm_alone(p, ctx, inputs)
        A = torch.randn((M, K), device=dev).to(torch.bfloat16)
        B = inputs.B[0].contiguous()
        C = torch.empty((M, B.shape[1]), dtype=torch.bfloat16, device=dev)
        C2 = torch.full_like(C, float("nan"))
        ref = torch.matmul(A, B)
        sm90_gemm.gemm(A, B, out=C)
        sm90_gemm.gemm(A, B, out=C2, variant=3)
        torch.cuda.synchronize()
        err = (C.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
        print(f"sm90 vs cuBLAS max err {err:.2e} (of max |C|), 2-CTA clusters bitwise = 1-CTA: "
              f"{torch.equal(C.view(torch.int16), C2.view(torch.int16))}", flush=True)
        want = os.environ.get("ENERGY_FNS", "cublas,sm90,sm90x2,kosmos,copy").split(",")
        make = {"cublas": lambda: cublas, "sm90": lambda: lambda: sm90_gemm.gemm(A, B, out=C),
                "sm90x2": lambda: lambda: sm90_gemm.gemm(A, B, out=C2, variant=3),
                "kosmos": lambda: IMPLS[0].prepare(p, ctx, inputs).run,
                "copy": lambda: nccl_impls.comm_alone(p, ctx, inputs),
                "both": lambda: nccl_impls.concurrent_alone(cublas, nccl_impls.comm_alone(p, ctx, inputs), dev),
                "overlap": lambda: nccl_overlap_run(p, ctx, inputs),
                "seq": lambda: nccl_overlap_run(p, ctx, inputs, impl="nccl-seq")}
        unknown = set(want) - set(make)
        if unknown:
            raise SystemExit(f"ENERGY_FNS: unknown {sorted(unknown)}; expected some of {list(make)}")
        fns = {name: make[name]() for name in want}
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        print(f"{M}x{N}x{K} (rank GEMM {M}x{N // W}x{K}): cuBLAS kernels {kernel_names(cublas)}", flush=True)
        names = list(fns)
        with ClockSampler(uuid, 0.005) as sampler:
            for rep in range(2):
                order = names[rep:] + names[:rep] if rep % 2 == 0 else list(reversed(names))
                for name in order:
                    r = phase(fns[name], secs, energy, sampler)
                    r.update(tag=os.environ.get("B2B_TAG", "default"), shape=f"{M}x{N}x{K}", fn=name, rep=rep)
                    rows.append(r)
                    print(f"  {name:8s} rep {rep}: {r['us']:8.1f} us/call  {r['J_per_call']:6.3f} J/call  "
                          f"{r['W']:5.0f} W  {r['MHz'] or 0:5.0f} MHz", flush=True)
        del fns
        torch.cuda.empty_cache()
    append_rows(out, "energy.parquet", rows)
    df = pd.DataFrame(rows)
    print(df.groupby(["tag", "shape", "fn"])[["us", "J_per_call", "W", "MHz"]].median().round(3).to_string())


if __name__ == "__main__":
    main()
