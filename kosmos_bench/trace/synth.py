"""Synthetic role timelines and run directories, shaped like the real AG+GEMM kernel's.

For tests and demos of the analysis only (never reported as measurements: rows are written
with ``backend='sim'`` and ``synthetic=True``). A tiny event loop plays the WG loop of
DESIGN.md §3 on one rank's queues:

* mover items: the W-1 peer A-bands in ring order r+1, r+2, ...; a copy takes
  ``t_move_ns`` scaled up when more than ``link_par`` copies share the link;
* builder items: ``tiles_per_band`` C tiles per band, local band first, then band-major in
  mover order; a tile is ready when its band has arrived;
* ``self``: a WG builds the head when ready, else claims the next mover item, else WAITs on
  the head; ``fixed:k``: WGs 0..k-1 only move (then exit), the others only build (and WAIT);
  ``predicted``: fixed with k from the alpha-beta balance of the two sides.
"""
from __future__ import annotations

import heapq
import math
from pathlib import Path

import numpy as np
import pandas as pd

GLOBALTIMER_BASE_NS = 1_700_000_000_000_000_000  # globaltimer-like absolute origin


def predicted_movers(wgs: int, world: int, tiles_per_band: int, t_build_ns: float, t_move_ns: float,
                     link_par: int = 4) -> int:
    """k that balances copy time (W-1 bands over min(k, link_par) links) and build time."""
    best, best_t = 1, math.inf
    for k in range(1, wgs):
        t_comm = (world - 1) * t_move_ns / min(k, link_par)
        t_gemm = world * tiles_per_band * t_build_ns / (wgs - k)
        t = max(t_comm, t_gemm)
        if t < best_t:
            best, best_t = k, t
    return best


def synthetic_trace(policy: str = "self", *, world: int = 8, ranks: list[int] | None = None, wgs: int = 16,
                    bands_per_peer: int = 4, tiles_per_band: int = 4, t_build_ns: float = 2_000,
                    t_move_ns: float = 3_000, link_par: int = 4, jitter: float = 0.15, seed: int = 0) -> pd.DataFrame:
    """Role timeline (trace schema, no key) of one AG+GEMM call, for the given ranks (default [0]).

    Each rank's A shard is `bands_per_peer` bands of `tiles_per_band` C tiles each; one
    copy of a band takes `t_move_ns` (alone on the link), one tile `t_build_ns`."""
    ranks = [0] if ranks is None else ranks
    frames = [_one_rank(policy, r, world, wgs, bands_per_peer, tiles_per_band, t_build_ns, t_move_ns, link_par,
                        jitter, seed * 1009 + r) for r in ranks]
    return pd.concat(frames, ignore_index=True)


def _one_rank(policy, rank, world, wgs, bpp, tpb, tb, tm, link_par, jitter, seed) -> pd.DataFrame:
    from ..kosmos.decide import parse_policy

    rng = np.random.default_rng(seed)
    kind, k = parse_policy(policy)
    if kind == "predicted":
        k = predicted_movers(wgs, world, bpp * tpb, tb, bpp * tm, link_par)
    elif kind == "fixed":
        k = min(k, wgs - 1)
    # Band id = source rank * bpp + sub-band; peers ring-staggered (r+1, r+2, ...).
    movers = [((rank + d) % world) * bpp + s for d in range(1, world) for s in range(bpp)]
    local = [rank * bpp + s for s in range(bpp)]
    builder = [(b, t) for b in local + movers for t in range(tpb)]  # local first, band-major
    ready = {b: 0.0 for b in local}  # band -> arrival time (known once its mover item is claimed)
    moving: list[float] = []  # end times of copies in flight (link sharing)
    mi = bi = 0
    recs = []
    base = GLOBALTIMER_BASE_NS + rank * 1_237  # ranks' clocks differ a little
    heap = [(float(rng.uniform(0, 300)), w) for w in range(wgs)]  # staggered WG start
    heapq.heapify(heap)
    sm0 = (rank * 17) % 132

    def dur(x):
        return x * float(rng.uniform(1 - jitter, 1 + jitter))

    while heap:
        t, w = heapq.heappop(heap)
        can_move = k is None or w < k
        can_build = k is None or w >= k
        moving[:] = [e for e in moving if e > t]
        head = builder[bi] if bi < len(builder) else None
        if can_build and head is not None and ready.get(head[0], math.inf) <= t:
            d = dur(tb)
            recs.append((w, "BUILD", head[0] * tpb + head[1], t, t + d))
            bi += 1
            heapq.heappush(heap, (t + d, w))
        elif can_move and mi < len(movers):
            d = dur(tm) * max(1.0, (len(moving) + 1) / link_par)
            band = movers[mi]
            recs.append((w, "MOVE", band, t, t + d))
            ready[band] = t + d
            moving.append(t + d)
            mi += 1
            heapq.heappush(heap, (t + d, w))
        elif can_build and head is not None:
            until = ready.get(head[0])
            if until is None:  # its copy is not claimed yet: wait for the next event
                until = min([e for e, _ in heap if e > t] + [t + tm / 4])
            until = max(until, t + 1)
            recs.append((w, "WAIT", -1, t, until))
            heapq.heappush(heap, (until, w))
        # else: nothing left this WG may do: it exits.
    df = pd.DataFrame(recs, columns=["wg", "role", "item", "t0", "t1"])
    out = pd.DataFrame({
        "rank": np.int64(rank),
        "wg": df["wg"].astype("int64"),
        "sm": ((df["wg"] * 2 + sm0) % 132).astype("int64"),
        "role": df["role"],
        "item": df["item"].astype("int64"),
        "t0_ns": df["t0"].round().astype("int64") + base,
        "t1_ns": df["t1"].round().astype("int64") + base,
    })
    return out.sort_values(["wg", "t0_ns"]).reset_index(drop=True)


SYNTH_SHAPES = ({"M": 4096, "N": 8192, "K": 8192}, {"M": 8192, "N": 8192, "K": 8192},
                {"M": 8192, "N": 28672, "K": 8192}, {"M": 16384, "N": 8192, "K": 28672})


def synthetic_run(root: Path | str, *, world: int = 8, wgs: int = 16, shapes=SYNTH_SHAPES,
                  policies=("self", "fixed:2", "fixed:4", "predicted"),
                  ablate_queue_order: bool = True, seed: int = 0) -> Path:
    """Write a complete synthetic run directory (manifest, rows, traces) under `root`.

    Every kosmos point is traced; times come from the synthetic timelines, baselines from
    the same alpha-beta model (nccl-seq = gemm + comm, nccl-overlap = max + 1/W of the min).
    """
    from ..point import Point
    from ..store import RunStore, write_json
    from .analysis import summarize

    store = RunStore(Path(root))
    store.root.mkdir(parents=True, exist_ok=True)
    write_json(store.root / "manifest.json", {
        "time": "2026-01-01T00:00:00", "command": "synthetic_run (kosmos_bench.trace.synth)",
        "host": "synthetic", "torch": "n/a", "cuda": None, "gpus": [], "driver": None, "nccl": None,
        "git_sha": None, "git_dirty": None, "backend": "sim", "fabric": "host", "synthetic": True,
    })
    for si, shp in enumerate(shapes):
        # Item times from a plain roofline: 600 TFLOP/s per GPU, 400 GB/s link (link_par
        # copies at full rate), so comm/compute ratios differ between shapes as on hardware.
        bpp, tpb = 4, max(2, shp["N"] // 4096)
        t_gemm_ns = 2.0 * shp["M"] * (shp["N"] / world) * shp["K"] / 600e12 * 1e9
        t_comm_ns = shp["M"] * shp["K"] * 2.0 * (world - 1) / world / 400e9 * 1e9
        tb = t_gemm_ns * wgs / (world * bpp * tpb)
        tm = t_comm_ns * 4 / ((world - 1) * bpp)
        t_gemm, t_comm = t_gemm_ns / 1e3, t_comm_ns / 1e3
        base = dict(op="ag-gemm", world=world, dtype="bf16", fabric="host", backend="sim", **shp)
        rng = np.random.default_rng(seed + si)
        seq_t = (t_gemm + t_comm) * float(rng.uniform(1.0, 1.05))
        # W chunks on two streams: smaller GEMMs run less efficiently, one chunk is exposed.
        ovl_t = max(t_gemm / 0.85, t_comm) + min(t_gemm, t_comm) / world * float(rng.uniform(1.0, 1.2))
        for impl, t in (("nccl-seq", seq_t), ("nccl-overlap", ovl_t)):
            _write(store, Point(impl=impl, **base), t, t_gemm, t_comm, {})
        variants = [dict(policy=p, queue_order="demand", local_first=True, chunk=1) for p in policies]
        if ablate_queue_order and si == 1:
            variants += [dict(policy="self", queue_order=q, local_first=True, chunk=1)
                         for q in ("fifo", "reverse", "random")]
            variants += [dict(policy="self", queue_order="demand", local_first=False, chunk=1)]
        for v in variants:
            p = Point(impl="kosmos", trace=True, **base, **v)
            # Ablated orders are modelled as a mild slowdown of the builder (worse data reuse).
            slow = {"demand": 1.0, "fifo": 1.04, "reverse": 1.12, "random": 1.08}[v["queue_order"]]
            slow *= 1.0 if v["local_first"] else 1.06
            tr = synthetic_trace(v["policy"], world=world, ranks=[0, 1], wgs=wgs, bands_per_peer=bpp, tiles_per_band=tpb,
                                 t_build_ns=tb * slow, t_move_ns=tm, seed=seed + si)
            tr.insert(0, "key", p.key())
            store.write_trace(p.key(), tr)
            s = summarize(tr)
            _write(store, p, s["kernel_us"] * 1.02, t_gemm, t_comm, s)
    return store.root


def _write(store, p, t_us, t_gemm, t_comm, extra: dict) -> None:
    from ..ops import get_op

    op = get_op(p.op)
    flops, nbytes = op.flops(p), op.comm_bytes(p)
    row = p.as_row() | {
        "status": "ok", "error": None, "wrong": 0, "max_rel_err": 1e-3, "deterministic": True,
        "t_median_us": t_us, "t_min_us": t_us * 0.98, "t_p99_us": t_us * 1.05, "cv": 0.01, "reps": p.reps,
        "t_gemm_us": t_gemm, "t_comm_us": t_comm, "tflops": flops / (t_us * 1e-6) / 1e12,
        "algbw_gbs": nbytes / (t_us * 1e-6) / 1e9, "busbw_gbs": nbytes / (t_us * 1e-6) / 1e9 * op.bus_factor(p),
        "flops": flops, "comm_bytes": nbytes, "collective": op.collective, "emulated": False,
        "timestamp": "2026-01-01T00:00:00", "synthetic": True,
    } | extra
    store.write_row(row)
