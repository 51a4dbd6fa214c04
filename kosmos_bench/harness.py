"""Measure one point in one process: inputs, correctness, determinism, timing, trace.

Called in every process that takes part in a point (see launch.py); returns the
result row (meaningful on rank 0) and, when traced, the role timeline. Never raises for a
problem with the point itself: such problems become `failed`/`skipped` rows.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import math
import traceback

import numpy as np
import torch

from . import sharing, timing
from .impls import get_impl
from .impls import layer
from .impls import nccl as nccl_impls
from .impls.base import RankCtx, SkipPoint, close_quietly
from .ops import get_op
from .point import Point
from .runtime import nvml

# Largest op (2*M*N*K FLOPs) the cpu backend runs; bigger points are skipped with a reason.
CPU_MAX_FLOPS = 4e10


def seed_for(p: Point, call: int = 0) -> int:
    """Fresh inputs per point (and per call index), identical in every rank of the point."""
    return int(hashlib.sha1(f"{p.key()}:{call}".encode()).hexdigest()[:8], 16)


def device_for(p: Point, rank: int) -> torch.device:
    if p.backend == "gpu":
        devs = sharing.layout_of(p).devices
        return torch.device("cuda", devs[rank] if rank < len(devs) else rank % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


def skip_reason(p: Point) -> str | None:
    """Why a point cannot run here at all (before any process is asked to run it)."""
    op = get_op(p.op)
    why = op.validate(p)
    if why:
        return why
    try:
        impl = get_impl(p.impl)
    except KeyError as e:
        return str(e.args[0])
    ok, why = impl.available(p.backend)
    if not ok:
        return why
    why = layer.unsupported(p, impl) if p.op == "layer" else impl.unsupported(p)
    if why:
        return why
    if p.backend == "cpu" and op.flops(p) > CPU_MAX_FLOPS:
        return f"{op.flops(p) / 1e9:.0f} GFLOP is too large for the cpu backend (use a GPU or --backend sim)"
    return None


def base_row(p: Point) -> dict:
    op = get_op(p.op)
    shared = p.backend == "gpu" and sharing.is_shared(p)
    return {**p.as_row(), "flops": op.flops(p), "comm_bytes": op.comm_bytes(p),
            "emulated": p.fabric in ("local", "host") or shared, "shared_gpu": shared,
            "timestamp": _dt.datetime.now().isoformat(timespec="seconds")}


def derive(row: dict, p: Point) -> dict:
    """Rates from the median time: TFLOP/s, algbw/busbw (nccl-tests), overlap efficiencies."""
    t = row.get("t_median_us")
    if not t or not math.isfinite(t):
        return row
    op = get_op(p.op)
    row["tflops"] = op.flops(p) / (t * 1e-6) / 1e12
    if p.world > 1:
        row["algbw_gbs"] = op.comm_bytes(p) / (t * 1e-6) / 1e9
        row["busbw_gbs"] = row["algbw_gbs"] * op.bus_factor(p)
    from .report import overlap_efficiency

    if row.get("t_gemm_us") is not None:
        row["overlap_efficiency"] = overlap_efficiency(row["t_gemm_us"], row.get("t_comm_us"), t)
    if row.get("t_concurrent_us"):
        row["eff_concurrent"] = row["t_concurrent_us"] / t
    row.update(op.derive(row, p))
    return row


def _allreduce(vals: list[float], ctx: RankCtx, op: str) -> list[float]:
    if ctx.group is None or ctx.procs == 1:
        return vals
    import torch.distributed as dist

    on_gpu = ctx.device.type == "cuda" and dist.get_backend(ctx.group) == "nccl"  # gloo: host tensors
    dev = ctx.device if on_gpu else torch.device("cpu")
    t = torch.tensor(vals, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op],
                    group=ctx.group)
    return t.tolist()


def _bench(fns: dict, p: Point, ctx: RankCtx) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Per-call microseconds of each function (max over ranks) and, from NVML while they ran,
    each one's median SM clock ("mhz"), board power ("w") and clock-event reasons ("why")."""
    before = agree = None
    if ctx.group is not None and ctx.procs > 1:
        import torch.distributed as dist

        before = lambda: dist.barrier(group=ctx.group)  # noqa: E731 - align ranks per rep
        agree = lambda more: bool(_allreduce([float(more)], ctx, "max")[0])  # noqa: E731
    windows: dict = {}
    with nvml.ClockSampler(_gpu_uuid(ctx.device)) as clock:
        s = timing.bench(fns, device=ctx.device, warmup=p.warmup, reps=p.reps, before_rep=before, agree=agree,
                         windows_out=windows)
    # a rep takes as long as its slowest rank; the clocks are this rank's GPU's
    clocks = {"mhz": nvml.per_window(clock.samples, windows), "w": nvml.per_window(clock.power, windows),
              "why": nvml.reasons_per_window(clock.reasons, windows)}
    return {k: np.array(_allreduce(list(v), ctx, "max")) for k, v in s.items()}, clocks


def _gpu_uuid(device) -> str | None:
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return str(uuid) if uuid is not None else None


def _check(runner, p: Point, ctx: RankCtx, inputs, state) -> tuple[int, float, bool, dict]:
    """Poison, run twice, compare with the reference (the op's `compare`) and with each other
    (bitwise, everything the op's `snapshot` takes)."""
    op = get_op(p.op)
    results = []
    for _ in range(2):
        op.poison(runner)
        runner.run()
        ctx.sync()
        if hasattr(runner, "check"):  # kernels report a watchdog abort here, naming the flag
            runner.check()
        results.append(op.snapshot(runner))
    res = op.compare(p, ctx.ranks_here, results[0], inputs, state)
    wrong, err = res.pop("wrong"), res.pop("max_rel_err")
    same = all(torch.equal(t, results[1][name][r]) for name, ts in results[0].items() for r, t in ts.items())
    # NaN != NaN under torch.equal; poisoned-and-unwritten outputs are already counted wrong.
    w_sum = _allreduce([float(wrong)], ctx, "sum")[0]
    e_max = _allreduce([err], ctx, "max")[0]
    s_min = _allreduce([float(same)], ctx, "min")[0]
    return int(w_sum), e_max, bool(s_min), res


def run_point(p: Point, *, rank: int, procs: int) -> tuple[dict, object]:
    row = base_row(p)
    why = skip_reason(p)
    if why:
        return {**row, "status": "skipped", "error": why}, None
    device = device_for(p, rank)
    if p.fabric == "host" and device.type == "cuda":  # pinned peers' data on the GPU's NUMA node
        from .runtime import numa

        row["numa_node"] = numa.bind_near(device.index or 0)
    group = None
    if procs > 1 or p.fabric in ("nvlink", "gloo"):
        import torch.distributed as dist

        group = dist.group.WORLD if dist.is_initialized() else None
    ctx = RankCtx(rank=rank, world=p.world, procs=procs, device=device, fabric=p.fabric, backend=p.backend, group=group,
                  shared_gpu=bool(row["shared_gpu"]))
    impl, op = get_impl(p.impl), get_op(p.op)
    runner, trace = None, None
    try:
        ranks = list(range(p.world)) if p.fabric in ("local", "host") else [rank]
        inputs, state = op.setup(p, ranks, device, seed_for(p))
        runner = layer.prepare(p, ctx, inputs) if p.op == "layer" else impl.prepare(p, ctx, inputs)
        wrong, err, same, extra = _check(runner, p, ctx, inputs, state)
        row.update(wrong=wrong, max_rel_err=err, deterministic=same, **extra)
        row.update(op.columns(p, state))
        del state
        # The fused op, its GEMM alone and its collective alone, timed interleaved.
        alone = op.alone(p, ctx, inputs)
        if p.op == "layer":  # the step with no collectives / its collectives alone (impls/layer.py)
            alone = ({"gemm": layer.gemm_alone(p, ctx, inputs), "comm": layer.comm_alone(p, ctx, inputs)}, {})
        if alone is None:
            gemm, comm = nccl_impls.gemm_alone(p, ctx, inputs), nccl_impls.comm_alone(p, ctx, inputs)
        else:
            fns_alone, cols = alone
            gemm, comm = fns_alone["gemm"], fns_alone["comm"]
            row.update(cols)
        fns = {"op": runner.run, "gemm": gemm}
        if comm is not None:
            fns["comm"] = comm
            if device.type == "cuda" and p.concurrent:  # both alone at once, no dependency: the chip's own overlap
                fns["both"] = nccl_impls.concurrent_alone(fns["gemm"], comm, device)
        samples, clocks = _bench(fns, p, ctx)
        row.update(timing.stats(samples["op"]))
        row["t_gemm_us"] = float(np.median(samples["gemm"]))
        row["t_comm_us"] = float(np.median(samples["comm"])) if comm is not None else None
        row["t_concurrent_us"] = float(np.median(samples["both"])) if "both" in samples else None
        mhz, watts, why = clocks["mhz"], clocks["w"], clocks["why"]
        row.update(sm_mhz=mhz.get("op"), sm_mhz_gemm=mhz.get("gemm"), sm_mhz_comm=mhz.get("comm"),
                   power_w=watts.get("op"), power_w_gemm=watts.get("gemm"), clock_limit=why.get("op"),
                   clock_limit_gemm=why.get("gemm"))
        if p.trace and hasattr(runner, "run_traced"):
            trace = runner.run_traced()
            if trace is not None:
                from .trace import summarize

                trace = trace.assign(key=p.key())
                row.update(summarize(trace))
        row.update(getattr(runner, "info", {}) or {})  # after the traced call: it adds trace_dropped
        row["status"] = "ok" if wrong == 0 else "wrong"
        if wrong:
            mism = f", {row['route_mismatches']} tokens routed off the reference" if row.get("route_mismatches") else ""
            row["error"] = f"{wrong} wrong: elements outside tolerance (max_rel_err {err:.3g}){mism}"
        derive(row, p)
    except SkipPoint as e:
        row.update(status="skipped", error=str(e))
    except torch.cuda.OutOfMemoryError as e:
        row.update(status="failed", error=f"out of memory: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - the point fails, the sweep goes on
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}]" if tb else ""
        msg = (str(e).strip().splitlines() or [""])[0]
        row.update(status="failed", error=f"{type(e).__name__}: {msg}{where}")
    finally:
        close_quietly(runner)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row, trace


def run_sim_point(p: Point) -> tuple[dict, object]:
    """A point on the simulator backend (in-process; no correctness check applies)."""
    from . import sim

    row = base_row(p)
    why = get_op(p.op).validate(p)
    if why:
        return {**row, "status": "skipped", "error": why}, None
    try:
        fields, trace = sim.run_point(p)
    except sim.Unsupported as e:
        return {**row, "status": "skipped", "error": str(e)}, None
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "failed", "error": f"{type(e).__name__}: {e}"}, None
    row.update(fields)
    row["status"] = "ok"
    if trace is not None:
        from .trace import summarize

        trace = trace.assign(key=p.key())
        row.update(summarize(trace))
    return derive(row, p), (trace if p.trace else None)
