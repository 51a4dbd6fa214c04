"""One planning function from (point, configuration, per-rank WG counts) to what a call
executes: the per-rank schedules (``schedule.build_schedule``, whose keyword set is assembled
here and nowhere else) and, with copy-engine movers, the copy plan (``ce_plan.build`` +
``ce_plan.share_flags``), with the resolved settings (``config.resolve``; the mover from
``builder.mover_choice``: ``Plan.config.mover`` is 'sm' or 'ce', never auto). The GPU runner
(``impls/kosmos.py``) and the simulator (``sim/model.py``) both call :func:`plan`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .. import ce_plan
from .. import schedule as S
from . import builder as B
from .config import KosmosConfig, Resolved, resolve


@dataclass
class Plan:
    """What one point executes. ``scheds``: {rank: RankSchedule} of the ranks asked for;
    ``schedule(rank, num_wgs)`` builds (or fetches) any other rank's with the same keywords.
    Copy-engine movers: ``ce_entries`` / ``ce_flag_mult`` (ce_plan.build of the first rank's
    schedule), ``ce_shared`` / ``ce_alias`` (after ce_plan.share_flags: one release per copy);
    gemm-rs: ``rs_ce`` (ce_plan.build_rs)."""

    config: KosmosConfig
    resolved: Resolved
    builder: str
    kwargs: dict
    op: str
    shape: tuple[int, int, int, int]
    scheds: dict = field(default_factory=dict)
    ce_entries: list | None = None
    ce_flag_mult: dict = field(default_factory=dict)
    ce_shared: list | None = None
    ce_alias: dict = field(default_factory=dict)
    rs_ce: ce_plan.RsPlan | None = None  # gemm-rs copy-engine plan (ce_plan.build_rs)
    cached: bool = True

    def schedule(self, rank: int, num_wgs: int) -> S.RankSchedule:
        M, N, K, W = self.shape
        if self.cached:
            return _schedule(self.op, M, N, K, W, rank, num_wgs, tuple(sorted(self.kwargs.items())))
        return S.build_schedule(self.op, M, N, K, W, rank, num_wgs=num_wgs, **self.kwargs)

    @property
    def ce_slices(self) -> int:
        """K-slices of the copy plan's last group (1: whole bands)."""
        return self.resolved.slices if self.resolved.k_stream else 1


def row_elems(op: str, M: int, K: int) -> int:
    """Elements per row of the gathered operand: A (M x K) of ag-gemm, At (K x M) of ag-wgrad."""
    return M if op == "ag-wgrad" else K


@lru_cache(maxsize=64)
def _schedule(op, M, N, K, W, rank, num_wgs, kw_items):
    kw = {k: (dict(v) if k == "model" and v is not None else v) for k, v in kw_items}
    return S.build_schedule(op, M, N, K, W, rank, num_wgs=num_wgs, **kw)


def plan(point, cfg: KosmosConfig, sizes: dict[int, int], *, builder: str, fabric: str | None = None,
         BM: int = 128, BN: int | None = None, policy: str | None = None, cached: bool = False) -> Plan:
    """The plan of ``point`` under ``cfg`` for the ranks in ``sizes`` ({rank: WGs of that
    rank}). ``builder``: the resolved builder ('sm90' | 'mma'; ``builder.builder_choice``);
    ``fabric``: the schedule's fabric (default the point's); ``BM`` / ``BN``: the builder tile
    (default 128 x (256 for sm90, else 128)); ``policy``: the schedule's policy instead of the
    configuration's (the simulator builds its queues with 'self'); ``cached``: share schedules
    between calls (read-only users)."""
    op, M, N, K, W = point.op, point.M, point.N, point.K, point.world
    fabric = fabric or point.fabric
    sm90 = builder == "sm90"
    BN = BN or (B.BN if sm90 else 128)
    cfg = cfg.replace(mover=B.mover_choice(cfg.mover, op, fabric, builder, cfg.policy, W))  # auto -> sm | ce
    ce = cfg.mover == "ce"
    res = resolve(cfg, N // W, int(min(sizes.values())), ce and sm90 and op == "ag-gemm", fabric == "host")
    model = B.schedule_model(fabric) if sm90 else None
    kw = dict(BM=BM, BN=BN, chunk=cfg.chunk, policy=policy or cfg.policy, queue_order=cfg.queue_order,
              seed=point.seed, local_first=cfg.local_first, fabric=fabric,
              model=tuple(sorted(model.items())) if (cached and model) else model,
              stream_k=res.k_stream, band_group=res.band_group, tail_bands=res.tail_bands, ramp=res.ramp,
              halve=res.halve, local_group=res.local_group or None, max_inflight=cfg.max_inflight,
              wgrad_items=cfg.wgrad_items, wgrad_group=cfg.wgrad_group or None)
    pl = Plan(cfg, res, builder, kw, op, (M, N, K, W), cached=cached)
    pl.scheds = {r: pl.schedule(r, n) for r, n in sizes.items()}
    if ce and op in S.AG_OPS:  # ag-wgrad: the same plan over At's rows (M columns each), whole bands
        sch = pl.scheds[next(iter(sizes))]
        pl.ce_entries, pl.ce_flag_mult = ce_plan.build(sch, row_elems(op, M, K), pl.ce_slices, bk=B.BK,
                                                       split=res.split if res.k_stream else None, merge=res.merge)
        pl.ce_shared, pl.ce_alias = ce_plan.share_flags(pl.ce_entries)
    if ce and op == "gemm-rs":
        pl.rs_ce = ce_plan.build_rs(pl.scheds[next(iter(sizes))])
    return pl


def ce_rank_arrays(pl: Plan, arrs: dict) -> dict:
    """The schedule arrays (``RankSchedule.arrays()``) the kernel reads with AG copy-engine movers
    (ag-gemm, ag-wgrad): the band flags' multiplicities of the copy plan (``ce_flag_mult``) and the
    deps pointed at the flag each copy releases (``ce_alias``: one release per copy). Unchanged
    without a copy plan."""
    if pl.ce_entries is None:
        return arrs
    out = dict(arrs)
    out["flag_mult"] = arrs["flag_mult"].copy()
    for f, m in pl.ce_flag_mult.items():
        out["flag_mult"][f] = m
    if pl.ce_alias:
        out["deps"] = np.array([pl.ce_alias.get(int(f), int(f)) for f in arrs["deps"]], dtype=np.int32)
    return out


def info(pl: Plan, sched=None) -> dict:
    """The resolved configuration as result-row columns (the GPU runner and the simulator)."""
    cfg, res = pl.config, pl.resolved
    ce = cfg.mover == "ce"
    sch = sched if sched is not None else next(iter(pl.scheds.values()))
    bg = res.band_group
    return {"ce_slices": res.slices if res.k_stream else (1 if ce else 0),
            "ce_split": ",".join(map(str, res.split)) if res.k_stream else "",
            "ce_tail_bands": (res.tail_bands or 0) if res.k_stream else 0,
            "ce_merge": res.merge if ce else False, "ce_regime": res.regime,
            "band_group": -1 if bg == S.PEER_GROUPS else int(bg or 0),
            "band_ramp": int(sch.meta.get("ramp", False)), "band_halve": int(res.halve),
            "local_group": int(res.local_group), "max_inflight_movers": int(sch.max_inflight),
            "ahead_blocks": cfg.ahead_blocks if pl.builder == "sm90" else None, "spin_ns": cfg.spin_ns,
            "mover_bulk": cfg.mover_bulk, "mover": cfg.mover}
