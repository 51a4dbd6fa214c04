"""Simulator engine on hand-built item sets: conservation, closed forms, link sharing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kosmos_bench.sim import engine as E

SELF_AG = [(0, True), (1, False), (0, False)]  # builder if ready > mover > wait on builder


def make(builds, moves, deps, *, wgs=4, rules=None, wg_rules=None, bw=(10.0,), cap=math.inf, lat=0.0,
         claim=0.0, ranks=None, queues=None, floor=None):
    """builds: list of durations; moves: list of (bytes, path). Items: builds first, then moves."""
    nb, nm = len(builds), len(moves)
    n = nb + nm
    kind = np.array([E.BUILD] * nb + [E.MOVE] * nm, dtype=np.int8)
    rank = np.zeros(n, dtype=np.int32) if ranks is None else np.asarray(ranks, dtype=np.int32)
    work = np.array(list(builds) + [lat] * nm, dtype=float)
    nbytes = np.array([0.0] * nb + [b for b, _ in moves])
    path = [()] * nb + [tuple(p) for _, p in moves]
    ptr, idx = E.csr(deps)
    R = int(rank.max()) + 1 if n else 1
    if queues is None:
        queues = [[E.Queue("builder", np.flatnonzero((rank == r) & (kind == E.BUILD))),
                   E.Queue("mover", np.flatnonzero((rank == r) & (kind == E.MOVE)))] for r in range(R)]
    return E.Problem(kind=kind, rank=rank, work_ns=work, nbytes=nbytes, path=path, dep_ptr=ptr, dep_idx=idx,
                     dep_lat_ns=np.zeros(len(idx)), label=np.arange(n), queues=queues,
                     rule_sets=rules or [SELF_AG], wg_rules=wg_rules or [np.zeros(wgs, dtype=np.int64)] * R,
                     link_bw=np.asarray(bw, dtype=float), flow_cap=cap, claim_ns=claim, floor_ns=floor)


def random_problem(seed: int, ranks: int = 2, wgs: int = 5, fixed: int | None = None):
    """Random AG-like problem: per rank, movers (random sizes, own ingress link), builders
    depending on a random earlier mover of any rank (or nothing)."""
    rng = np.random.default_rng(seed)
    builds, moves, deps, rank_b, rank_m = [], [], [], [], []
    nm_per = int(rng.integers(1, 6))
    nb_per = int(rng.integers(3, 20))
    for r in range(ranks):
        for _ in range(nm_per):
            moves.append((float(rng.integers(1, 200)), (r, ranks + (r + 1) % ranks)))
            rank_m.append(r)
    nb = nb_per * ranks
    for r in range(ranks):
        for _ in range(nb_per):
            builds.append(float(rng.integers(1, 50)))
            rank_b.append(r)
    for i in range(nb):
        deps.append([] if rng.random() < 0.3 else [nb + int(rng.integers(0, len(moves)))])
    deps += [[] for _ in moves]
    rules = [SELF_AG] if fixed is None else [[(1, False)], [(0, False)]]
    wr = np.zeros(wgs, dtype=np.int64)
    if fixed is not None:
        wr[fixed:] = 1
    return make(builds, moves, deps, wgs=wgs, rules=rules, wg_rules=[wr] * ranks, bw=[7.0] * (2 * ranks),
                cap=3.0, lat=2.0, claim=0.5, ranks=rank_b + rank_m)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("fixed", [None, 1, 3])
def test_conservation(seed, fixed):
    p = random_problem(seed, fixed=fixed)
    res = E.simulate(p)
    # every item executed exactly once, by a WG of its rank, after it was ready
    assert np.all(np.isfinite(res.t_end)) and np.all(res.wg_of >= 0)
    assert np.all(res.t_start >= res.t_ready - 1e-6)
    assert np.all(res.t_end >= res.t_start)
    tl = res.timeline()
    work = tl[tl.role != "WAIT"]
    assert len(work) == p.n and sorted(work["item"]) == sorted(p.label.tolist())
    # busy + wait + tail == makespan for every WG
    acc = res.wg_accounting()
    tol = 1e-6 * max(res.makespan_ns, 1.0)
    assert np.allclose(acc["total_ns"], res.makespan_ns, atol=tol)
    # role intervals of one WG never overlap
    for (_, _), g in tl.groupby(["rank", "wg"]):
        t0, t1 = g["t0_ns"].to_numpy(), g["t1_ns"].to_numpy()
        assert np.all(t0[1:] >= t1[:-1])


def test_pure_compute_closed_form():
    wgs, d = 4, 10.0
    for n in (1, 4, 7, 8, 13):
        res = E.simulate(make([d] * n, [], [[]] * n, wgs=wgs))
        want = math.ceil(n / wgs) * d
        assert res.makespan_ns == pytest.approx(want)


def test_end_floor_delays_only_its_item():
    """end_floor_ns: an item ends at max(start + work, its floor) (a tile streaming K-slices
    waits for its last slice inside the tile); the other WG's item is not delayed."""
    prob = make([10.0, 10.0], [], [[], []], wgs=2)
    prob.end_floor_ns = np.array([25.0, 0.0])
    res = E.simulate(prob)
    assert res.t_end.tolist() == pytest.approx([25.0, 10.0])
    assert res.makespan_ns == pytest.approx(25.0)


def test_pure_comm_shares_link_fairly():
    # n equal transfers, k mover WGs (all WGs move: no builders), link B, per-WG cap c
    B, c, b = 10.0, 4.0, 100.0
    for n, k in ((4, 4), (8, 4), (3, 4), (6, 2)):
        res = E.simulate(make([], [(b, (0,))] * n, [[]] * n, wgs=k, bw=[B], cap=c))
        rate = min(c, B / min(n, k))
        waves = math.ceil(n / k)
        if n % k == 0 or n < k:
            want = waves * b / rate
            assert res.makespan_ns == pytest.approx(want, rel=1e-9)
        # never faster than the link, never faster than the per-WG cap
        assert res.makespan_ns >= n * b / B * (1 - 1e-9)
        assert res.makespan_ns >= b / c * (1 - 1e-9)


def test_waterfill_two_links():
    # flows: A uses links 0,1; B uses link 0; C uses link 1. link0=10, link1=4.
    # max-min: C and A share link1 -> 2 each; B gets link0 leftover 8.
    res = E.simulate(make([], [(20.0, (0, 1)), (80.0, (0,)), (20.0, (1,))], [[]] * 3, wgs=3, bw=[10.0, 4.0]))
    assert res.t_end[0] == pytest.approx(10.0)
    assert res.t_end[2] == pytest.approx(10.0)
    assert res.t_end[1] == pytest.approx(10.0)


def test_perfect_overlap_bound_and_ready_wait():
    # builders depend on transfers: makespan >= max(compute / wgs, comm / bw)
    nb, nm = 16, 2  # 2 WGs move, the other 2 claim the builder head and wait on it
    deps = [[nb + i % nm] for i in range(nb)] + [[] for _ in range(nm)]
    p = make([10.0] * nb, [(50.0, (0,))] * nm, deps, wgs=4, bw=[5.0])
    res = E.simulate(p)
    assert res.makespan_ns >= max(nb * 10.0 / 4, nm * 50.0 / 5.0) - 1e-9
    assert (res.timeline().role == "WAIT").any()


def test_dependency_latency_and_floor():
    # one mover, one builder depending on it with a 7 ns flag latency; builder floor irrelevant
    p = make([5.0], [(10.0, (0,))], [[1], []], wgs=2, bw=[1.0])
    p.dep_lat_ns = np.array([7.0])
    res = E.simulate(p)
    assert res.t_ready[0] == pytest.approx(10.0 + 7.0)
    assert res.makespan_ns == pytest.approx(10.0 + 7.0 + 5.0)
    p = make([5.0], [], [[]], wgs=1, floor=np.array([3.0]))
    assert E.simulate(p).makespan_ns == pytest.approx(8.0)


def test_more_bandwidth_never_slower():
    for seed in range(8):
        base = random_problem(seed)
        prev = None
        for scale in (0.5, 1.0, 2.0, 4.0):
            p = random_problem(seed)
            p.link_bw = base.link_bw * scale
            t = E.simulate(p).makespan_ns
            if prev is not None:
                assert t <= prev * (1 + 1e-9)
            prev = t


def test_fixed_bad_k_slower_than_self():
    # plenty of compute, little comm: 3 of 4 WGs as movers wastes the machine
    nb, nm = 40, 2
    deps = [[] for _ in range(nb)] + [[] for _ in range(nm)]
    self_t = E.simulate(make([10.0] * nb, [(10.0, (0,))] * nm, deps, wgs=4)).makespan_ns
    rules = [[(1, False)], [(0, False)]]
    bad = E.simulate(make([10.0] * nb, [(10.0, (0,))] * nm, deps, wgs=4, rules=rules,
                          wg_rules=[np.array([0, 0, 0, 1])])).makespan_ns
    assert self_t < bad


def test_deadlock_is_reported():
    # a builder-only WG waits on a builder whose input no WG may move
    p = make([5.0], [(10.0, (0,))], [[1], []], wgs=1, rules=[[(0, False)]])
    with pytest.raises(RuntimeError, match="deadlock"):
        E.simulate(p)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_inflight_cap(seed, cap):
    """Capped mover claims never exceed the cap; spinning WGs are WAIT; WG time conserved."""
    p = random_problem(seed, wgs=6)
    p.rule_sets = [[(0, E.READY), (1, E.ANY_CAPPED), (0, E.ANY)]]
    p.inflight_cap = [cap] * p.num_ranks
    res = E.simulate(p)
    mv = p.kind == E.MOVE
    for r in range(p.num_ranks):
        sel = mv & (p.rank == r)
        t0, t1 = res.t_claim[sel], res.t_end[sel]
        for t in t0:  # claimed-not-completed movers at each claim instant
            assert ((t0 <= t) & (t1 > t)).sum() <= cap
    acc = res.wg_accounting()
    assert np.allclose(acc["total_ns"], res.makespan_ns, atol=1e-6 * res.makespan_ns)
    tl = res.timeline()
    for _, g in tl.groupby(["rank", "wg"]):
        assert np.all(g["t0_ns"].to_numpy()[1:] >= g["t1_ns"].to_numpy()[:-1])


def test_link_collapse():
    """n equal transfers on one link: beyond n0 the link delivers (n0/n)**gamma of its rate."""
    b, B, n0, gamma = 100.0, 10.0, 4, 1.0
    for n in (2, 4, 8, 16):
        p = make([], [(b, (0,))] * n, [[]] * n, wgs=n, bw=[B])
        p.collapse = (n0, gamma)
        eff = min(1.0, (n0 / n) ** gamma)
        assert E.simulate(p).makespan_ns == pytest.approx(n * b / (B * eff))
        p2 = make([], [(b, (0, 1))] * n, [[]] * n, wgs=n, bw=[B, 1e9])  # same through the waterfill
        p2.collapse = (n0, gamma)
        assert E.simulate(p2).makespan_ns == pytest.approx(n * b / (B * eff))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("loop", [E.SELF_AG, E.SELF_RS])
@pytest.mark.parametrize("cap", [0, 1, 2])
def test_named_self_loops(seed, loop, cap):
    """The kernels' self loop (pending slot, mover slots): conservation, cap, no deadlock.
    RS-like: movers depend on builders, reduces on movers; AG-like: builders on movers."""
    rng = np.random.default_rng(seed)
    nb, nm, nr = int(rng.integers(4, 16)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
    n = nb + nm + nr
    kind = np.array([E.BUILD] * nb + [E.MOVE] * nm + [E.REDUCE] * nr, dtype=np.int8)
    deps = []
    for i in range(n):
        if loop == E.SELF_AG:
            deps.append([nb + int(rng.integers(0, nm))] if i < nb and rng.random() < 0.7 else [])
        elif nb <= i < nb + nm:
            deps.append([int(rng.integers(0, nb))])
        elif i >= nb + nm:
            deps.append([nb + int(rng.integers(0, nm))])
        else:
            deps.append([])
    ptr, idx = E.csr(deps)
    q = [E.Queue("builder", np.arange(nb)), E.Queue("mover", nb + np.arange(nm)),
         E.Queue("reduce", nb + nm + np.arange(nr) if loop == E.SELF_RS else np.zeros(0, np.int64))]
    if loop == E.SELF_AG:  # reduces go to the builder queue's end (AG has no reduce queue)
        q[0] = E.Queue("builder", np.concatenate([np.arange(nb), nb + nm + np.arange(nr)]))
    p = E.Problem(kind=kind, rank=np.zeros(n, dtype=np.int32), work_ns=rng.integers(1, 30, n).astype(float),
                  nbytes=np.where(kind == E.MOVE, rng.integers(10, 100, n), 0).astype(float),
                  path=[(0,) if k == E.MOVE else () for k in kind], dep_ptr=ptr, dep_idx=idx,
                  dep_lat_ns=np.ones(len(idx)), label=np.arange(n), queues=[q], rule_sets=[loop],
                  wg_rules=[np.zeros(4, dtype=np.int64)], link_bw=np.array([5.0]), flow_cap=2.0,
                  inflight_cap=[cap])
    res = E.simulate(p)
    assert np.isfinite(res.t_end).all()
    acc = res.wg_accounting()
    assert np.allclose(acc["total_ns"], res.makespan_ns, atol=1e-6 * res.makespan_ns)
    if cap:
        mv = np.flatnonzero(kind == E.MOVE)
        for t in res.t_claim[mv]:
            assert ((res.t_claim[mv] <= t) & (res.t_end[mv] > t)).sum() <= cap


def test_an_agent_on_sm_minus_one_claims_for_free():
    """claim_ns is an SM's atomic: a WG on sm -1 (the copy engine in the CE model) pays none,
    so 10 back-to-back moves of 100 bytes at 10 B/ns take 100 ns there and 100 + 10 * claim
    on an SM."""
    moves = [(100.0, (0,))] * 10
    mover_only = [[(1, False)]]
    for sm, want in ((-1, 100.0), (0, 100.0 + 10 * 3.0)):
        p = make([], moves, [[] for _ in moves], wgs=1, rules=mover_only, claim=3.0)
        p.sm = [np.array([sm])]
        res = E.simulate(p)
        assert res.makespan_ns == pytest.approx(want), sm


def test_stream_dependencies_end_a_running_item_not_its_start():
    """A tile with stream deps (ag-wgrad: bands waited for inside, in a fixed order) starts at
    once and ends at max(own end, each dep's completion + latency + the work after it)."""
    # builder 0 (work 100) streams movers 1 (50 B) and 2 (150 B) in that order; one mover WG, 10 B/ns
    p = make([100.0], [(50.0, (0,)), (150.0, (0,))], [[], [], []], wgs=2, rules=[[(1, False)], [(0, False)]],
             wg_rules=[np.array([0, 1])])
    p.end_dep_ptr = np.array([0, 2, 2, 2])
    p.end_dep_idx = np.array([1, 2])
    p.end_dep_lat_ns = np.array([1.0, 1.0])
    p.end_dep_tail_ns = np.array([60.0, 30.0])  # the tile's work after each band's first k-block
    res = E.simulate(p)
    assert res.t_start[0] == 0.0 and res.t_end[1] == pytest.approx(5.0) and res.t_end[2] == pytest.approx(20.0)
    assert res.t_end[0] == pytest.approx(100.0)  # max(0 + 100, 5 + 1 + 60, 20 + 1 + 30)
    p.end_dep_tail_ns = np.array([60.0, 95.0])
    assert E.simulate(p).t_end[0] == pytest.approx(20.0 + 1.0 + 95.0)  # the last band late: it sets the end
    p.end_dep_ptr = np.array([0, 0, 2, 2])  # stream deps on a mover: refused
    with pytest.raises(ValueError, match="stream"):
        p.check()
