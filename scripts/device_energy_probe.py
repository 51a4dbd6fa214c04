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
baselines; sm90g<N> = our standalone GEMM in N-band raster groups (sm90: 8); world1 = the fused
kernel at world 1 on the rank GEMM (no deps, no peers); landed = the fused kernel alone, its data and flags landed once before (no copies:
the kernel as a plain GEMM with this shape's schedule); serial = the runner's copy plan, then
the kernel, one after the other on the main stream); B2B_TAG names the variant (kosmos knobs come from
the environment), so `B2B_SCRIPT=device_energy_probe.py B2B_VARIANTS="g3: g6:KOSMOS_BAND_GROUP=6"
bash scripts/device_b2b_variants.sh` compares variants in fresh processes; rows are appended to
OUT/energy.parquet.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
import time

import pandas as pd
import torch

from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.kernels import sm90_gemm
from kosmos_bench.runtime.nvml import ClockSampler, _lib, reasons_per_window
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


def landed_kernel(p, ctx, inputs, serial: bool):
    """The fused kernel with its data landed: `serial` runs the copy plan alone before each
    kernel (stream order); else the plan ran once with an epoch far ahead, so every band flag
    is ready for the calls that follow and each call is the kernel alone. Checked bitwise
    against the runner's own fused call (the runner is the probe's own: its flags end ahead)."""
    r = IMPLS[0].prepare(p, ctx, inputs)
    r.run()
    r.check()
    want = r.outputs[0].clone()
    plan = r.ce_plan
    if not serial:
        r.run_ce_plan_alone(epoch=r.calls + 1_000_000)

    def call():
        if serial:
            r.ce_plan = plan
            r.run_ce_plan_alone(epoch=r.calls + 1)
        r.ce_plan = None
        try:
            r.run()
        finally:
            r.ce_plan = plan

    call.runner = r
    r.outputs[0].fill_(float("nan"))
    call()
    r.check()
    same = torch.equal(r.outputs[0].view(torch.int16), want.view(torch.int16))
    print(f"{'serial' if serial else 'landed'}: bitwise = fused call: {same}", flush=True)
    if not same:
        raise SystemExit("energy probe: the landed kernel's output differs from the fused call's")
    return call


def tile_stats(df: pd.DataFrame) -> dict:
    """A traced call's BUILD records per WG: median tile time, median gap between a WG's
    consecutive tiles, mean idle before a WG's first / after its last tile, span (us)."""
    b = df[df.role == "BUILD"].sort_values(["wg", "t0_ns"])
    g = b.groupby("wg")
    gap = (b.t0_ns - g.t1_ns.shift()).dropna()
    span = b.t1_ns.max() - b.t0_ns.min()
    return {"tiles": len(b), "tile_us": (b.t1_ns - b.t0_ns).median() / 1e3, "gap_us": gap.median() / 1e3,
            "gap_sum_us": gap.sum() / 1e3 / g.ngroups, "head_us": (g.t0_ns.min() - b.t0_ns.min()).mean() / 1e3,
            "tail_us": (b.t1_ns.max() - g.t1_ns.max()).mean() / 1e3, "span_us": span / 1e3}


def world1_runner(M: int, n_loc: int, K: int, dev):
    """The KOSMOS kernel on the rank GEMM with world 1 (op gemm: no communication)."""
    from kosmos_bench.ops import get_op
    from kosmos_bench.point import Point
    from kosmos_bench.impls.base import RankCtx

    p = Point(op="gemm", impl="kosmos", M=M, N=n_loc, K=K, world=1, fabric="local", seed=0, builder="sm90")
    ctx = RankCtx(rank=0, world=1, procs=1, device=dev, fabric="local", backend="gpu")
    inputs, _, _ = get_op("gemm").inputs(p, [0], dev, seed=1)
    return IMPLS[0].prepare(p, ctx, inputs)


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
    why = reasons_per_window(sampler.reasons, {"p": [(t0 + 0.2, t1)]})["p"]  # what held the clock
    return {"calls": n, "us": us, "J_per_call": (e1 - e0) / 1e3 / n, "W": (e1 - e0) / 1e3 / (t1 - t0),
            "MHz": float(pd.Series(clk).median()) if clk else None, "clock_limit": why}


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
                "landed": lambda: landed_kernel(p, ctx, inputs, serial=False),
                "world1": lambda: world1_runner(M, N // W, K, dev).run,
                "serial": lambda: landed_kernel(p, ctx, inputs, serial=True),
                "overlap": lambda: nccl_overlap_run(p, ctx, inputs),
                "seq": lambda: nccl_overlap_run(p, ctx, inputs, impl="nccl-seq")}
        for name in want:  # sm90g<N>: our standalone GEMM with a raster of N-band groups (default 8)
            if re.fullmatch(r"sm90g\d+", name):
                make[name] = lambda g=int(name[5:]): lambda: sm90_gemm.gemm(A, B, out=C, group_m=g)
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
                          f"{r['W']:5.0f} W  {r['MHz'] or 0:5.0f} MHz  {r['clock_limit']}", flush=True)
        if os.environ.get("ENERGY_TRACE") == "1":  # one traced call each: where the landed kernel's time goes
            traced = {name: f.runner for name, f in fns.items() if hasattr(f, "runner")}
            traced["world1"] = world1_runner(M, N // W, K, dev)
            for name, r in traced.items():
                plan, r.ce_plan = getattr(r, "ce_plan", None), None
                try:
                    for rep in range(2):
                        st = tile_stats(r.run_traced())
                        rows.append({"tag": os.environ.get("B2B_TAG", "default"), "shape": f"{M}x{N}x{K}",
                                     "fn": f"trace:{name}", "rep": rep, **st})
                        print(f"  trace {name:7s}: " + "  ".join(f"{k} {v:.1f}" for k, v in st.items()), flush=True)
                finally:
                    r.ce_plan = plan
        del fns
        torch.cuda.empty_cache()
    append_rows(out, "energy.parquet", rows)
    df = pd.DataFrame(rows)
    df = df[~df.fn.str.startswith("trace:")]
    g = df.groupby(["tag", "shape", "fn"])
    print(g[["us", "J_per_call", "W", "MHz"]].median().round(3).join(g["clock_limit"].agg(lambda v: "/".join(map(str, v))))
          .to_string())


if __name__ == "__main__":
    main()
