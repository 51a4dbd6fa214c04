"""Simulator backend: the kernels' own schedules replayed on a hardware profile.

    fields, trace = run_point(point)     # point.backend == 'sim'

`kosmos` points run the discrete-event engine (`engine.py`) over the items, queue orders,
dependencies and mover counts of `kosmos_bench.schedule` (`model.py` prices them with the
profile); `nccl-seq` and `nccl-overlap` are closed-form stream models (`baselines.py`).
Every number is a prediction: rows say backend=sim and name the profile.
"""
from __future__ import annotations

import time

import pandas as pd

from ..point import MOE_OPS, Point
from . import baselines, profiles
from .model import Unsupported

IMPLS = ("kosmos", "nccl-seq", "nccl-overlap", "torch")
OPS = ("ag-gemm", "gemm-rs", "gemm", "moe", "ag-wgrad")

__all__ = ["run_point", "simulate_point", "profile_for", "check_memory", "memory_bytes", "Unsupported", "profiles",
           "IMPLS"]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def profile_for(point: Point) -> dict:
    """The point's profile (its `profile` field, else the default for its fabric)."""
    try:
        return profiles.load(point.profile or profiles.default_for(point.fabric, point.world))
    except KeyError as e:
        raise Unsupported(str(e.args[0])) from None


def _check_fabric(point: Point, prof: dict) -> None:
    host_prof = prof["topology"] == "host"
    if point.fabric == "host" and not host_prof:
        raise Unsupported(f"profile {prof['name']} has no host link; use a host profile (e.g. h200-host-pcie)")
    if point.fabric in ("nvlink", "gloo") and host_prof:
        raise Unsupported(f"profile {prof['name']} describes the host fabric, not {point.fabric}")


def memory_bytes(point: Point) -> int:
    """Bytes one GPU holds for the point's inputs and outputs alone (a lower bound: no
    workspace). ag-gemm: gathered A (M x K), B_r (K x N/W), C_r (M x N/W); gemm-rs: A_r
    (M x K/W), B_r (K/W x N), the partial product (M x N) and band r (M/W x N); gemm: A, B, C.
    fabric local holds all W ranks on one GPU."""
    M, N, K, W = point.M, point.N, point.K, max(1, point.world)
    if point.op in ("ag-gemm", "ag-wgrad"):  # ag-wgrad: gathered At (K x M), B_r (K x N/W), C_r
        elems = M * K + K * -(-N // W) + M * -(-N // W)
    elif point.op == "gemm-rs":
        elems = M * -(-K // W) + -(-K // W) * N + M * N + -(-M // W) * N
    else:
        elems = M * K + K * N + M * N
    return elems * DTYPE_BYTES.get(point.dtype, 4) * (W if point.fabric == "local" else 1)


def _gb(nbytes: float) -> str:
    gb = nbytes / 1e9
    return f"{gb:,.0f}" if gb >= 100 else f"{gb:.3g}"


def check_memory(point: Point, prof: dict) -> None:
    """Refuse (Unsupported: a skipped row with the reason) a point whose inputs and outputs
    alone exceed the profile's memory per GPU: the simulator would time what no GPU can hold."""
    cap = prof.get("memory_GB")
    if not cap:
        return
    need = memory_bytes(point)
    if need > cap * 1e9:
        where = f", {point.world} emulated ranks on one GPU" if point.fabric == "local" else ""
        raise Unsupported(f"needs {_gb(need)} GB per GPU for its {point.dtype} inputs and outputs alone{where}; "
                          f"profile {prof['name']} has {cap:g} GB")


def as_forward(point: Point) -> Point:
    """A backward op (ops/backward.py) as the forward op with the same schedule, bytes and FLOPs:
    the dgrad ops are their forward kernels (B_r's layout is not modelled); ag-wgrad gathers At
    (K x M) as ag-gemm gathers A (M x K): the baselines' rings and copies are the same, the
    GEMM the same size (kosmos ag-wgrad keeps its own schedule: ``simulate_point``)."""
    if point.op in ("ag-gemm-dgrad", "gemm-rs-dgrad"):
        return point.replace(op=point.op.removesuffix("-dgrad"))
    if point.op == "ag-wgrad":
        return point.replace(op="ag-gemm", M=point.K, K=point.M)
    return point


def simulate_point(point: Point, prof: dict | None = None, num_movers: int | None = None, full: bool | None = None):
    """(fields, SimResult or None) of one point. `num_movers` overrides the policy's k."""
    from . import engine, model

    if point.op == "layer":
        from .layer import simulate_layer

        return simulate_layer(point, prof or profile_for(point)), None
    wgrad = point if point.op == "ag-wgrad" and point.impl == "kosmos" else None  # its own schedule
    acc_elems = point.M * (point.N // point.world) if point.op == "ag-wgrad" else 0  # C_r, summed chunk by chunk
    point = as_forward(point)
    prof = prof or profile_for(point)
    if point.op in MOE_OPS:  # their own closed-form model (sim/moe.py)
        from . import moe

        _check_fabric(point, prof)
        return moe.simulate(point, prof), None
    if point.impl not in IMPLS:
        raise Unsupported(f"the simulator models {', '.join(IMPLS)}, not {point.impl}")
    _check_fabric(point, prof)
    if point.op not in OPS:
        raise Unsupported(f"the simulator does not model {point.op}")
    if point.dtype not in prof["gemm_tflops"]:
        raise Unsupported(f"profile {prof['name']} has no {point.dtype} GEMM rate")
    check_memory(point, prof)
    if point.op == "gemm":
        return _gemm_point(point, prof)
    if point.impl == "torch":
        raise Unsupported("impl torch runs only the gemm op")
    fields = {"profile": prof["name"], "t_gemm_us": baselines.gemm_alone_us(point, prof), "cv": 0.0}
    kpoint = wgrad or point  # the kosmos kernel's op (the GEMM / collective alone: as_forward's)
    if point.impl != "kosmos" and point.fabric == "local":
        raise Unsupported(f"{point.impl} does not run on the local fabric")
    try:
        fields["t_comm_us"] = baselines.comm_alone_us(point, prof) if point.world > 1 else None
        if point.world > 1 and point.concurrent:
            fields["t_concurrent_us"] = baselines.concurrent_us(point, prof)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    res = None
    t0 = time.perf_counter()
    if point.impl == "nccl-seq":
        t = baselines.seq_us(point, prof)
    elif point.impl == "nccl-overlap":
        t = baselines.overlap_us(point, prof, acc_elems)
    else:
        built = model.build(kpoint, prof, num_movers=num_movers, full=full)
        res = engine.simulate(built.problem, check=False)
        t = (res.makespan_ns + built.overhead_ns) / 1e3
        fields.update(res.summary())
        fields.update(built.info or {})  # the resolved configuration, as the GPU runner's info records it
        fields.update(builder=model.resolve_builder(kpoint, prof))
        fields.update(num_movers=built.num_movers, num_wgs=built.num_wgs, sim_ranks=len(built.ranks),
                      sim_symmetric=built.symmetric, sim_items=built.problem.n, sim_events=res.events)
    fields.update(t_median_us=t, t_min_us=t, t_p99_us=t, sim_wall_s=time.perf_counter() - t0)
    return fields, res


def _gemm_point(point: Point, prof: dict):
    """Op gemm (world 1): `torch` = cuBLAS model; `kosmos` = the standalone sm90 builder
    (profile `builder_sm90`: its tile and rate), replayed as a world-1 ag-gemm schedule."""
    from . import engine, model

    if point.world != 1:
        raise Unsupported(f"op gemm has no communication: world must be 1, got {point.world}")
    t_gemm = baselines.cublas_us(prof, point.dtype, point.M, point.N, point.K)
    fields = {"profile": prof["name"], "t_gemm_us": t_gemm, "t_comm_us": None, "cv": 0.0}
    res = None
    t0 = time.perf_counter()
    if point.impl == "torch":
        t = t_gemm
    elif point.impl == "kosmos":
        b = prof.get("builder_sm90")
        if not b:
            raise Unsupported(f"profile {prof['name']} has no sm90 builder figures (builder_sm90)")
        p2 = {**prof, "tile_m": b["tile_m"], "tile_n": b["tile_n"], "builder_efficiency": b["efficiency"]}
        built = model.build(point.replace(op="ag-gemm", policy="self"), p2)
        res = engine.simulate(built.problem, check=False)
        t = (res.makespan_ns + built.overhead_ns) / 1e3
        fields.update(res.summary())
        fields.update(num_wgs=built.num_wgs, sim_ranks=1, sim_items=built.problem.n, sim_events=res.events)
    else:
        raise Unsupported(f"the simulator models op gemm for kosmos and torch, not {point.impl}")
    fields.update(t_median_us=t, t_min_us=t, t_p99_us=t, sim_wall_s=time.perf_counter() - t0)
    return fields, res


def run_point(point: Point) -> tuple[dict, pd.DataFrame | None]:
    """Result-row fields of a simulated point, and its role timeline (kosmos; None for the
    baselines, which have no per-WG roles). Raises `Unsupported` for points it cannot model."""
    fields, res = simulate_point(point)
    trace = res.timeline() if res is not None else None
    return fields, trace
