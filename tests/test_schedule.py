"""CPU tests of kosmos_bench.schedule: item sets, queue orders, DAG consistency."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kosmos_bench import schedule as S

ORDERS = S.QUEUE_ORDERS


def _check_queues(sch: S.RankSchedule) -> None:
    for t in sch.queues:
        n = len(t)
        assert t.queue.dtype == np.int32 and t.table.dtype == np.int32
        assert t.table.shape == (n, S.ITEM_STRIDE)
        assert sorted(t.queue.tolist()) == list(range(n)), "every item exactly once in its queue"
        assert t.flops.shape == (n,) and t.bytes.shape == (n,)
        deps_end = t.col("dep_begin") + t.col("dep_count")
        assert np.all(deps_end <= len(sch.deps))
    assert np.all((sch.deps >= 0) & (sch.deps < sch.flags.num_flags))


@pytest.mark.parametrize("op", S.OPS)
@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_awkward_item_counts(op, W):
    M, N, K = 3000 * W, 777 * W, 1000
    if op == "gemm-rs":
        K = 1000 * W
    BM = BN = 128
    for r in sorted({0, W - 1}):
        sch = S.build_schedule(op, M, N, K, W, r, BM=BM, BN=BN, num_wgs=16)
        _check_queues(sch)
        mt = -(-3000 // BM)  # 24 tiles, the last with 3000 - 23*128 = 56 rows
        assert mt == 24
        rows = sch.builders.col("rows")
        cols = sch.builders.col("cols")
        if op == "ag-gemm":
            nt = -(-777 // BN)  # 7 tiles, the last with 9 columns
            assert len(sch.builders) == W * mt * nt
            # one slice per band here: a 128-row band of K=1000 is 250 KiB < mover_bytes
            assert len(sch.movers) == (W - 1) * mt
            assert np.sum(rows == 3000 - 23 * BM) == W * nt
            assert np.sum(cols == 777 - 6 * BN) == W * mt
            # builders cover C_r exactly once
            cover = np.zeros((M, N // W), dtype=np.int32)
            for row in sch.builders.table:
                p, m0, rr, n0, cc = row[1:6]
                cover[p * (M // W) + m0:p * (M // W) + m0 + rr, n0:n0 + cc] += 1
            assert np.all(cover == 1)
            assert sch.movers.bytes.sum() == (W - 1) * 3000 * K * 2
            # sliced: 4 KiB slices -> band flags need every slice
            sl = S.build_schedule(op, M, N, K, W, r, BM=BM, BN=BN, num_wgs=16, mover_bytes=4096)
            _check_queues(sl)
            assert sl.movers.bytes.sum() == (W - 1) * 3000 * K * 2
            for f in np.unique(sl.movers.col("rel_flag")):
                sel = sl.movers.col("rel_flag") == f
                assert sl.flag_mult[f] == sel.sum() == sl.movers.col("cols")[sel][0]
                assert sorted(sl.movers.col("n0")[sel]) == list(range(sel.sum()))
        else:
            nt = -(-N // BN)
            assert len(sch.builders) == W * mt * nt
            assert len(sch.movers) == (W - 1) * mt * nt
            assert len(sch.reduces) == mt * nt
            cover = np.zeros((M // W, N), dtype=np.int32)
            for row in sch.reduces.table:
                m0, rr, n0, cc = row[2:6]
                cover[m0:m0 + rr, n0:n0 + cc] += 1
            assert np.all(cover == 1)
        total = sch.builders.flops.sum()
        expect = 2.0 * M * (N // W) * K if op == "ag-gemm" else 2.0 * M * N * (K // W)
        assert total == expect


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("op", S.OPS)
def test_orders_are_permutations(op, order):
    W = 4
    K = 1000 if op == "ag-gemm" else 1000 * W
    a = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order=order, seed=3, num_wgs=8)
    b = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order=order, seed=3, num_wgs=8)
    _check_queues(a)
    for ta, tb in zip(a.queues, b.queues):
        assert np.array_equal(ta.queue, tb.queue), "deterministic for a seed"
    d = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order="demand", num_wgs=8)
    if order == "reverse":
        assert np.array_equal(a.builders.queue, d.builders.queue[::-1])
    if order == "fifo":
        assert np.array_equal(a.builders.queue, np.arange(len(a.builders)))


def test_peer_runs():
    assert S._peer_runs([(1, 6), (1, 7), (2, 0), (2, 1), (3, 0)]) == [[(1, 6), (1, 7)], [(2, 0), (2, 1)], [(3, 0)]]
    assert S._peer_runs([]) == [] and S._peer_runs([(0, 0)]) == [[(0, 0)]]
    # off (the default): column by column over the whole group, straddling or not
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", band_group=6, ramp=False)
    on, off = (S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 0, peer_runs=v, **kw) for v in (True, False))
    assert sorted(on.builders.queue) == sorted(off.builders.queue)
    # 8 bands of 8 tiles per peer: local bands, then group [peer 1 bands 0-5], then [peer 1: 6, 7 | peer 2: 0-3]
    second = 8 * 8 + 6 * 8
    n0 = {k: [int(x) for x in s.builders.table[s.builders.queue][second:second + 6, S.F["n0"]]] for k, s in
          (("on", on), ("off", off))}
    assert n0 == {"on": [0, 0, 256, 256, 512, 512], "off": [0] * 6}


def test_local_halve_off_keeps_the_own_bands_in_regular_groups():
    """local_halve=False: the own bands (ready at entry) in regular demand groups (8 bands: one
    group, not 4, 2, 1, 1); the remote groups unchanged."""
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host")
    on, off = (S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 3, local_halve=v, **kw) for v in (True, False))
    local = 8 * 8  # 8 own bands of 8 tiles, first
    m0 = {k: [int(x) for x in s.builders.table[s.builders.queue][:local, S.F["m0"]]] for k, s in (("on", on), ("off", off))}
    assert m0["off"][:8] == [128 * i for i in range(8)]  # one 8-band group: column 0 of every band first
    assert m0["on"][:8] == [0, 128, 256, 384] * 2  # a 4-band group first
    assert list(on.builders.queue[local:]) == list(off.builders.queue[local:])
    w1 = S.build_schedule("ag-gemm", 64 * 128, 2048, 512, 1, 0, local_halve=False, **kw)
    t = w1.builders.table[w1.builders.queue]
    assert len({int(x) for x in t[:11, S.F["m0"]]}) == 11 and len({int(x) for x in t[-9:, S.F["m0"]]}) == 9


def test_local_group_sets_the_own_band_groups_only():
    """local_group=8 at world 1 (64 bands): eight 8-band groups (the standalone GEMM's raster)
    instead of ~sqrt(132) = 11; on a host rank the remote groups are unchanged."""
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host")
    w1 = S.build_schedule("ag-gemm", 64 * 128, 2048, 512, 1, 0, local_halve=False, local_group=8, **kw)
    m0 = [int(x) // 128 for x in w1.builders.table[w1.builders.queue][:, S.F["m0"]]]
    assert len(m0) == 64 * 8 and [sorted(set(m0[g * 64:(g + 1) * 64])) for g in range(8)] == \
        [list(range(8 * g, 8 * g + 8)) for g in range(8)]
    d, g4 = (S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 3, local_group=v, **kw) for v in (None, 4))
    local = 8 * 8
    assert [int(x) // 128 for x in g4.builders.table[g4.builders.queue][:8, S.F["m0"]]] == [0, 1, 2, 3] * 2
    assert list(d.builders.queue[local:]) == list(g4.builders.queue[local:])


def test_ag_demand_local_first_grouped_raster():
    W, r, BM, chunk = 4, 2, 128, 2
    sch = S.build_schedule("ag-gemm", 1000 * W, 300 * W, 256, W, r, BM=BM, BN=64, chunk=chunk, num_wgs=8)
    t = sch.builders.table[sch.builders.queue]
    peers = t[:, S.F["peer"]]
    mt_n, nt_n = sch.meta["m_tiles"], sch.meta["n_tiles"]
    per_peer = mt_n * nt_n
    assert np.all(peers[:per_peer] == r), "local bands first"
    ring = [(r + i) % W for i in range(1, W)]
    # remote bands in ring order, each peer's bands in order; within each band group the
    # tiles go column by column (N tile, then band), groups from band_groups()
    for start, seg_peers in ((0, [r]), (per_peer, ring)):
        bands = [(p, mt) for p in seg_peers for mt in range(mt_n)]
        expect = [(p, mt * BM, nt * 64) for grp in S.band_groups(len(bands), 8, ramp=start > 0, halve=start > 0)
                  for nt in range(nt_n) for p, mt in bands[grp]]  # own bands: regular groups (local_halve off)
        got = [(int(x[S.F["peer"]]), int(x[S.F["m0"]]), int(x[S.F["n0"]])) for x in t[start:start + len(expect)]]
        assert got == expect
    assert len({tuple(x) for x in t[:, [S.F["peer"], S.F["m0"], S.F["n0"]]]}) == len(t) == W * per_peer
    # mover order = order builders need the bands
    mv = sch.movers.table[sch.movers.queue]
    need = []
    for row in t:
        if row[S.F["peer"]] != r:
            key = (int(row[S.F["peer"]]), int(row[S.F["m0"]]) // (BM * chunk))
            if key not in need:
                need.append(key)
    got = list(dict.fromkeys((int(row[S.F["peer"]]), int(row[S.F["m0"]]) // (BM * chunk)) for row in mv))
    assert got == need
    # local_first off: local bands last
    off = S.build_schedule("ag-gemm", 1000 * W, 300 * W, 256, W, r, BM=BM, BN=64, chunk=chunk, num_wgs=8,
                           local_first=False)
    assert np.all(off.builders.table[off.builders.queue][-per_peer:, S.F["peer"]] == r)


def test_band_groups_cover_in_order_and_shrink_at_the_end():
    for n, b in ((1, 132), (16, 16), (64, 132), (128, 124), (7, 1)):
        groups = S.band_groups(n, b)
        assert [i for g in groups for i in range(g.start, g.stop)] == list(range(n))
        sizes = [g.stop - g.start for g in groups]
        assert max(sizes) <= max(1, round(b ** 0.5)) and sizes[-1] == 1
        assert all(x >= y for x, y in zip(sizes, sizes[1:])), sizes
        ramped = [g.stop - g.start for g in S.band_groups(n, b, ramp=True)]
        assert sum(ramped) == n and ramped[0] == 1 and max(ramped) <= max(sizes)
    assert [g.stop - g.start for g in S.band_groups(56, 132, ramp=True)] == [1, 2, 4, 8, 11, 11, 10, 5, 2, 1, 1]


def test_band_groups_without_ramp_or_halving_stay_regular():
    assert [g.stop - g.start for g in S.band_groups(56, 132, size=6, halve=False)] == [6] * 9 + [2]
    assert [g.stop - g.start for g in S.band_groups(56, 132, size=6, tail=2, halve=False)] == [6] * 9 + [2]
    assert [g.stop - g.start for g in S.band_groups(57, 132, size=6, tail=4, halve=False)] == [6] * 8 + [5, 4]
    # the schedule's remote groups (KOSMOS_BAND_RAMP / _HALVE): the local segment is unchanged
    kw = dict(BN=256, num_wgs=132, fabric="host", stream_k=True, band_group=6)
    base = S.build_schedule("ag-gemm", 8192, 106496, 16384, 8, 0, ramp=True, **kw)
    flat = S.build_schedule("ag-gemm", 8192, 106496, 16384, 8, 0, ramp=False, halve=False, **kw)
    assert [len(g) for g in base.meta["remote_groups"]][:3] == [1, 2, 4]
    assert [len(g) for g in flat.meta["remote_groups"]] == [6] * 9 + [2]
    local = 8 * 52  # rank 0's own bands come first, in the same order either way
    assert np.array_equal(base.builders.queue[:local], flat.builders.queue[:local])
    assert sorted(base.builders.queue) == sorted(flat.builders.queue)


def test_rs_demand_local_last_and_deps():
    W, r = 4, 1
    sch = S.build_schedule("gemm-rs", 512 * W, 384, 64 * W, W, r, BM=128, BN=128, num_wgs=8)
    t = sch.builders.table[sch.builders.queue]
    dests = [int(d) for d in t[:, S.F["peer"]]]
    firsts = list(dict.fromkeys(dests))
    assert firsts == [(r + i) % W for i in range(1, W)] + [r], "destinations r+1, ..., local last"
    # each push depends on its builder tile; each reduce on W-1 arrivals + local partial
    for i in range(len(sch.movers)):
        row = sch.movers.table[i]
        assert row[S.F["kind"]] == S.RS_PUSH
        assert row[S.F["rel_rank"]] == row[S.F["peer"]]
        assert row[S.F["dep_count"]] == 2  # entry flag of the destination + one builder tile
    assert np.all(sch.reduces.col("dep_count") == W)


def test_host_fabric_rs_proxies_and_peer_flags():
    W = 8
    sch = S.build_schedule("gemm-rs", 256 * W, 256, 8 * W, W, 0, fabric="host", num_wgs=16)
    kinds = sch.movers.col("kind")
    assert np.sum(kinds == S.RS_PUSH) == np.sum(kinds == S.RS_PROXY) == (W - 1) * 2 * 2
    q = sch.movers.table[sch.movers.queue][:, S.F["kind"]]
    assert q[0] == S.RS_PUSH and q[1] == S.RS_PROXY, "interleaved 1:1"
    assert len(sch.peer_flags) == 2 * (W - 1)


def test_wg_assignment_and_predicted():
    st = S.wg_starts(132, 8)
    assert st[0] == 0 and st[-1] == 132 and np.all(np.diff(st) >= 16) and np.all(np.diff(st) <= 17)
    assert len(S.wg_ranks(132, 8)) == 132
    k = S.predicted_movers("ag-gemm", 8192, 8192, 8192, 8, 132, fabric="host")
    assert 1 <= k < 132
    # more link bandwidth per WG -> fewer movers
    k2 = S.predicted_movers("ag-gemm", 8192, 8192, 8192, 8, 132, fabric="host", model={"wg_copy_gbs": 50.0})
    assert k2 <= k
    # comm-light problem -> few movers
    assert S.predicted_movers("ag-gemm", 8192, 65536, 8192, 8, 132, fabric="nvlink") <= k
    with pytest.raises(ValueError):
        S.resolve_movers("fixed:16", "ag-gemm", 64, 64, 64, 2, 16)
    assert S.resolve_movers("fixed:3", "ag-gemm", 64, 64, 64, 2, 16) == 3


def test_arrays_contiguous_int32():
    sch = S.build_schedule("gemm-rs", 300 * 3, 200, 30 * 3, 3, 2, num_wgs=5, chunk=2)
    for name, a in sch.arrays().items():
        assert a.dtype == np.int32 and a.flags["C_CONTIGUOUS"], name


@pytest.mark.parametrize("op", S.OPS)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("policy", ["self", "fixed:1", "fixed:2", "predicted"])
def test_no_deadlock_any_order(op, order, policy):
    """The WG loop finishes for every order/policy (local fabric, all ranks live)."""
    W = 3
    K = 96 if op == "ag-gemm" else 96 * W
    rng = np.random.default_rng(0)
    for chunk in (1, 2):
        sch = S.build_all(op, 300 * W, 90 * W, K, W, 3 * W + 1, BM=64, BN=64, chunk=chunk, policy=policy,
                          queue_order=order, seed=5, mover_bytes=8192)
        durs = rng.integers(1, 6, size=100000)
        S.simulate_steps(sch, durations=lambda rk, q, i: int(durs[(rk * 997 + q * 131 + i) % len(durs)]))


@pytest.mark.parametrize("op", S.OPS)
def test_no_deadlock_host(op):
    W = 8
    K = 64 if op == "ag-gemm" else 64 * W
    sch = S.build_schedule(op, 200 * W, 64 * W, K, W, 0, BM=64, BN=64, fabric="host", num_wgs=6)
    S.simulate_steps([sch], static_peers=True)


def test_deadlock_detected():
    """The checker itself catches a missing peer (sanity of the test above)."""
    W = 2
    sch = S.build_all("ag-gemm", 256, 128, 64, W, 4, BM=64, BN=64)
    sch[1].deps[:] = sch[1].flags.num_flags - 1  # wait on a flag nobody releases
    with pytest.raises(RuntimeError, match="deadlock"):
        S.simulate_steps(sch)


@pytest.mark.parametrize("op", S.OPS)
@pytest.mark.parametrize("cap", [1, 2, 5])
def test_no_deadlock_with_inflight_cap(op, cap):
    W = 3
    K = 96 if op == "ag-gemm" else 96 * W
    sch = S.build_all(op, 300 * W, 90 * W, K, W, 4 * W, BM=64, BN=64, mover_bytes=4096)
    for s in sch:
        s.max_inflight = cap
    S.simulate_steps(sch)
    host = S.build_schedule(op, 200 * 8, 64 * 8, K if op == "ag-gemm" else 64 * 8, 8, 0, BM=64, BN=64,
                            fabric="host", num_wgs=6)
    assert host.max_inflight > 0
    host.max_inflight = cap
    S.simulate_steps([host], static_peers=True)


def test_inflight_cap_defaults():
    assert S.max_inflight_movers("ag-gemm", "local", 16) == 0
    assert 4 <= S.max_inflight_movers("ag-gemm", "host", 132) <= 32
    assert S.max_inflight_movers("gemm-rs", "host", 132) >= S.max_inflight_movers("ag-gemm", "host", 132)
    # predicted on the host link: a handful of movers, not most of the GPU
    assert S.predicted_movers("ag-gemm", 8192, 8192, 8192, 8, 132, fabric="host") <= 16


def test_inflight_cap_knob(monkeypatch):
    monkeypatch.setenv("KOSMOS_MAX_INFLIGHT", "20")
    assert S.max_inflight_movers("ag-gemm", "host", 132) == 20
    assert S.max_inflight_movers("ag-gemm", "local", 16) == 15  # never every WG
    monkeypatch.setenv("KOSMOS_MAX_INFLIGHT", "0")
    assert S.max_inflight_movers("ag-gemm", "host", 132) == 0
    for bad in ("-1", "many"):
        monkeypatch.setenv("KOSMOS_MAX_INFLIGHT", bad)
        with pytest.raises(ValueError, match="KOSMOS_MAX_INFLIGHT"):
            S.max_inflight_movers("ag-gemm", "host", 132)


def test_c_abi_constants_match_python():
    """csrc/kosmos/params.h and kernels/abi.py + schedule.py agree (no nvcc needed)."""
    import re
    from pathlib import Path

    from kosmos_bench.kernels import abi

    h = (Path(__file__).resolve().parents[1] / "csrc" / "kosmos" / "params.h").read_text()
    h = re.sub(r"//[^\n]*", "", h)  # drop comments

    def define(name):
        return int(re.search(rf"#define {name} (\d+)", h).group(1))

    assert define("KOSMOS_ITEM_STRIDE") == S.ITEM_STRIDE == len(S.ITEM_FIELDS)
    assert define("KOSMOS_ABI_VERSION") == abi.ABI_VERSION
    assert define("KOSMOS_MAX_WORLD") == abi.MAX_WORLD
    assert define("KOSMOS_NUM_CTR") == abi.NUM_CTR
    # RankArgs field order of the C struct == ctypes mirror

    def fields(struct):
        body = h[h.index(f"typedef struct {struct}") + len(f"typedef struct {struct}"):h.index(f"}} {struct};")]
        out = []
        for decl in re.findall(r"([^;{}]+);", body):
            parts = [re.sub(r"\[[^\]]*\]", "", x).strip() for x in decl.split(",")]
            out.append(re.split(r"[\s*]+", parts[0])[-1])
            out += parts[1:]
        return out

    assert fields("KosmosRankArgs") == [f for f, _ in abi.RankArgs._fields_]
    assert fields("KosmosParams") == [f for f, _ in abi.Params._fields_]
    assert fields("KosmosErrorRecord") == [f for f, _ in abi.ErrorRecord._fields_]
    assert S.ROLE_NAMES == ("MOVE", "BUILD", "REDUCE", "WAIT")  # trace.cuh Role enum order


def test_band_groups_with_a_tail_end_on_exactly_tail_bands():
    for n in (1, 3, 4, 5, 9, 56, 77, 112):
        for tail in (2, 4, 26):
            sizes = [g.stop - g.start for g in S.band_groups(n, 132, ramp=True, tail=tail)]
            assert sum(sizes) == n and all(s >= 1 for s in sizes), (n, tail, sizes)
            groups = S.band_groups(n, 132, ramp=True, tail=tail)
            assert [i for g in groups for i in range(g.start, g.stop)] == list(range(n))
            if n > tail:
                assert sizes[-1] == tail, (n, tail, sizes)


def test_demand_group_small_only_when_link_and_builders_are_balanced():
    sm90 = {"wg_tflops": 5.3}  # what kosmos.py passes for the Hopper builder CTAs
    sq = round(math.sqrt(132))
    # host fabric, W = 8, 132 builder CTAs: 405b FC1 (n_loc 13312) is balanced, 70b FC1 and QKV are link-bound
    assert 0.8 < S.link_compute_ratio(13312, 132, "host", sm90) < 1.0
    assert S.demand_group(13312, 132, "host", sm90) == S.BALANCED_GROUP
    for n_loc in (7168, 2304, 1280):
        assert S.link_compute_ratio(n_loc, 132, "host", sm90) < S.BALANCED_RHO[0]
        assert S.demand_group(n_loc, 132, "host", sm90) == sq
    # NVLink brings a band ~8x faster: the same layer is builder-bound, groups stay ~sqrt
    assert S.link_compute_ratio(13312, 132, "nvlink", sm90) > S.BALANCED_RHO[1]
    assert S.demand_group(13312, 132, "nvlink", sm90) == sq
    # balanced on NVLink (a QKV-sized n_loc) but unmeasured there: ~sqrt groups
    assert S.BALANCED_RHO[0] <= S.link_compute_ratio(2304, 132, "nvlink", sm90) <= S.BALANCED_RHO[1]
    assert S.demand_group(2304, 132, "nvlink", sm90) == sq


def test_ag_schedule_uses_balanced_groups_for_remote_bands_only():
    W, K, n_loc = 8, 512, 13312
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", model={"wg_tflops": 5.3}, ramp=True, local_halve=True)
    sch = S.build_schedule("ag-gemm", 128 * 8 * W, n_loc * W, K, W, 0, **kw)
    t = sch.builders.table[sch.builders.queue]
    nt_n = sch.meta["n_tiles"]
    local = 8 * nt_n
    # local bands: ~sqrt(132)-band groups (halving at the end), column by column
    g0 = S.band_groups(8, 132)[0]
    n0 = g0.stop - g0.start
    assert [int(x) for x in t[:n0, S.F["m0"]]] == [128 * i for i in range(n0)] and n0 != S.BALANCED_GROUP
    # remote groups ramp 1, 2, 4, then at most BALANCED_GROUP bands: each N tile covers <= that many
    remote = t[local:]
    sizes = [g.stop - g.start for g in S.band_groups(7 * 8, 132, ramp=True, size=S.BALANCED_GROUP)]
    assert max(sizes) == S.BALANCED_GROUP and sum(sizes) == 56
    i = 0
    for size in sizes:
        block = remote[i:i + size * nt_n]
        assert len({(int(p), int(m)) for p, m in block[:, [S.F["peer"], S.F["m0"]]]}) == size
        assert [int(n) for n in block[:size, S.F["n0"]]] == [0] * size  # column by column
        i += size * nt_n
    # an explicit band_group wins
    big = S.build_schedule("ag-gemm", 128 * 8 * W, n_loc * W, K, W, 0, band_group=20, **kw)
    first = big.builders.table[big.builders.queue][local:]
    sizes20 = [g.stop - g.start for g in S.band_groups(56, 132, ramp=True, size=20)]
    assert max(sizes20) > round(math.sqrt(132))  # ramps past the default size
    assert len({(int(p), int(m)) for p, m in first[:sizes20[0] * nt_n][:, [S.F["peer"], S.F["m0"]]]}) == sizes20[0]


def test_peer_groups_ramp_align_and_halve_to_the_tail():
    assert [(g.start, g.stop) for g in S.peer_groups(7, 8, 4)] == \
        [(0, 1), (1, 3), (3, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 48), (48, 52), (52, 56)]
    for peers in (1, 2, 3, 7):
        for per in (1, 2, 3, 8, 16, 33):
            for tail in (1, 4):
                groups = S.peer_groups(peers, per, tail)
                assert [i for g in groups for i in range(g.start, g.stop)] == list(range(peers * per))
                assert all(g.start // per == (g.stop - 1) // per for g in groups), (peers, per, groups)
                if per > tail:
                    assert groups[-1].stop - groups[-1].start == tail


def test_env_int_knob_parser():
    from kosmos_bench.runtime.knobs import env_int

    assert env_int("K_X", 3, env={}) == 3
    assert env_int("K_X", 3, env={"K_X": " 7 "}) == 7
    assert env_int("K_X", 0, env={"K_X": "peer"}, words=("peer",)) == "peer"
    with pytest.raises(ValueError, match=r"K_X='-2': expected an integer >= 0 or 'peer'"):
        env_int("K_X", 0, env={"K_X": "-2"}, words=("peer",))
    with pytest.raises(ValueError, match=r"K_X='x': expected an integer >= 1"):
        env_int("K_X", 1, lo=1, env={"K_X": "x"})


@pytest.mark.parametrize("bands,parts", [(1, 2), (3, 4), (100, 3)])
def test_split_tiles_are_k_parts_of_the_last_remote_bands(bands, parts):
    """split_bands / split_k: the last remote bands (ring order) become one-band groups at the
    end of the demand order, each tile `parts` AG_PART items (part-major, kpart 0..parts-1)
    releasing the tile's own split flag (multiplicity parts, after the band flags), with the
    tile's deps and 1/parts of its FLOPs; every other tile is unchanged."""
    W, r, M, N, K = 8, 2, 8 * 512, 8 * 768, 1024
    kw = dict(BM=128, BN=256, fabric="host", num_wgs=20, stream_k=True)
    base = S.build_schedule("ag-gemm", M, N, K, W, r, **kw)
    sch = S.build_schedule("ag-gemm", M, N, K, W, r, split_bands=bands, split_k=parts, **kw)
    _check_queues(sch)
    mt_n, nt_n = sch.meta["m_tiles"], sch.meta["n_tiles"]
    ring = [(p, mt) for p in [(r + i) % W for i in range(1, W)] for mt in range(mt_n)]
    split = ring[-min(bands, len(ring)):]
    t = sch.builders.table
    part = t[:, S.F["kind"]] == S.AG_PART
    assert int(part.sum()) == len(split) * nt_n * parts == sch.meta["split_tiles"] * parts
    assert sch.flags.split == base.flags.num_flags and sch.flags.num_flags == base.flags.num_flags + len(split) * nt_n
    assert np.all(t[part, S.F["rel_rank"]] == r)
    flags = t[part, S.F["rel_flag"]]
    assert set(flags) == set(range(sch.flags.split, sch.flags.num_flags))
    assert np.all(sch.flag_mult[flags] == parts)
    for f in set(flags):  # one item per part, same tile, same deps
        rows = t[part][flags == f]
        assert sorted(rows[:, S.F["kpart"]]) == list(range(parts))
        assert len({tuple(x) for x in rows[:, [S.F["peer"], S.F["m0"], S.F["n0"], S.F["rows"], S.F["cols"]]]}) == 1
    assert np.isclose(sch.builders.flops.sum(), base.builders.flops.sum())
    assert np.all(t[~part, S.F["kpart"]] == 0)
    # demand order: the split bands last, one band at a time, part-major within a band
    q = list(sch.builders.queue)
    tail = q[len(q) - len(split) * nt_n * parts:]
    assert all(part[i] for i in tail)
    for b, (p, mt) in enumerate(split):
        seg = tail[b * nt_n * parts:(b + 1) * nt_n * parts]
        assert {(t[i, S.F["peer"]], t[i, S.F["m0"]] // 128) for i in seg} == {(p, mt)}
        assert [t[i, S.F["kpart"]] for i in seg] == [s for s in range(parts) for _ in range(nt_n)]
    assert sch.meta["remote_groups"][-len(split):] == [[b] for b in split]
    S.simulate_steps([S.build_schedule("ag-gemm", M, N, K, W, 0, split_bands=bands, split_k=parts, **kw)],
                     static_peers=True)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("policy", ["self", "fixed:2"])
def test_split_tiles_no_deadlock(order, policy):
    W = 3
    sch = S.build_all("ag-gemm", 300 * W, 90 * W, 96, W, 3 * W + 1, BM=64, BN=64, policy=policy, queue_order=order,
                      seed=5, mover_bytes=8192, split_bands=2, split_k=3)
    assert all(int((s.builders.col("kind") == S.AG_PART).sum()) > 0 for s in sch)
    rng = np.random.default_rng(1)
    durs = rng.integers(1, 6, size=100000)
    S.simulate_steps(sch, durations=lambda rk, q, i: int(durs[(rk * 997 + q * 131 + i) % len(durs)]))


def test_split_tiles_refused_where_undefined():
    with pytest.raises(ValueError, match="split_k"):
        S.build_schedule("gemm-rs", 1024, 1024, 1024, 8, 0, split_bands=2, split_k=2)
    with pytest.raises(ValueError, match="split_k"):
        S.build_schedule("ag-gemm", 1024 * 8, 1024, 1024, 8, 0, split_bands=2, split_k=2, band_group=S.PEER_GROUPS)
    with pytest.raises(ValueError, match="split_bands"):
        S.build_schedule("ag-gemm", 1024 * 8, 1024, 1024, 8, 0, split_bands=2, split_k=0)
    same = S.build_schedule("ag-gemm", 1024 * 8, 1024, 1024, 8, 0, split_bands=0, split_k=4)  # no bands: no split
    assert not (same.builders.col("kind") == S.AG_PART).any() and same.meta["split_k"] == 1


def test_split_k_knob(monkeypatch):
    from kosmos_bench.impls.kosmos import split_k_setting

    assert split_k_setting({}) == (0, 1)
    assert split_k_setting({"KOSMOS_SPLIT_K": "4:4"}) == (4, 4)
    assert split_k_setting({"KOSMOS_SPLIT_K": "3:1"}) == (0, 1)  # one part: no split
    for bad in ("4", "a:b", "0:4", "2:0", "1:2:3"):
        with pytest.raises(ValueError, match="KOSMOS_SPLIT_K"):
            split_k_setting({"KOSMOS_SPLIT_K": bad})


@pytest.mark.parametrize("bands,slices", [(8, 16), (6, 3), (1, 1), (500, 5)])
def test_sm_tail_pulls_the_last_bands_in_k_slices_gated_on_the_engine(bands, slices):
    """sm_tail_bands / sm_tail_slices: the last remote bands (ring order) are pulled as AG_PULL_K
    K-slices (n0 = slice of cols = slices), in one-wave groups at the end of the demand order,
    slice-major within a group and at the end of the mover queue (``meta["sm_movers"]`` items);
    each waits for its peer's entry and the band flag of the engine's last band (the gate) and
    releases its band flag, whose multiplicity is the slice count. Builders are the same items."""
    W, r, M, N, K = 8, 2, 8 * 1024, 8 * 7168, 1024
    kw = dict(BM=128, BN=256, fabric="host", num_wgs=132, stream_k=True)
    base = S.build_schedule("ag-gemm", M, N, K, W, r, **kw)
    sch = S.build_schedule("ag-gemm", M, N, K, W, r, sm_tail_bands=bands, sm_tail_slices=slices, **kw)
    _check_queues(sch)
    mt_n, nt_n, nb = sch.meta["m_tiles"], sch.meta["n_tiles"], sch.meta["num_bands"]
    ring = [(p, mt) for p in [(r + i) % W for i in range(1, W)] for mt in range(mt_n)]
    sm = ring[-min(bands, len(ring)):]
    t = sch.movers.table
    pull_k = t[:, S.F["kind"]] == S.AG_PULL_K
    assert int(pull_k.sum()) == len(sm) * slices == sch.meta["sm_movers"]
    q = list(sch.movers.queue)
    suffix = q[len(q) - sch.meta["sm_movers"]:]
    assert all(pull_k[i] for i in suffix) and not any(pull_k[i] for i in q[:len(q) - len(suffix)])
    groups = sch.meta["remote_groups"][len(sch.meta["remote_groups"]) - sch.meta["sm_groups"]:]
    assert [tuple(b) for g in groups for b in g] == sm
    assert all(1 <= len(g) <= 132 // nt_n for g in groups)
    band = lambda p, mt: sch.flags.band + p * nb + mt  # noqa: E731
    gate = [band(*ring[-len(sm) - 1])] if len(sm) < len(ring) else []
    pos = 0
    for g in groups:
        seg = suffix[pos:pos + len(g) * slices]
        pos += len(seg)
        assert [(t[i, S.F["peer"]], t[i, S.F["m0"]] // 128, t[i, S.F["n0"]]) for i in seg] == \
            [(p, mt, s) for s in range(slices) for p, mt in g]
    for i in suffix:
        p, mt = int(t[i, S.F["peer"]]), int(t[i, S.F["m0"]]) // 128
        assert list(sch.movers.deps_of(i, sch.deps)) == [sch.flags.entry + p] + gate
        assert (t[i, S.F["cols"]], t[i, S.F["rel_rank"]], t[i, S.F["rel_flag"]]) == (slices, r, band(p, mt))
        assert sch.flag_mult[band(p, mt)] == slices
    assert np.isclose(sch.movers.bytes.sum(), base.movers.bytes.sum())
    other = [c for c in range(S.ITEM_STRIDE) if c != S.F["dep_begin"]]  # same builders, same deps
    assert np.array_equal(sch.builders.table[:, other], base.builders.table[:, other])
    assert all(np.array_equal(sch.builders.deps_of(i, sch.deps), base.builders.deps_of(i, base.deps))
               for i in range(len(base.builders)))


def test_sm_tail_refused_where_undefined():
    kw = dict(BM=128, BN=256, fabric="host", num_wgs=132, sm_tail_bands=4, sm_tail_slices=4)
    for bad in (dict(stream_k=False), dict(stream_k=True, queue_order="random"),
                dict(stream_k=True, band_group=S.PEER_GROUPS), dict(stream_k=True, split_bands=2, split_k=2)):
        with pytest.raises(ValueError, match="sm_tail_bands"):
            S.build_schedule("ag-gemm", 8 * 1024, 8 * 1024, 1024, 8, 0, **{**kw, **bad})
    with pytest.raises(ValueError, match="sm_tail_bands"):
        S.build_schedule("gemm-rs", 8 * 1024, 8 * 1024, 1024, 8, 0, **{**kw, "stream_k": True})
    off = S.build_schedule("ag-gemm", 8 * 1024, 8 * 1024, 1024, 8, 0, stream_k=True, sm_tail_bands=4, sm_tail_slices=0)
    assert off.meta["sm_movers"] == 0 and not (off.movers.col("kind") == S.AG_PULL_K).any()


def test_sm_tail_knob():
    from kosmos_bench.impls import kosmos as K

    assert K.sm_tail_setting({}) == (0, 0)
    assert K.sm_tail_setting({"KOSMOS_CE_SM_TAIL": "8:16"}) == (8, 16)
    for bad in ("8", "a:b", "0:4", "2:0", "1:2:3"):
        with pytest.raises(ValueError, match="KOSMOS_CE_SM_TAIL"):
            K.sm_tail_setting({"KOSMOS_CE_SM_TAIL": bad})
    on = K.ce_settings(7168, 132, True, True, env={"KOSMOS_CE_SM_TAIL": "8:16"})
    assert (on.k_stream, on.slices, on.sm_tail_bands, on.sm_tail_slices) == (True, 1, 8, 16)  # engine: whole bands
    sliced = K.ce_settings(1280, 132, True, True, env={"KOSMOS_CE_SM_TAIL": "4:8", "KOSMOS_CE_SLICES": "2"})
    assert (sliced.slices, sliced.regime) == (2, "copy-bound")  # explicit slices win
    with pytest.raises(ValueError, match="KOSMOS_CE_SM_TAIL"):
        K.ce_settings(7168, 132, False, True, env={"KOSMOS_CE_SM_TAIL": "8:16"})  # no sm90 builder
    assert not on.kernel_side and K.ce_settings(7168, 132, True, True, env={"KOSMOS_CE_KERNEL_SIDE": "1"}).kernel_side
    for bad in ({"KOSMOS_CE_KERNEL_SIDE": "2"}, {"KOSMOS_CE_KERNEL_SIDE": "1", "KOSMOS_CE_HEAD_MAIN": "1"}):
        with pytest.raises(ValueError, match="KOSMOS_CE_KERNEL_SIDE"):
            K.ce_settings(7168, 132, True, True, env=bad)


def test_fill_bands_hold_back_the_last_own_bands():
    """fill_bands=3: the rank's last 3 own bands leave the builder queue for the fill queue
    (ag-gemm's reduce queue), column by column, no deps; the remote demand order is unchanged;
    every tile is in exactly one queue; the WG loop (simulate_steps) finishes with fixed roles and
    self; a bad count or gemm-rs is refused."""
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host")
    d, f = (S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 3, fill_bands=v, **kw) for v in (0, 3))
    nt = f.meta["n_tiles"]
    t = f.reduces.table[f.reduces.queue]
    assert len(f.reduces) == 3 * nt and len(f.builders) + len(f.reduces) == len(d.builders)
    assert [int(x) // 128 for x in t[:6, S.F["m0"]]] == [5, 6, 7] * 2 and [int(x) for x in t[:6, S.F["n0"]]] == \
        [0, 0, 0, 256, 256, 256]
    assert set(t[:, S.F["kind"]].tolist()) == {S.AG_BUILD} and set(t[:, S.F["peer"]].tolist()) == {3}
    assert int(t[:, S.F["dep_count"]].sum()) == 0
    fb = f.builders.table[f.builders.queue]
    assert (fb[:5 * nt, S.F["peer"]] == 3).all() and (fb[5 * nt:, S.F["peer"]] != 3).all()
    rem = d.builders.table[d.builders.queue][8 * nt:]
    assert (fb[5 * nt:, [S.F["peer"], S.F["m0"], S.F["n0"]]] == rem[:, [S.F["peer"], S.F["m0"], S.F["n0"]]]).all()
    for pol in ("self", "fixed:4"):
        sc = [S.build_schedule("ag-gemm", 8 * 512, 8 * 1024, 256, 8, r, BM=128, BN=128, num_wgs=16, fill_bands=2,
                               policy=pol) for r in range(8)]
        assert S.simulate_steps(sc, durations=lambda r, q, i: 1 + (i * 7 + r) % 5) > 0
    for bad in (dict(fill_bands=9), dict(fill_bands=-1)):
        with pytest.raises(ValueError, match="fill_bands"):
            S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 3, **bad, **kw)
    with pytest.raises(ValueError, match="fill_bands"):
        S.build_schedule("gemm-rs", 8192, 8 * 2048, 512, 8, 3, fill_bands=1, **kw)


def test_ramp_only_where_the_own_bands_do_not_cover_the_first_group():
    """ramp=None (default): on the host fabric the remote groups start at one band only when the
    own bands (built first) take the builders less long than the link takes for the first
    regular group (own_bands * rho < group): 405b FC1 (rho 0.88, 8 own bands, 6-band groups) has
    no ramp at 8k and 16k tokens, a narrow layer (rho 0.15) keeps it; held-back fill bands do
    not count; other fabrics keep the ramp; ramp=True / False force it."""
    from kosmos_bench.kernels import ag_sm90

    m = ag_sm90.schedule_model("host")
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", model=m, stream_k=True)

    def first(M, N, **k):
        sch = S.build_schedule("ag-gemm", M, N, 16384, 8, 0, **kw, **k)
        return [len(g) for g in sch.meta["remote_groups"]][:3], sch.meta["ramp"]

    assert S.link_compute_ratio(13312, 132, "host", m) * 8 >= S.BALANCED_GROUP
    assert first(8192, 106496) == ([6, 6, 6], False) and first(16384, 106496)[1] is False
    assert first(8192, 106496, ramp=True) == ([1, 2, 4], True)
    assert first(8192, 106496, fill_bands=4)[1] is True  # 4 own bands first: 4 * 0.88 < 6
    assert first(8192, 18432, band_group=6)[1] is True  # rho 0.15
    assert S.ramp_needed(8, 13312, 132, 6, "nvlink") and not S.ramp_needed(8, 13312, 132, 6, "host", m)
