"""The nvlink fabric in shared-GPU mode, exercised for real: W rank processes on one GPU.

``run_session(world)`` spawns `world` processes, all on cuda:0, with a gloo group (as
launch.py does in shared-GPU mode), and each runs, in order:

1. matrix: ag-gemm (mma and sm90 builders) and gemm-rs on uneven shapes, kosmos under every
   policy (self, fixed:1, predicted), and symm-mem; NaN-poisoned outputs, 3 calls, wrong elements against the fp32
   reference and bitwise equality across the calls;
2. late: the last rank sleeps half the watchdog timeout before its first launch; every rank
   must still succeed (the peers' kernels wait for it, time-sliced, without tripping);
3. absent: the last rank does not launch; every other rank's check() must raise the watchdog
   error; then the last rank launches its call (its peers have aborted) and must raise it as
   well; then a fresh point on the same GPU must run correctly (the GPU is usable).

The results (one dict per rank) come back to the parent; tests/test_nvlink_shared_gpu.py
asserts on them and ``python3 -m kosmos_bench.shared_gpu_check 2 4`` prints a summary.
"""
from __future__ import annotations

import os
import queue as _queue
import sys
import time
import traceback

SHAPES = {  # uneven: M/W, N/W, K are no multiples of the tiles
    "ag-gemm": lambda W: (300 * W, 77 * W, 200),
    "gemm-rs": lambda W: (300 * W, 77 * W, 200),
}
# kosmos cases of the matrix: (op, builder, shape); the Hopper builder needs K, N/W multiples of 8
KOSMOS_CASES = (
    ("ag-gemm", "mma", SHAPES["ag-gemm"]),
    ("ag-gemm", "sm90", lambda W: (200 * W, 136 * W, 264)),
    ("gemm-rs", "mma", SHAPES["gemm-rs"]),
)
POLICIES = ("self", "fixed:1", "predicted")
LATE_TIMEOUT_S = 2.0
ABSENT_TIMEOUT_S = 1.0


def _case(point, ctx, seed: int, calls: int = 3, late_sleep_s: float = 0.0, **kw) -> dict:
    """Prepare, run `calls` poisoned calls, compare; one dict (never raises)."""
    import torch

    from .impls import get_impl
    from .impls.base import SkipPoint, close_quietly
    from .ops import get_op
    from .ops.base import check_output

    out = {"op": point.op, "impl": point.impl, "policy": point.policy, "world": point.world,
           "shape": (point.M, point.N, point.K), "builder": kw.get("builder")}
    impl = get_impl(point.impl)
    why = impl.unsupported(point)
    if why:
        return {**out, "status": "skipped", "error": why}
    runner = None
    try:
        op = get_op(point.op)
        inputs, A, B = op.inputs(point, [ctx.rank], ctx.device, seed)
        runner = impl.prepare(point, ctx, inputs, **kw)
        res = []
        for c in range(calls):
            for o in runner.outputs.values():
                o.fill_(float("nan"))
            if c == 0 and late_sleep_s:
                time.sleep(late_sleep_s)
            runner.run()
            ctx.sync()
            if hasattr(runner, "check"):
                runner.check()
            res.append(runner.outputs[ctx.rank].clone())
        wrong, err = check_output(res[0], op.reference(A, B, ctx.rank, point.world), point.dtype)
        same = all(torch.equal(res[0], r) for r in res[1:])
        info = getattr(runner, "info", {}) or {}
        return {**out, "status": "ok" if wrong == 0 and same else "wrong", "wrong": wrong, "max_rel_err": err,
                "deterministic": same, "peer_memory": info.get("peer_memory"),
                "peer_memory_why": info.get("peer_memory_why"), "builder_used": info.get("builder")}
    except Exception as e:  # noqa: BLE001 - reported
        if isinstance(e, SkipPoint):
            return {**out, "status": "skipped", "error": str(e)}
        return {**out, "status": "failed", "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(limit=6)}
    finally:
        close_quietly(runner)


def _rank_main(rank: int, world: int, port: int, q, scenarios: tuple[str, ...]) -> None:
    result: dict = {"rank": rank, "cases": [], "late": [], "absent": {}}
    try:
        import torch
        import torch.distributed as dist

        from . import launch, sharing
        from .impls.base import RankCtx
        from .point import Point

        sharing.set_forced(True)
        torch.cuda.set_device(0)
        launch.init_group(rank, world, "gloo", "127.0.0.1", port, shared_gpu=True)
        dev = torch.device("cuda", 0)
        ctx = RankCtx(rank=rank, world=world, procs=world, device=dev, fabric="nvlink", backend="gpu",
                      group=dist.group.WORLD, shared_gpu=True)

        def point(op, impl, policy=None, seed=0, shape=None):
            M, N, K = (shape or SHAPES[op])(world)
            return Point(op=op, impl=impl, M=M, N=N, K=K, world=world, fabric="nvlink", backend="gpu",
                         policy=policy, seed=seed)

        seed = 100
        if "matrix" in scenarios:
            for op, builder, shape in KOSMOS_CASES:
                for pol in POLICIES:
                    seed += 1
                    result["cases"].append(_case(point(op, "kosmos", pol, shape=shape), ctx, seed, builder=builder))
                    dist.barrier()
            for op in SHAPES:
                seed += 1
                result["cases"].append(_case(point(op, "symm-mem"), ctx, seed))
                dist.barrier()
        if "late" in scenarios:
            for op in SHAPES:
                seed += 1
                sleep = LATE_TIMEOUT_S / 2 if rank == world - 1 else 0.0
                t0 = time.monotonic()
                r = _case(point(op, "kosmos", "self"), ctx, seed, late_sleep_s=sleep, timeout_s=LATE_TIMEOUT_S)
                r["seconds"] = time.monotonic() - t0
                result["late"].append(r)
                dist.barrier()
        if "absent" in scenarios:
            result["absent"] = _absent(ctx, point("ag-gemm", "kosmos", "self", seed=7), point("gemm-rs", "kosmos",
                                                                                                "self", seed=8))
    except BaseException:  # noqa: BLE001
        result["crash"] = traceback.format_exc(limit=8)
    finally:
        q.put(result)
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def _absent(ctx, p_fault, p_next) -> dict:
    """The last rank is absent while its peers run one call: they time out; then it runs (its
    peers aborted): it times out too; then a fresh point must be correct."""
    import torch
    import torch.distributed as dist

    from .impls import get_impl
    from .impls.kosmos import WatchdogError
    from .ops import get_op

    rank, W = ctx.rank, ctx.world
    out: dict = {}
    op = get_op(p_fault.op)
    inputs, _, _ = op.inputs(p_fault, [rank], ctx.device, 4242)
    runner = get_impl("kosmos").prepare(p_fault, ctx, inputs, timeout_s=ABSENT_TIMEOUT_S)
    absent = rank == W - 1

    def one_call() -> None:
        t0 = time.monotonic()
        try:
            runner.run()
            runner.check()
            out["watchdog"] = None
        except WatchdogError as e:
            out["watchdog"] = str(e)
        except Exception as e:  # noqa: BLE001
            out["watchdog"] = None
            out["error"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.monotonic() - t0

    try:
        if not absent:
            one_call()
        dist.barrier()  # the peers have timed out
        if absent:
            one_call()
        dist.barrier()  # everyone is done with the faulted buffers
    finally:
        runner.close()
        torch.cuda.synchronize(ctx.device)
    dist.barrier()
    out["next"] = _case(p_next, ctx, 999)
    return out


def run_session(world: int, scenarios: tuple[str, ...] = ("matrix", "late", "absent"),
                timeout_s: float = 150.0) -> list[dict]:
    """Spawn `world` rank processes on cuda:0; their result dicts, by rank."""
    import torch.multiprocessing as mp

    from .launch import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, q, tuple(scenarios)), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < world and time.monotonic() < deadline:
        try:
            r = q.get(timeout=1.0)
            results[r["rank"]] = r
        except _queue.Empty:
            if all(p.exitcode is not None for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    for r in range(world):
        results.setdefault(r, {"rank": r, "crash": f"no result from rank {r} within {timeout_s:.0f} s "
                                                   f"(exit code {procs[r].exitcode})", "cases": [], "late": [],
                               "absent": {}})
    return [results[r] for r in range(world)]


def summary(world: int, results: list[dict]) -> list[str]:
    lines = []
    for res in results:
        if res.get("crash"):
            lines.append(f"W={world} rank {res['rank']}: CRASH {res['crash'].strip().splitlines()[-1]}")
    r0 = results[0]
    for c in r0["cases"]:
        extra = c.get("error") or (f"wrong={c.get('wrong')} err={c.get('max_rel_err', 0):.2g} "
                                   f"det={c.get('deterministic')} peer={c.get('peer_memory')} "
                                   f"builder={c.get('builder_used')}")
        lines.append(f"W={world} {c['op']:8s} {c['impl']:9s} {str(c['policy']):10s} {c['status']:7s} "
                     f"{'x'.join(map(str, c['shape']))} {extra}")
    whys = {c.get("peer_memory_why") for res in results for c in res["cases"] if c.get("peer_memory_why")}
    for w in whys:
        lines.append(f"W={world} symmetric memory not used: {w}")
    for res in results:
        for c in res["late"]:
            lines.append(f"W={world} late rank {res['rank']} {c['op']}: {c['status']} {c.get('error', '')} "
                         f"({c.get('seconds', 0):.2f} s)")
    for res in results:
        a = res.get("absent") or {}
        nxt = a.get("next") or {}
        wd = (a.get("watchdog") or "NO WATCHDOG ERROR")[:110]
        lines.append(f"W={world} absent rank {res['rank']}: {wd} | next point: {nxt.get('status')} "
                     f"{nxt.get('error', '')}")
    return lines


def main(argv: list[str]) -> int:
    worlds = [int(a) for a in argv] or [2, 4]
    for w in worlds:
        t0 = time.monotonic()
        res = run_session(w)
        print(f"== shared-GPU nvlink, world {w} ({time.monotonic() - t0:.0f} s)")
        for line in summary(w, res):
            print("  " + line)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
