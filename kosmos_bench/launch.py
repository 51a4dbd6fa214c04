"""Process launch: one worker per rank, fed a list of points, rows streamed back to the parent.

* Single node: the parent spawns `procs` workers (torch.multiprocessing, spawn) per group of
  points that need the same number of processes, with a torch.distributed group over
  localhost (NCCL on GPUs, gloo on CPU). The parent is the only writer of the results store.
  nvlink points with more ranks than visible GPUs (or `shared_gpu=True`) run in shared-GPU
  mode (sharing.py): ranks round-robin over the GPUs, a gloo group, rows marked emulated.
  A point that outlives its timeout, or a worker that dies, costs that point only: the
  workers are killed, a `timeout`/`failed` row is written and fresh workers take the rest.
* torchrun: when its environment (RANK, WORLD_SIZE, ...) is present, this process *is* one
  rank; every rank walks the same points and rank 0 writes the rows (multi-node works).
"""
from __future__ import annotations

import os
import queue as _queue
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.multiprocessing as mp

from . import harness, sharing
from .point import Point


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def procs_for(point: Point) -> int:
    """Real processes a point needs: one per rank on real fabrics, one on emulated ones."""
    return point.world if point.fabric in ("nvlink", "gloo") else 1


def needs_group(point: Point) -> bool:
    return point.fabric in ("nvlink", "gloo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Event:
    kind: str  # 'start' | 'row' | 'done'
    index: int = -1
    row: dict | None = None
    trace: object = None  # pandas DataFrame of the role timeline, when traced


def init_group(rank: int, world: int, backend: str, addr: str, port: int, shared_gpu: bool = False) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if shared_gpu:  # torch symmetric memory refuses two ranks on one device unless told
        os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        kw["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), **kw)


def group_layout(p: Point, n_gpus: int | None = None) -> sharing.Layout:
    """Placement and process-group backend of a point's processes (sharing.layout)."""
    return sharing.layout_of(p, n_gpus)


def _worker(rank: int, procs: int, points: list[Point], port: int, q, backend: str, with_group: bool,
            shared_gpu: bool | None = None) -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated")
    sharing.set_forced(shared_gpu)
    if backend != "gpu":  # one CPU share per rank, not every rank on every core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
    try:
        lay = group_layout(points[0]) if points else None
        if backend == "gpu":
            dev = lay.devices[rank] if lay is not None and len(lay.devices) > rank else rank % max(1, torch.cuda.device_count())
            torch.cuda.set_device(dev)
        if with_group:
            gb = lay.group_backend if lay is not None and lay.group_backend else ("nccl" if backend == "gpu" else "gloo")
            init_group(rank, procs, gb, "127.0.0.1", port, shared_gpu=bool(lay and lay.shared_gpu))
        for i, p in enumerate(points):
            if rank == 0:
                q.put(Event("start", i))
            row, trace = harness.run_point(p, rank=rank, procs=procs)
            if rank == 0:
                q.put(Event("row", i, row, trace))
    except BaseException:  # noqa: BLE001 - reported to the parent as the failing point's error
        q.put(Event("crash", -1, {"error": traceback.format_exc(limit=4)}))
        raise
    finally:
        if with_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        if rank == 0:
            q.put(Event("done"))


def run_points(points: list[Point], on_start: Callable[[Point], None], on_row: Callable[[Point, dict, object], None],
               timeout_s: float, isolate: bool = False, shared_gpu: bool | None = None) -> None:
    """Run `points` (already filtered for resume) in worker processes; rows go to on_row.
    Consecutive points needing the same processes share one spawn, unless `isolate`: then every
    point gets fresh workers (a process's history can move timings: every second kosmos runner
    of a process once ran 5% slow, results/issue4-h200-20261203/).
    `shared_gpu`: True puts every rank of nvlink points on cuda:0 (gloo group), False never
    shares, None (default) shares when a point has more ranks than visible GPUs."""
    sharing.set_forced(shared_gpu)
    groups: list[list[Point]] = []
    sig = lambda p: (procs_for(p), p.backend, needs_group(p), group_layout(p))  # noqa: E731
    for p in points:
        if groups and not isolate and sig(groups[-1][0]) == sig(p):
            groups[-1].append(p)
        else:
            groups.append([p])
    for g in groups:
        _run_group(g, on_start, on_row, timeout_s)


def _run_group(points: list[Point], on_start, on_row, timeout_s: float) -> None:
    ctx = mp.get_context("spawn")
    remaining = list(points)
    while remaining:
        procs, backend = procs_for(remaining[0]), remaining[0].backend
        q = ctx.Queue()
        port = _free_port()
        workers = [ctx.Process(target=_worker, args=(r, procs, remaining, port, q, backend, needs_group(remaining[0]),
                                                            sharing.forced()),
                               daemon=True) for r in range(procs)]
        for w in workers:
            w.start()
        current, finished, crash = -1, set(), None
        deadline = time.monotonic() + timeout_s + 120  # start-up: imports, group init
        reason = None
        while reason is None:
            try:
                ev: Event | None = q.get(timeout=0.5)
            except _queue.Empty:
                ev = None
            if ev is not None and ev.kind == "start":
                current, deadline = ev.index, time.monotonic() + timeout_s
                on_start(remaining[current])
            elif ev is not None and ev.kind == "row":
                finished.add(ev.index)
                on_row(remaining[ev.index], ev.row, ev.trace)
            elif ev is not None and ev.kind == "crash":
                crash = crash or (ev.row or {}).get("error", "")
            elif ev is not None and ev.kind == "done":
                reason = "done"
            elif time.monotonic() > deadline:
                reason = "timeout"
            elif any(w.exitcode not in (None, 0) for w in workers):
                time.sleep(0.5)  # let the crash report arrive
                while not q.empty():
                    ev = q.get()
                    if ev.kind == "crash":
                        crash = crash or (ev.row or {}).get("error", "")
                reason = "died"
        for w in workers:
            if w.is_alive():
                w.kill()
        for w in workers:
            w.join(timeout=10)
        codes = ",".join(str(w.exitcode) for w in workers)
        last = crash.strip().splitlines()[-1] if crash else ""
        if current < 0:
            # The workers never reached a point (e.g. process-group init failed): every
            # remaining point fails with that reason rather than being retried one by one.
            err = f"workers failed to start ({reason}, exit codes {codes}){': ' + last if last else ''}"
            for p in remaining:
                on_row(p, {**p.as_row(), "status": "failed", "error": err}, None)
            return
        if current not in finished:
            p = remaining[current]
            if reason == "timeout":
                status, err = "timeout", f"no result within {timeout_s:.0f} s; workers were killed"
            else:
                status, err = "failed", f"worker died ({reason}, exit codes {codes}){': ' + last if last else ''}"
            on_row(p, {**p.as_row(), "status": status, "error": err}, None)
            finished.add(current)
        remaining = [p for i, p in enumerate(remaining) if i not in finished]


def run_points_torchrun(points: Iterable[Point], on_start, on_row) -> None:
    """This process is one torchrun rank; rank 0 reports rows."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    points = list(points)
    backend = points[0].backend if points else "cpu"
    lay = group_layout(points[0].replace(world=world)) if points else None
    gb = lay.group_backend if lay is not None and lay.group_backend else ("nccl" if backend == "gpu" else "gloo")
    if backend == "gpu" and lay is not None and lay.shared_gpu:
        torch.cuda.set_device(lay.devices[rank % len(lay.devices)])
    init_group(rank, world, gb, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
               shared_gpu=bool(lay and lay.shared_gpu))
    for p in points:
        if procs_for(p) != world:
            if rank == 0:
                on_row(p, {**p.as_row(), "status": "skipped",
                           "error": f"needs {procs_for(p)} processes, torchrun started {world}"}, None)
            continue
        if rank == 0:
            on_start(p)
        row, trace = harness.run_point(p, rank=rank, procs=world)
        if rank == 0:
            on_row(p, row, trace)
