"""Measure this GPU and write a simulator profile (`kosmos-bench calibrate`).

What is measured (all with CUDA events, after warm-up, medians of several repetitions):

* GEMM rate: ``torch.matmul`` (cuBLAS) in bf16 / fp16 / fp32 on a few large shapes ->
  ``gemm_tflops[dtype]`` (median over shapes); the per-SM tile time follows from it.
* Copy engine over PCIe: pinned host <-> device copies of 256 MiB -> ``copy_engine_GBps``
  {h2d, d2h} and the host link's ``h2d_GBps`` / ``d2h_GBps``; a 4 KiB copy gives the link
  latency. Both directions at once are measured too (``duplex_GBps``, informational).
* Kernel launch overhead: a tiny kernel timed back to back.
* HBM: a large device-to-device copy -> ``hbm_GBps``.
* Optional, when the `kosmos` implementation is available on this machine: its builder's
  per-SM tile rate (a world=1 point: pure GEMM) -> ``builder_efficiency``; what one mover
  WG drives over the host link (``fixed:1`` on communication-bound host points) ->
  ``link.wg_GBps`` (ag-gemm bands) and ``link.wg_tile_GBps`` (gemm-rs tiles); what 16
  movers reach together -> ``link.h2d_GBps`` when they saturate it. Without the kernel these
  keep the base profile's values (and the notes say so).

Everything not measured is copied from the base profile (default ``h200-host-pcie``); the
raw measurements are stored under ``calibration``.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import math
from pathlib import Path

import numpy as np

from . import harness
from .impls import IMPLS
from .point import Point
from .sim import profiles

GEMM_SHAPES = ((8192, 8192, 8192), (16384, 8192, 8192), (8192, 28672, 8192), (16384, 16384, 16384))


def _time_us(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median time of fn() in microseconds (CUDA events on the current stream)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return float(np.median(out))


def measure_gemm(device, dtypes=("bf16", "fp16", "fp32"), shapes=GEMM_SHAPES) -> dict:
    import torch

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    res = {}
    for name in dtypes:
        rates = []
        for (m, n, k) in shapes if name != "fp32" else shapes[:2]:
            a = torch.randn(m, k, device=device).to(tdt[name])
            b = torch.randn(k, n, device=device).to(tdt[name])
            c = torch.empty(m, n, device=device, dtype=tdt[name])
            t = _time_us(lambda: torch.matmul(a, b, out=c), reps=5 if name == "fp32" else 10)
            rates.append({"M": m, "N": n, "K": k, "us": t, "tflops": 2.0 * m * n * k / (t * 1e-6) / 1e12})
            del a, b, c
        res[name] = {"shapes": rates, "tflops": float(np.median([r["tflops"] for r in rates]))}
    torch.cuda.empty_cache()
    return res


def measure_copies(device, nbytes: int = 256 << 20) -> dict:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host2 = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = _time_us(lambda: dev.copy_(host, non_blocking=True))
    d2h = _time_us(lambda: host.copy_(dev, non_blocking=True))
    side = torch.cuda.Stream(device)

    def duplex():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host2.copy_(dev2, non_blocking=True)
        dev.copy_(host, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    both = _time_us(duplex)
    small_h, small_d = host[:4096], dev[:4096]
    lat = _time_us(lambda: small_d.copy_(small_h, non_blocking=True), reps=50)
    d2d = _time_us(lambda: dev2.copy_(dev))
    out = {"bytes": nbytes, "h2d_GBps": nbytes / h2d / 1e3, "d2h_GBps": nbytes / d2h / 1e3,
           "duplex_GBps": 2 * nbytes / both / 1e3, "small_copy_us": lat, "hbm_GBps": 2 * nbytes / d2d / 1e3}
    del host, host2, dev, dev2
    torch.cuda.empty_cache()
    return out


def measure_launch(device) -> float:
    import torch

    x = torch.zeros(1, device=device)
    n = 200

    def many():
        for _ in range(n):
            x.add_(1)

    return _time_us(many, reps=5) / n


def _kosmos_point(**kw):
    base = dict(op="ag-gemm", impl="kosmos", dtype="bf16", fabric="host", backend="gpu", policy="self",
                queue_order="demand", local_first=True, chunk=1, warmup=3, reps=10)
    base.update(kw)
    return Point(**base)


def measure_kosmos(prof: dict) -> dict:
    """Builder tile rate and one mover WG's link rate from the kosmos kernel (if present)."""
    if "kosmos" not in IMPLS:
        return {"skipped": "the kosmos implementation is not registered"}
    ok, why = IMPLS["kosmos"].available("gpu")
    if not ok:
        return {"skipped": f"kosmos unavailable: {why}"}
    out = {}
    G, BM, BN = prof["num_sms"], prof["tile_m"], prof["tile_n"]
    # builder: world 1, a pure GEMM with whole waves
    M, N, K = 8192, 8192, 8192
    row, _ = harness.run_point(_kosmos_point(M=M, N=N, K=K, world=1), rank=0, procs=1)
    if row.get("status") == "ok":
        tiles = -(-M // BM) * -(-N // BN)
        waves = -(-tiles // G)
        t_tile_us = (row["t_median_us"] - prof["launch_overhead_us"]) / waves
        per_sm = 2.0 * BM * BN * K / (t_tile_us * 1e-6)
        out["builder"] = {"M": M, "N": N, "K": K, "us": row["t_median_us"], "tile_us": t_tile_us,
                          "per_sm_tflops": per_sm / 1e12}
    else:
        out["builder"] = {"error": row.get("error")}
    # movers: communication-bound host AG (N tiny), fixed:k for a few k
    W, M, N, K = 8, 32768, 1024, 4096
    movers = []
    for k in (1, 2, 4, 8, 16, 32, 64):
        row, _ = harness.run_point(_kosmos_point(M=M, N=N, K=K, world=W, policy=f"fixed:{k}"), rank=0, procs=1)
        if row.get("status") != "ok":
            movers.append({"k": k, "error": row.get("error")})
            continue
        nbytes = (W - 1) * (M // W) * K * 2
        movers.append({"k": k, "us": row["t_median_us"], "GBps": nbytes / row["t_median_us"] / 1e3})
    out["movers"] = movers
    # gemm-rs tile movers: one WG pushes (D2H) and proxies (H2D) 128-col partial tiles
    M, N, K = 16384, 8192, 1024
    row, _ = harness.run_point(_kosmos_point(op="gemm-rs", M=M, N=N, K=K, world=W, policy="fixed:1", local_first=None),
                       rank=0, procs=1)
    nbytes = 2 * (W - 1) * (M // W) * N * 2  # pushes (D2H) + proxies (H2D)
    if row.get("status") == "ok":
        out["tile_mover"] = {"k": 1, "us": row["t_median_us"], "GBps": nbytes / row["t_median_us"] / 1e3}
    else:
        out["tile_mover"] = {"error": row.get("error")}
    # both directions at once: many tile movers, communication-bound
    row, _ = harness.run_point(_kosmos_point(op="gemm-rs", M=M, N=N, K=K, world=W, policy="fixed:48", local_first=None),
                       rank=0, procs=1)
    if row.get("status") == "ok":
        out["duplex"] = {"k": 48, "us": row["t_median_us"], "GBps": nbytes / row["t_median_us"] / 1e3}
    else:
        out["duplex"] = {"error": row.get("error")}
    return out


def measure(device: str = "cuda", base: str = "h200-host-pcie", kosmos: bool = True) -> dict:
    """All raw measurements of this GPU (see the module docstring)."""
    import torch

    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    raw: dict = {"device": torch.cuda.get_device_name(dev), "num_sms": int(props.multi_processor_count),
                 "time": _dt.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
                 "cuda": torch.version.cuda}
    raw["gemm"] = measure_gemm(dev)
    raw["copies"] = measure_copies(dev)
    raw["launch_us"] = measure_launch(dev)
    if kosmos:
        prof = build_profile(raw, base, name="probe")
        try:
            raw["kosmos"] = measure_kosmos(prof)
        except Exception as e:  # noqa: BLE001 - calibration of the rest still stands
            raw["kosmos"] = {"skipped": f"{type(e).__name__}: {e}"}
    return raw


def build_profile(raw: dict, base: str = "h200-host-pcie", name: str = "calibrated") -> dict:
    """A profile from raw measurements (pure: testable without a GPU); unmeasured fields
    come from the base profile."""
    prof = copy.deepcopy(profiles.load(base))
    c = raw["copies"]
    launch = round(max(float(raw["launch_us"]), 1.0), 2)
    prof.update(
        name=name, device=raw["device"], num_sms=int(raw["num_sms"]),
        gemm_tflops={k: round(v["tflops"], 1) for k, v in raw["gemm"].items()},
        hbm_GBps=round(c["hbm_GBps"], 1), launch_overhead_us=launch, measured=True,
        copy_engine_GBps={"h2d": round(c["h2d_GBps"], 2), "d2h": round(c["d2h_GBps"], 2)},
    )
    # The movers' (SM-driven) link rates: the base profile's, scaled by how this machine's
    # copy engine compares with the base's; the kosmos probes below replace them when run.
    base_ce = profiles.load(base).get("copy_engine_GBps") or {}
    link = dict(prof["link"])
    scale = {d: c[f"{d}_GBps"] / base_ce[d] if base_ce.get(d) else None for d in ("h2d", "d2h")}
    for d in ("h2d", "d2h"):
        if link.get(f"{d}_GBps") and scale[d]:
            link[f"{d}_GBps"] = round(link[f"{d}_GBps"] * scale[d], 2)
        elif scale[d] is None:
            link[f"{d}_GBps"] = round(c[f"{d}_GBps"], 2)
    if link.get("duplex_GBps") and scale["h2d"] and scale["d2h"]:
        link["duplex_GBps"] = round(link["duplex_GBps"] * (scale["h2d"] + scale["d2h"]) / 2, 2)
    link["copy_latency_ns"] = round(max(c["small_copy_us"] - launch, 0.5) * 1e3, 0)
    prof["link"] = link
    notes = [f"Calibrated on {raw['device']} at {raw['time']} by kosmos-bench calibrate (base profile {base})."]
    kz = raw.get("kosmos") or {"skipped": "not measured (kosmos=False)"}
    b = kz.get("builder", {})
    if "per_sm_tflops" in b:
        cublas_per_sm = prof["gemm_tflops"]["bf16"] / prof["num_sms"]
        prof["builder_efficiency"] = round(b["per_sm_tflops"] / cublas_per_sm, 3)
        notes.append(f"builder_efficiency measured with the kosmos kernel (world=1, {b['M']}x{b['N']}x{b['K']}).")
    ok = [m for m in kz.get("movers", []) if "GBps" in m]
    if ok:
        one = [m for m in ok if m["k"] == 1]
        per_wg = one[0]["GBps"] if one else max(m["GBps"] / m["k"] for m in ok)
        prof["link"]["wg_GBps"] = round(per_wg, 2)
        notes.append("link.wg_GBps measured: kosmos fixed:1 on a communication-bound host ag-gemm.")
        ok.sort(key=lambda m: m["k"])
        peak = max(m["GBps"] for m in ok)
        k_peak = next(m["k"] for m in ok if m["GBps"] >= 0.95 * peak)
        if ok[-1]["GBps"] < 0.8 * ok[-1]["k"] * per_wg:  # the movers saturated the link
            prof["link"]["h2d_GBps"] = round(peak, 2)
            notes.append(f"link.h2d_GBps = the most kosmos movers reached together ({k_peak}+ WGs, SM reads "
                         "of mapped host memory); copy_engine_GBps keeps the copy-engine rate for the baselines.")
        last = ok[-1]
        if last["k"] > k_peak and last["GBps"] < 0.9 * peak:  # contention collapse past the peak
            gamma = math.log(peak / last["GBps"]) / math.log(last["k"] / k_peak)
            prof["link"]["collapse"] = {"flows": k_peak, "exponent": round(gamma, 3)}
            notes.append(f"link.collapse fitted: {last['k']} movers reached {last['GBps']:.1f} GB/s against "
                         f"{peak:.1f} at {k_peak}.")
        elif prof["link"].get("collapse"):
            prof["link"]["collapse"] = None
            notes.append("link.collapse: none measured up to the largest mover count probed.")
    dx = kz.get("duplex", {})
    if "GBps" in dx:
        prof["link"]["duplex_GBps"] = round(dx["GBps"], 2)
        notes.append("link.duplex_GBps measured: kosmos gemm-rs fixed:48, communication-bound (both directions).")
    tm = kz.get("tile_mover", {})
    if "GBps" in tm:
        prof["link"]["wg_tile_GBps"] = round(tm["GBps"], 2)
        notes.append("link.wg_tile_GBps measured: kosmos fixed:1 on a communication-bound host gemm-rs.")
    if "per_sm_tflops" not in b or not ok:
        why = kz.get("skipped") or "kosmos probes failed (see calibration.kosmos)"
        notes.append(f"builder_efficiency / link.wg_GBps partly NOT measured ({why}): base estimates kept.")
    prof["notes"] = notes + [n for n in prof.get("notes", []) if not n.startswith("Calibrated on")]
    prof["calibration"] = raw
    return prof


def calibrate(out_path, device: str = "cuda", base: str = "h200-host-pcie", kosmos: bool = True) -> dict:
    """Measure this GPU, write a profile JSON at `out_path` (based on `base`), return it."""
    raw = measure(device, base, kosmos)
    name = Path(out_path).name
    name = name[:-5] if name.endswith(".json") else name
    prof = build_profile(raw, base, name=name)
    Path(out_path).write_text(json.dumps(prof, indent=2, default=float))
    return prof
