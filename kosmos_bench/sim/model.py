"""From a `Point` and a hardware profile to an engine `Problem`, built from the kernels' own
schedules (`kosmos_bench.schedule`: items, queue orders, dependencies, mover count, WG->rank
assignment). Nothing here decides an order; it only prices items and wires flags.

Which ranks are simulated:

* ``host`` fabric: rank 0 only (peers do not execute; their flags are preset, their data is
  static in host memory), as in the kernel.
* ``nvlink`` with a rotation-symmetric queue order (``demand``, ``reverse``): rank 0 only.
  Every rank runs the same schedule rotated by its rank, so a flag that peer q releases into
  rank 0's array is released at the time rank 0 releases the rotated flag: the dependency is
  wired to rank 0's own rotated item (found in q's schedule by (queue, kind, peer - q, m0,
  rows, n0, cols)), with the remote flag latency. Link loads are symmetric too, so a
  switch port (or a mesh link) carries exactly rank 0's traffic.
* ``nvlink`` with ``fifo`` / ``random`` orders (not symmetric: every rank pulls from peer 0
  first) and ``local`` (W emulated ranks sharing one GPU's WGs and HBM): all W ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import schedule as S
from ..ops.base import ELEM_BYTES
from ..kosmos import builder as kb
from ..kosmos.config import KosmosConfig
from ..kosmos.plan import info as plan_info
from ..kosmos.plan import plan as make_plan
from ..kosmos.plan import row_elems
from ..point import Point
from . import engine as E

SYMMETRIC_ORDERS = ("demand", "reverse")

# The kernels' WG loops (schedule.py docstring "Queues and the WG loop", csrc/kosmos/
# persistent.cuh decide()). Policy self is the engine's named loop (pending slot, mover
# slots = schedule.max_inflight); fixed / predicted are plain rules [(queue, mode), ...].
_B, _M, _R = S.Q_BUILD, S.Q_MOVE, S.Q_REDUCE
assert (_B, _M, _R) == (0, 1, 2), "engine named loops assume builder/mover/reduce = 0/1/2"
LOOP_RULES = {
    ("ag-gemm", "self"): E.SELF_AG,
    ("ag-wgrad", "self"): E.SELF_AG,  # decide<ag-wgrad> is ag-gemm's with builders ready at once
    ("gemm-rs", "self"): E.SELF_RS,
    "mover": [(_M, E.ANY)],
    "builder": [(_B, E.ANY), (_R, E.ANY)],
    # copy-engine movers: every CTA builds under decide() with no mover: the builder head,
    # waiting for it when it is not ready
    "ce-builder": [(_B, E.ANY)],
    # gemm-rs with copy-engine movers: decide<gemm-rs> with no mover (a ready reduce, else a
    # builder, else wait for the next reduce); the two engines take the pushes (queue 1, D2H) and
    # the proxies (queue 3, H2D) in order
    "ce-rs-builder": [(_R, E.READY), (_B, E.ANY), (_R, E.ANY)],
    "ce-rs-push": [(_M, E.ANY)],
    "ce-rs-proxy": [(3, E.ANY)],
}

_ROLE_OF_KIND = {S.AG_PULL: E.MOVE, S.AG_BUILD: E.BUILD, S.RS_BUILD: E.BUILD,
                 S.RS_PUSH: E.MOVE, S.RS_PROXY: E.MOVE, S.RS_REDUCE: E.REDUCE, S.AGW_BUILD: E.BUILD,
                 S.AGW_BAND: E.BUILD}


class Unsupported(Exception):
    """This point cannot be simulated (the message says why); the harness skips it."""


@dataclass
class Built:
    """A Problem plus what run_point reports about it."""

    problem: E.Problem
    ranks: list[int]            # simulated ranks
    num_wgs: int                # WGs per rank (rank 0)
    num_movers: int | None      # k of fixed/predicted, None for self
    symmetric: bool
    overhead_ns: float          # launch + exit handshake, added to the makespan
    scheds: list
    info: dict = None           # the resolved configuration (kosmos.plan.info), result-row columns


def model_params(prof: dict, fabric: str) -> dict:
    """predicted_movers' cost-model dict from a profile (same keys as schedule.MODEL_DEFAULTS)."""
    link = prof["link"]
    if fabric == "host":
        bw = link.get("h2d_GBps") or link.get("bw_GBps")
    elif fabric == "local":
        bw = prof["hbm_GBps"] / 2.0
    else:
        bw = link.get("bw_GBps") * (7 if prof["topology"] == "mesh" else 1)
    return {
        "link_gbs": float(bw),
        "alpha_us": float(link.get("latency_ns", 1000.0)) / 1e3,
        "wg_copy_gbs": float(prof["wg_hbm_GBps"] if fabric == "local" else link.get("wg_GBps", 30.0)),
        "wg_tflops": float(prof["gemm_tflops"]["bf16"]) * float(prof.get("builder_efficiency", 1.0)) / prof["num_sms"],
        "wg_reduce_gbs": float(prof["wg_hbm_GBps"]),
    }


def resolve_builder(p: Point, prof: dict, cfg: KosmosConfig | None = None) -> str:
    """The builder the GPU runner would use on the profile's device (kosmos.builder.builder_choice):
    the configuration's, else 'sm90' for the ops of ``kosmos.builder.AUTO_OPS`` where the profile has the sm90 builder's
    figures (an sm_90 device) and the shape suits TMA and no bulk movers are asked for; the
    portable 'mma' otherwise."""
    cfg = cfg or KosmosConfig.from_point(p)
    return kb.sim_builder(cfg.builder, p.op, (p.M, p.N, p.K, p.world), bool(prof.get("builder_sm90")),
                          cfg.mover_bulk)


def _ce_copies(sch, plan: list, K: int, slices: int, BM: int, move_offset: int, work: np.ndarray,
               nbytes: np.ndarray, setup_ns: float, start_ns: float = 0.0) -> dict:
    """The runner's CE plan (ce_plan.build, same settings) as the engine sees it: a copy's bytes
    travel with the first mover item of its first band, so its bands are released together when
    the copy ends (merged copies hold early bands back), and every copy beyond the first of its
    peer costs the engine ``setup_ns`` before its bytes (measured ~2.5 us a copy, whole or 2-D:
    results/issue4-h200-20261203/probes/copy_split-*; copy alone's one copy per peer is in the
    calibrated rate). The first copy starts ``start_ns`` late (the plan's streams wait for the
    call's start on the main stream: an event hop). Edits work / nbytes in place; returns
    {(slice, (peer, M-tile)): extra copies up to and including that K-slice's copy} for the
    sliced tail (``_ce_stream``); every slice of a copy gets the copy's count. ``plan``: the
    runner's entries (kosmos.plan: ce_plan.build) before its flags are shared."""
    from .. import ce_plan
    tab = sch.movers.table
    items: dict = {}
    for i in sch.movers.queue:
        items.setdefault((int(tab[i][S.F["peer"]]), int(tab[i][S.F["m0"]]) // BM), []).append(move_offset + int(i))
    if len(sch.movers.queue):
        work[move_offset + int(sch.movers.queue[0])] += start_ns
    starts = [c0 for c0, _ in ce_plan.slice_cols(K, slices, kb.BK)]
    seen, extra, sliced = set(), 0, {}
    for e in plan:
        if not e.rows:
            continue
        beyond = e.peer in seen
        seen.add(e.peer)
        extra += beyond
        bands = [(e.peer, mt) for mt in range(e.row0 // BM, S.cdiv(e.row0 + e.rows, BM))]
        if e.cols < K:  # a K-slice of the last group: _ce_stream times it
            s0 = starts.index(e.col0)
            s1 = starts.index(e.col0 + e.cols) if e.col0 + e.cols < K else slices
            sliced.update({(s, b): extra for s in range(s0, s1) for b in bands})
            continue
        its = [it for b in bands for it in items.get(b, [])]
        if its:
            total = float(nbytes[its].sum())
            nbytes[its] = 0.0
            nbytes[its[0]] = total
            work[its[0]] += setup_ns * beyond
    return sliced


def _rs_ce_copies(sch, rs, BM: int, move_offset: int, work: np.ndarray, nbytes: np.ndarray, setup_ns: float,
                  start_ns: float) -> None:
    """gemm-rs copy-engine movers (ce_plan.build_rs) as the engine sees them: the push items
    (per tile) of one push copy move the copy's bytes with the last of them in queue order (the
    engine takes the pushes in order, so it has waited for every tile of the copy: the stream
    wait on the builder counter); a proxy copy's bytes travel with its peer's first proxy item
    (the later ones release right after it: one release per copy). Every copy beyond one per
    direction costs ``setup_ns``; the first of each direction starts ``start_ns`` late."""
    tab = sch.movers.table
    push_of, proxy_of = {}, {}
    pos = {move_offset + int(i): n for n, i in enumerate(sch.movers.queue)}
    for i in sch.movers.queue:
        k, d, mt = int(tab[i][S.F["kind"]]), int(tab[i][S.F["peer"]]), int(tab[i][S.F["m0"]]) // BM
        (push_of if k == S.RS_PUSH else proxy_of).setdefault((d, mt), []).append(move_offset + int(i))
    lay, mt_n, nt_n = sch.flags, sch.meta["m_tiles"], sch.meta["n_tiles"]
    tiles_of: dict = {}  # counter -> the (destination, M-tile) rows of its copy
    for f, c in rs.built_alias.items():
        d, rest = divmod(f - lay.built, mt_n * nt_n)
        tiles_of.setdefault(c, set()).add((d, rest // nt_n))
    for n, e in enumerate(rs.pushes):
        its = [it for key in sorted(tiles_of[e.wait]) for it in push_of.get(key, [])]
        if its:
            total = float(nbytes[its].sum())
            nbytes[its] = 0.0
            last = max(its, key=pos.__getitem__)
            nbytes[last] = total
            work[last] += setup_ns if n else start_ns
    for n, e in enumerate(rs.proxies):
        its = [it for (s, _), v in proxy_of.items() if s == e.peer for it in v]
        if its:
            total = float(nbytes[its].sum())
            nbytes[its] = 0.0
            first = min(its, key=pos.__getitem__)
            nbytes[first] = total
            work[first] += setup_ns if n else start_ns


def _ce_stream(sch, slices: int, BM: int, rate: float, elem_scale: float, setup_ns: float = 0.0,
               extra: dict | None = None, start_ns: float = 0.0, split: tuple = ()) -> tuple[dict, list[int]]:
    """The copy engine's K-sliced tail (impls/kosmos.py's defaults, ce_plan.build): the bands of
    the last remote group arrive slice-major after every other band. One engine that never
    waits: slice s of band b arrives ``start_ns`` + the time the bytes before it take at ``rate``
    (bytes/ns) + ``setup_ns`` for each extra copy up to its own (``extra``, from ``_ce_copies``);
    with ``split`` (slices per copy, e.g. (6, 4, 2, 1)) a slice arrives with the last slice of
    its copy. Returns ({(peer, M-tile): [arrival ns of each slice]}, the group's mover rows)."""
    tab, queue = sch.movers.table, sch.movers.queue
    group = [(int(p), int(m)) for p, m in (sch.meta.get("remote_groups") or [[]])[-1]]
    in_group = set(group)

    def key(i):
        return int(tab[i][S.F["peer"]]), int(tab[i][S.F["m0"]]) // BM

    nbytes: dict = {}
    before = 0.0
    for i in queue:
        b = float(sch.movers.bytes[i]) * elem_scale
        if key(i) in in_group:
            nbytes[key(i)] = nbytes.get(key(i), 0.0) + b
        else:
            before += b
    total = sum(nbytes.values())
    parts = split or (1,) * slices
    bounds = np.cumsum((0,) + tuple(parts))  # copy j holds slices [bounds[j], bounds[j+1])
    arrive, prefix = {}, 0.0
    for k in group:
        prefix += nbytes.get(k, 0.0)
        arrive[k] = []
        for j, n_sl in enumerate(parts):
            t = start_ns + (before + (bounds[j] * total + n_sl * prefix) / slices) / rate
            arrive[k] += [t + setup_ns * (extra or {}).get((s, k), 0) for s in range(bounds[j], bounds[j + 1])]
    return arrive, [int(i) for i in queue if key(i) in in_group]


def _tables(s):
    return s.builders, s.movers, s.reduces


def build(p: Point, prof: dict, num_movers: int | None = None, full: bool | None = None,
          model_from_profile: bool = False) -> Built:
    """The engine problem of a kosmos point. `num_movers` overrides the policy's k (e.g. the
    k a measured run reported); `full` forces (True) or forbids (False) simulating all ranks.
    `predicted` uses the kernel's own cost model (schedule.MODEL_DEFAULTS, as impls/kosmos.py
    does) unless `model_from_profile`, which feeds it this profile's figures instead.
    ``builder='sm90'`` prices tiles with the profile's ``builder_sm90`` figures (tile, rate);
    ``mover`` unset (auto): ``kosmos.builder.mover_choice``, as the runner resolves it.
    SM movers of the sm90 builder drive ``builder.mover_share`` (half) of the profile's
    per-WG link rate (the loader warpgroup's 128 threads, as the schedule model has it).
    ``mover='ce'`` (host ag-gemm and ag-wgrad, policy self): every WG builds and one extra agent, the
    copy engine (sm -1 in the timeline), moves the bands one after another in demand order at
    ``copy_engine_GBps.h2d``. With the sm90 builder the runner's defaults apply (impls/kosmos.py:
    regime, K-slices of the last group, 1-band groups when copy-bound): the last group's tiles
    start on slice 0 and end no earlier than each later slice's arrival plus the work after it
    (``_ce_stream``; the engine still moves those bands whole, same bytes in the same order).
    The plan's copies as the runner cuts them (``_ce_copies``: merged / halved copies release
    their bands together; each copy beyond one per peer costs ``copy_engine_setup_ns``)."""
    if p.fabric not in ("host", "nvlink", "local"):
        raise Unsupported(f"the kosmos kernels do not run on the {p.fabric} fabric")
    if p.dtype != "bf16":
        raise Unsupported(f"kosmos kernels are bf16 only (dtype={p.dtype})")
    W = p.world
    try:
        cfg = KosmosConfig.from_point(p)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    if cfg.mover == "ce" and (p.fabric != "host" or cfg.policy != "self"):
        raise Unsupported("mover ce is the host fabric with policy self only")
    builder = resolve_builder(p, prof, cfg)
    if p.op == "ag-wgrad" and builder != "sm90":
        raise Unsupported(f"kosmos ag-wgrad: the sm90 builder only (builder {builder}; profile {prof['name']})")
    if p.op == "ag-wgrad" and cfg.wgrad_group and cfg.wgrad_items != "band":
        raise Unsupported(f"wgrad_group={cfg.wgrad_group}: groups are wgrad_items=band's (items {cfg.wgrad_items})")
    if cfg.mover == "ce" and p.op == "gemm-rs" and builder != "sm90":
        raise Unsupported("mover ce: gemm-rs copy-engine movers need the sm90 builder")
    sm90 = builder == "sm90"
    cfg = cfg.replace(mover=kb.mover_choice(cfg.mover, p.op, p.fabric, builder, policy=cfg.policy, world=p.world))  # auto
    ce = cfg.mover == "ce"
    if sm90:
        b = prof.get("builder_sm90")
        if not b:
            raise Unsupported(f"builder sm90: a profile with builder_sm90 figures ({prof['name']} has none)")
        # ag-wgrad runs the A-transposed build (kosmos_ag_sm90_at), priced at its own rate where measured
        eff = b.get("wgrad_efficiency", b["efficiency"]) if p.op == "ag-wgrad" else b["efficiency"]
        prof = {**prof, "tile_m": b["tile_m"], "tile_n": b["tile_n"], "builder_efficiency": eff}
    BM, BN = int(prof["tile_m"]), int(prof["tile_n"])
    chunk = cfg.chunk
    order = cfg.queue_order
    policy = cfg.policy
    why = S.validate(p.op, p.M, p.N, p.K, W, BM, BN, chunk)
    if why:
        raise Unsupported(why)
    G = int(prof["num_sms"])
    if p.fabric == "local":
        sizes = np.diff(S.wg_starts(G, W)).tolist()
        starts = S.wg_starts(G, W).tolist()
    else:
        sizes, starts = [G] * W, [0] * W
    if num_movers is None:
        if model_from_profile:
            model = model_params(prof, p.fabric)
        else:  # the runner's: the sm90 builder's schedule model (its CTA rate), else MODEL_DEFAULTS
            model = kb.schedule_model(p.fabric) if sm90 else None
        try:
            num_movers = S.resolve_movers(policy, p.op, p.M, p.N, p.K, W, sizes[0], model, p.fabric)
        except ValueError as e:
            raise Unsupported(str(e)) from None
    if num_movers is not None and not 0 < num_movers < min(sizes):
        raise Unsupported(f"{num_movers} movers leave no builder among {min(sizes)} WGs per rank")

    symmetric = p.fabric == "nvlink" and order in SYMMETRIC_ORDERS and W > 1
    if full is not None and p.fabric != "host":
        symmetric = not full
    if p.fabric == "host" or W == 1:
        ranks = [0]
    elif symmetric:
        ranks = [0]
    else:
        ranks = list(range(W))
    sched_fabric = "host" if p.fabric == "host" else p.fabric

    # the runner's plan (kosmos.plan): schedules built with policy 'self' (the mover count only
    # changes the WG rules, never the queues), the resolved settings, the copy-engine plan
    try:
        pl = make_plan(p, cfg, {r: sizes[r] for r in ranks}, builder=builder, fabric=sched_fabric, BM=BM, BN=BN,
                       policy="self", cached=True)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    stream_k = pl.resolved.k_stream
    ce_slices = pl.ce_slices

    def sched(r):
        return pl.schedule(r, sizes[r])

    scheds = {r: sched(r) for r in ranks}
    elem_scale = ELEM_BYTES[p.dtype] / S.ELEM_BYTES

    # ---- items: global id = offset[(rank, table)] + row
    offset, n = {}, 0
    for r in ranks:
        for qi, t in enumerate(_tables(scheds[r])):
            offset[r, qi] = n
            n += len(t)
    kind = np.zeros(n, dtype=np.int8)
    rank = np.zeros(n, dtype=np.int32)
    work = np.zeros(n)
    nbytes = np.zeros(n)
    label = np.zeros(n, dtype=np.int64)
    path: list = [()] * n
    lat = prof["link"].get("latency_ns", 0.0)
    tflops = float(prof["gemm_tflops"][p.dtype]) * float(prof.get("builder_efficiency", 1.0))
    per_sm_flop_ns = tflops * 1e12 / G / 1e9  # FLOP per ns of one SM
    tile_ovh = float(prof.get("tile_overhead_ns", 0.0))
    wg_hbm = float(prof["wg_hbm_GBps"])  # bytes/ns
    # ag-wgrad band items' fp32 carry: every CTA carries at once (a group's tiles run together),
    # at the share of the HBM rate a profile measured for it (carry_hbm_efficiency)
    carry_hbm = min(wg_hbm, float(prof.get("hbm_GBps", np.inf)) * float(prof.get("carry_hbm_efficiency", 1.0)) / G)
    links, cap = _links(p, prof, ranks, symmetric)
    cap *= kb.mover_share(builder)  # an sm90 mover is the loader warpgroup: half a WG's bytes in flight
    rs_ce = ce and p.op == "gemm-rs"
    if rs_ce:  # two DMA engines, one per PCIe direction: pushes D2H, proxies H2D (and their total, if capped)
        eng = prof["copy_engine_GBps"]
        rates = [float(eng["h2d"]), float(eng.get("d2h") or eng["h2d"])]
        both = ()
        if eng.get("duplex"):
            rates, both = rates + [float(eng["duplex"])], (2,)
        links, cap = _LinkMap(rates, lambda r, kind, peer: ((1,) if kind == S.RS_PUSH else (0,)) + both), math.inf
    elif ce:  # one DMA engine: no per-WG drive limit, no many-reader collapse
        links, cap = _LinkMap([float(prof["copy_engine_GBps"]["h2d"])], lambda r, kind, peer: (0,)), math.inf
    for r in ranks:
        for qi, t in enumerate(_tables(scheds[r])):
            if not len(t):
                continue
            o = offset[r, qi]
            sl = slice(o, o + len(t))
            kinds = t.col("kind")
            kind[sl] = np.vectorize(_ROLE_OF_KIND.get, otypes=[np.int8])(kinds)
            rank[sl] = r
            label[sl] = np.arange(len(t))
            if qi == S.Q_BUILD:
                rows, cols = t.col("rows").astype(float), t.col("cols").astype(float)
                k = t.flops / (2.0 * rows * cols)
                # a partial edge tile costs a full tile on the tensor cores
                work[sl] = 2.0 * BM * BN * k / per_sm_flop_ns + tile_ovh
                # ag-wgrad band items: the fp32 carry's load + store (bytes past the operands'), unhidden
                carry = np.where(kinds == S.AGW_BAND, t.bytes - S.ELEM_BYTES * k * (rows + cols), 0.0)
                work[sl] += carry * elem_scale / carry_hbm
            elif qi == S.Q_REDUCE:
                work[sl] = t.bytes * elem_scale / wg_hbm + tile_ovh
            else:
                work[sl] = 0.0 if ce else lat  # the engine streams copy after copy, no per-item setup
                nbytes[sl] = t.bytes * elem_scale
                peers = t.col("peer")
                for i in range(len(t)):
                    path[o + i] = links(r, int(kinds[i]), int(peers[i]))

    setup_ns = float(prof.get("copy_engine_setup_ns", 0.0))
    start_ns = float(prof.get("copy_engine_start_ns", 0.0))
    if rs_ce:
        _rs_ce_copies(scheds[ranks[0]], pl.rs_ce, BM, offset[ranks[0], S.Q_MOVE], work, nbytes, setup_ns, start_ns)
    sliced_extra = _ce_copies(scheds[ranks[0]], pl.ce_entries, row_elems(p.op, p.M, p.K), ce_slices, BM,
                              offset[ranks[0], S.Q_MOVE], work, nbytes, setup_ns, start_ns) if ce and not rs_ce else {}

    # ---- dependencies: every dependency flag -> all items that release it
    remote_lat = float(prof["flag_latency_ns"]["remote"])
    local_lat = float(prof["flag_latency_ns"]["local"])
    entry_floor = 0.0 if p.fabric == "host" else remote_lat
    floor = np.zeros(n)
    # releasers: (target rank, flag, item, releasing rank) of every simulated item
    rel_parts = []
    for r in ranks:
        for qi, t in enumerate(_tables(scheds[r])):
            if len(t):
                rf = t.col("rel_flag")
                on = np.flatnonzero(rf >= 0)
                rel_parts.append((t.col("rel_rank")[on], rf[on], offset[r, qi] + on, np.full(on.size, r)))
    cons, srcs, lats, cflags = [], [], [], []
    for r in ranks:
        s = scheds[r]
        lay = s.flags
        parts = [(f[tr == r], i[tr == r], rr[tr == r]) for tr, f, i, rr in rel_parts]
        if symmetric and W > 1:
            peer = _peer_releases(r, sched, offset, W)
            parts.append((np.asarray(peer[0], dtype=np.int64), np.asarray(peer[1], dtype=np.int64),
                          np.asarray(peer[2], dtype=np.int64)))
        rflag = np.concatenate([x[0] for x in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
        ritem = np.concatenate([x[1] for x in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
        rrank = np.concatenate([x[2] for x in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
        order = np.argsort(rflag, kind="stable")
        rflag, ritem, rrank = rflag[order], ritem[order], rrank[order]
        fcount = np.bincount(rflag, minlength=lay.num_flags)
        fstart = np.cumsum(fcount) - fcount
        for qi, t in enumerate(_tables(s)):
            if not len(t):
                continue
            db, dc = t.col("dep_begin").astype(np.int64), t.col("dep_count").astype(np.int64)
            tot = int(dc.sum())
            if not tot:
                continue
            item = np.repeat(offset[r, qi] + np.arange(len(t)), dc)
            flag = s.deps[np.repeat(db, dc) + np.arange(tot) - np.repeat(np.cumsum(dc) - dc, dc)].astype(np.int64)
            hand = ((flag >= lay.entry) & (flag < lay.entry + W)) | ((flag >= lay.exit) & (flag < lay.exit + W))
            np.maximum.at(floor, item[hand], entry_floor)
            item, flag = item[~hand], flag[~hand]
            cnt = fcount[flag]
            missing = cnt == 0
            if missing.any():
                if p.fabric != "host":  # on the host fabric peers' flags are preset
                    raise RuntimeError(f"rank {r}: flag {int(flag[missing][0])} has no releasing item")
                item, flag, cnt = item[~missing], flag[~missing], cnt[~missing]
            bad = cnt != s.flag_mult[flag]
            if bad.any():
                f = int(flag[bad][0])
                raise RuntimeError(f"rank {r}: flag {f} has {int(fcount[f])} releasers, flag_mult says {s.flag_mult[f]}")
            k = np.repeat(fstart[flag], cnt) + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            cons.append(np.repeat(item, cnt))
            cflags.append(np.repeat(flag, cnt))
            srcs.append(ritem[k])
            lats.append(np.where(rrank[k] == r, local_lat, remote_lat))
    cons_a = np.concatenate(cons) if cons else np.zeros(0, np.int64)
    src_a = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    lat_a = np.concatenate(lats) if lats else np.zeros(0)
    stream = None
    if S.wgrad_tiles(scheds[ranks[0]]):  # tiles wait for their bands inside, in K order: stream dependencies
        stream, keep = _wgrad_stream(scheds, ranks, offset, rank, work, cons_a, src_a, lat_a,
                                     np.concatenate(cflags) if cflags else np.zeros(0, np.int64), n)
        cons_a, src_a, lat_a = cons_a[keep], src_a[keep], lat_a[keep]
    end_floor = None
    if stream_k:  # the last group's tiles start on slice 0 and end after their last slice's work
        r0 = ranks[0]
        arrive, rows = _ce_stream(scheds[r0], ce_slices, BM, float(prof["copy_engine_GBps"]["h2d"]), elem_scale,
                                  setup_ns, sliced_extra, start_ns, pl.resolved.split if stream_k else ())
        moved = offset[r0, S.Q_MOVE] + np.asarray(rows, dtype=np.int64)
        bt = scheds[r0].builders
        end_floor = np.zeros(n)
        streamed = []
        for i, (peer, m0) in enumerate(zip(bt.col("peer").tolist(), bt.col("m0").tolist())):
            a = arrive.get((int(peer), int(m0) // BM))
            if a is None:
                continue
            it = offset[r0, S.Q_BUILD] + i
            streamed.append(it)
            floor[it] = max(floor[it], a[0] + local_lat)
            end_floor[it] = max(a[s] + local_lat + work[it] * (ce_slices - s) / ce_slices for s in range(ce_slices))
        keep = ~(np.isin(cons_a, streamed) & np.isin(src_a, moved))
        cons_a, src_a, lat_a = cons_a[keep], src_a[keep], lat_a[keep]
    order = np.argsort(cons_a, kind="stable")
    dep_idx = src_a[order]
    dep_lat = lat_a[order]
    dep_ptr = np.zeros(n + 1, dtype=np.int64)
    dep_ptr[1:] = np.cumsum(np.bincount(cons_a, minlength=n))

    # ---- queues and WG rules
    queues, wg_rules, sm = [], [], []
    if rs_ce:
        rule_sets = [LOOP_RULES["ce-rs-builder"], LOOP_RULES["ce-rs-push"], LOOP_RULES["ce-rs-proxy"]]
    elif num_movers is None and not ce:
        rule_sets = [LOOP_RULES[p.op, "self"]]
    else:
        rule_sets = [LOOP_RULES["mover"], LOOP_RULES["ce-builder" if ce else "builder"]]
    for r in ranks:
        queues.append([E.Queue(name, np.asarray(t.queue, dtype=np.int64) + offset[r, qi])
                       for qi, (name, t) in enumerate(zip(("builder", "mover", "reduce"), _tables(scheds[r])))])
        g = sizes[r]
        if rs_ce:  # G CTAs (build, reduce), then the push engine (D2H) and the proxy engine (H2D)
            mv = scheds[r].movers
            kinds = mv.table[np.asarray(mv.queue, dtype=np.int64), S.F["kind"]]
            ids = np.asarray(mv.queue, dtype=np.int64) + offset[r, S.Q_MOVE]
            queues[-1][S.Q_MOVE] = E.Queue("push", ids[kinds == S.RS_PUSH])
            queues[-1].append(E.Queue("proxy", ids[kinds == S.RS_PROXY]))
            wg_rules.append(np.concatenate([np.zeros(g, dtype=np.int64), [1, 2]]))
            sm.append(np.concatenate([np.arange(g) + starts[r], [-1, -1]]))
            continue
        if ce:  # G builders, then the copy engine
            wg_rules.append(np.append(np.ones(g, dtype=np.int64), 0))
            sm.append(np.append(np.arange(g) + starts[r], -1))
            continue
        wr = np.zeros(g, dtype=np.int64)
        if num_movers is not None:
            wr[num_movers:] = 1
        wg_rules.append(wr)
        sm.append(np.arange(g) + starts[r])
    caps = [int(getattr(scheds[r], "max_inflight", 0) or 0) if num_movers is None and not ce else 0 for r in ranks]
    prob = E.Problem(kind=kind, rank=rank, work_ns=work, nbytes=nbytes, path=path, dep_ptr=dep_ptr,
                     dep_idx=dep_idx, dep_lat_ns=dep_lat, label=label, queues=queues, rule_sets=rule_sets,
                     wg_rules=wg_rules, link_bw=links.bw, floor_ns=floor, flow_cap=cap,
                     claim_ns=float(prof.get("claim_ns", 0.0)), sm=sm, inflight_cap=caps,
                     collapse=None if ce else _collapse(prof, p.fabric, len(links.bw)), end_floor_ns=end_floor,
                     **(stream or {}))
    overhead = prof["launch_overhead_us"] * 1e3 + (remote_lat if p.fabric != "host" and W > 1 else 0.0)
    info = plan_info(pl, scheds[ranks[0]])
    info["max_inflight_movers"] = caps[0]  # the schedules are built with policy self; fixed / ce run uncapped
    return Built(prob, ranks, sizes[0], num_movers, symmetric, overhead, [scheds[r] for r in ranks], info)


def _wgrad_stream(scheds, ranks, offset, rank, work, cons_a, src_a, lat_a, flag_a, n):
    """ag-wgrad: its builders' deps (the remote band flags, schedule.py) as the engine's stream
    dependencies: a tile starts at once (own rows first) and, per band, cannot end before that
    band's arrival + the flag latency + the tile's work from that band's first k-block on (its
    share of K after the band's offset in the tile's order: own rows, then r+1's, r+2's, ...).
    Returns the Problem's end_dep_* fields and the mask of the plain dependencies to keep."""
    is_b = np.zeros(n, dtype=bool)
    for r in ranks:
        o = offset[r, S.Q_BUILD]
        is_b[o:o + len(scheds[r].builders)] = True
    e = is_b[cons_a] if len(cons_a) else np.zeros(0, dtype=bool)
    c, f = cons_a[e], flag_a[e]
    tail = np.zeros(len(c))
    for r in ranks:
        sch = scheds[r]
        W, K = sch.world, sch.K
        nb, rows, k_loc = sch.meta["num_bands"], sch.meta["band_rows"], sch.meta["k_loc"]
        on = rank[c] == r
        b = f[on] - sch.flags.band
        seg = (b // nb - r) % W  # the peer's segment in the tile's K order
        k0 = seg * k_loc + (b % nb) * rows
        tail[on] = work[c[on]] * (K - k0) / K
    order = np.argsort(c, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(c, minlength=n))
    return dict(end_dep_ptr=ptr, end_dep_idx=src_a[e][order], end_dep_lat_ns=lat_a[e][order],
                end_dep_tail_ns=tail[order]), ~e


def _peer_releases(r, sched, offset, W):
    """Symmetric mode: (flags, items, peers): each flag of rank r that a peer releases, the
    rank-r item standing for the releasing peer item, and that peer. Peer q's item maps to
    r's item with the same (queue, kind, peer - rank, m0, rows, n0, cols): the schedules
    are rotations of each other."""
    def key(qi, row, rank):
        return (qi, row[S.F["kind"]], (row[S.F["peer"]] - rank) % W, row[S.F["m0"]], row[S.F["rows"]],
                row[S.F["n0"]], row[S.F["cols"]])

    own = {}
    for qi, t in enumerate(_tables(sched(r))):
        for i, row in enumerate(t.table.tolist()):
            own[key(qi, row, r)] = offset[r, qi] + i
    flags, items, peers = [], [], []
    for q in range(1, W):
        src = (r + q) % W
        for qi, t in enumerate(_tables(sched(src))):
            if not len(t):
                continue
            hit = np.flatnonzero(t.col("rel_rank") == r)
            for row in t.table[hit].tolist():
                item = own.get(key(qi, row, src))
                if item is None:
                    raise RuntimeError(f"schedule of rank {src} is not a rotation of rank {r}'s")
                flags.append(row[S.F["rel_flag"]])
                items.append(item)
                peers.append(src)
    return flags, items, peers


def _collapse(prof: dict, fabric: str, num_links: int):
    """(n0 per link, gamma) of the profile's link collapse (link.collapse = {flows,
    exponent}), or None. On the host fabric it applies per direction, not to the duplex total."""
    c = prof["link"].get("collapse") if fabric != "local" else None
    if not c or not c.get("flows") or not c.get("exponent"):
        return None
    n0 = np.full(num_links, float(c["flows"]))
    if fabric == "host" and num_links == 3:
        n0[2] = np.inf  # the duplex total
    return n0, float(c["exponent"])


class _LinkMap:
    """Link ids and capacities (bytes/ns) for a fabric/topology; callable -> path."""

    def __init__(self, bw, fn):
        self.bw = np.asarray(bw, dtype=float)
        self.fn = fn

    def __call__(self, r, kind, peer):
        return self.fn(r, kind, peer)


def _links(p: Point, prof: dict, ranks: list[int], symmetric: bool):
    W = p.world
    link = prof["link"]
    topo = prof["topology"]
    if p.fabric == "local":  # every copy is an HBM read + write on the one GPU
        bw = [prof["hbm_GBps"] / 2.0]
        return _LinkMap(bw, lambda r, kind, peer: (0,)), float(prof["wg_hbm_GBps"])
    # what one mover WG drives: contiguous bands (ag-gemm) or strided 128-col tiles (gemm-rs)
    cap = float((link.get("wg_tile_GBps") if p.op == "gemm-rs" else None) or link.get("wg_GBps") or math.inf)
    if p.fabric == "host":
        h2d = link.get("h2d_GBps") or link.get("bw_GBps")
        d2h = link.get("d2h_GBps") or h2d
        duplex = link.get("duplex_GBps")
        if duplex:  # both directions at once share a total (SM-driven PCIe traffic)
            return _LinkMap([h2d, d2h, duplex], lambda r, kind, peer: (1, 2) if kind == S.RS_PUSH else (0, 2)), cap
        return _LinkMap([h2d, d2h], lambda r, kind, peer: (1,) if kind == S.RS_PUSH else (0,)), cap
    if topo == "host":
        raise Unsupported(f"profile {prof['name']} describes the host fabric, not {p.fabric}")
    bwl = float(link["bw_GBps"])
    pull = lambda kind: kind in (S.AG_PULL, S.RS_PROXY)  # noqa: E731 - data flows peer -> r
    if topo == "switch":
        if symmetric:  # rank 0's ingress port (pulls) and egress port (pushes)
            return _LinkMap([bwl, bwl], lambda r, kind, peer: (0,) if pull(kind) else (1,)), cap
        # ingress of rank x = x, egress of rank x = W + x
        return _LinkMap([bwl] * (2 * W), lambda r, kind, peer: (W + peer, r) if pull(kind) else (W + r, peer)), cap
    # mesh: one link per ordered pair src -> dst, id src * W + dst
    return _LinkMap([bwl] * (W * W), lambda r, kind, peer: (peer * W + r,) if pull(kind) else (r * W + peer,)), cap
