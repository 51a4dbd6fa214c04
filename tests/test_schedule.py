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


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])  # ag-wgrad: test_wgrad_items_cover_c_and_every_k
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
    kw = {"wgrad_items": "tile"}  # band items keep each tile's groups in order: test_wgrad_band_demand_order...
    a = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order=order, seed=3, num_wgs=8, **kw)
    b = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order=order, seed=3, num_wgs=8, **kw)
    _check_queues(a)
    for ta, tb in zip(a.queues, b.queues):
        assert np.array_equal(ta.queue, tb.queue), "deterministic for a seed"
    d = S.build_schedule(op, 3000 * W, 777 * W, K, W, 1, queue_order="demand", num_wgs=8, **kw)
    if order == "reverse":
        assert np.array_equal(a.builders.queue, d.builders.queue[::-1])
    if order == "fifo":
        assert np.array_equal(a.builders.queue, np.arange(len(a.builders)))


def test_own_bands_in_regular_groups():
    """The own bands (ready at entry) in regular demand groups (8 bands: one group, not 4, 2, 1,
    1; world 1: 11, ..., 11, 9)."""
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host")
    off = S.build_schedule("ag-gemm", 8192, 8 * 2048, 512, 8, 3, **kw)
    local = 8 * 8  # 8 own bands of 8 tiles, first
    m0 = [int(x) for x in off.builders.table[off.builders.queue][:local, S.F["m0"]]]
    assert m0[:8] == [128 * i for i in range(8)]  # one 8-band group: column 0 of every band first
    w1 = S.build_schedule("ag-gemm", 64 * 128, 2048, 512, 1, 0, **kw)
    t = w1.builders.table[w1.builders.queue]
    assert len({int(x) for x in t[:11, S.F["m0"]]}) == 11 and len({int(x) for x in t[-9:, S.F["m0"]]}) == 9


def test_local_group_sets_the_own_band_groups_only():
    """local_group=8 at world 1 (64 bands): eight 8-band groups (the standalone GEMM's raster)
    instead of ~sqrt(132) = 11; on a host rank the remote groups are unchanged."""
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host")
    w1 = S.build_schedule("ag-gemm", 64 * 128, 2048, 512, 1, 0, local_group=8, **kw)
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
    # the schedule's remote groups (configuration band_ramp / band_halve): the local segment is unchanged
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
    # every fabric with a link is capped: nvlink, the WGs that saturate it (360 / 30 GB/s; the
    # sm90 loader warpgroup moves half: 24)
    assert S.max_inflight_movers("ag-gemm", "nvlink", 132) == 12
    assert S.max_inflight_movers("ag-gemm", "nvlink", 132, {"wg_copy_gbs": 15.0}) == 24
    assert S.max_inflight_movers("gemm-rs", "nvlink", 132) == 36  # duplex 720 / 20 GB/s per tile mover
    assert S.max_inflight_movers("ag-gemm", "nvlink", 8) == 7  # never every WG
    assert S.max_inflight_movers("gemm-rs", "host", 132) >= S.max_inflight_movers("ag-gemm", "host", 132)
    # predicted on the host link: a handful of movers, not most of the GPU
    assert S.predicted_movers("ag-gemm", 8192, 8192, 8192, 8, 132, fabric="host") <= 16


def test_inflight_cap_override():
    """The configuration's max_inflight replaces the rule on every fabric (0: no cap)."""
    assert S.max_inflight_movers("ag-gemm", "host", 132, override=20) == 20
    assert S.max_inflight_movers("ag-gemm", "local", 16, override=20) == 15  # never every WG
    assert S.max_inflight_movers("ag-gemm", "host", 132, override=0) == 0
    kw = dict(BM=128, BN=128, num_wgs=16, fabric="host")
    assert S.build_schedule("ag-gemm", 1024, 1024, 256, 2, 0, max_inflight=3, **kw).max_inflight == 3
    assert S.build_schedule("ag-gemm", 1024, 1024, 256, 2, 0, max_inflight=3, policy="fixed:2", **kw).max_inflight == 0


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
    # op codes and item kinds: the enums of params.h / queue.cuh in schedule's order
    ops = re.search(r"enum KosmosOp \{([^}]*)\}", h).group(1)
    assert {k: int(v) for k, v in re.findall(r"KOSMOS_OP_(\w+) = (\d+)", ops)} == {
        op.upper().replace("-", "_"): c for op, c in abi.OP_CODES.items()}
    q = (Path(__file__).resolve().parents[1] / "csrc" / "kosmos" / "queue.cuh").read_text()
    kinds = re.findall(r"k(\w+) = (\d+)", re.search(r"enum ItemKind \{([^}]*)\}", q).group(1))
    camel = {n.replace("_", "").lower(): i for i, n in enumerate(S.KIND_NAMES)}
    assert {k.lower(): int(v) for k, v in kinds} == camel
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
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", model={"wg_tflops": 5.3}, ramp=True)
    sch = S.build_schedule("ag-gemm", 128 * 8 * W, n_loc * W, K, W, 0, **kw)
    t = sch.builders.table[sch.builders.queue]
    nt_n = sch.meta["n_tiles"]
    local = 8 * nt_n
    # local bands: ~sqrt(132)-band groups (regular: 8 bands, one group), column by column
    g0 = S.band_groups(8, 132, halve=False)[0]
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


def test_ramp_only_where_the_own_bands_do_not_cover_the_first_group():
    """ramp=None (default): on the host fabric the remote groups start at one band only when the
    own bands (built first) take the builders less long than the link takes for the first
    regular group (own_bands * rho < group): 405b FC1 (rho 0.88, 8 own bands, 6-band groups) has
    no ramp at 8k and 16k tokens, a narrow layer (rho 0.15) keeps it; other fabrics keep the
    ramp; ramp=True / False force it."""
    from kosmos_bench.kosmos import builder

    m = builder.schedule_model("host")
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", model=m, stream_k=True)

    def first(M, N, **k):
        sch = S.build_schedule("ag-gemm", M, N, 16384, 8, 0, **kw, **k)
        return [len(g) for g in sch.meta["remote_groups"]][:3], sch.meta["ramp"]

    assert S.link_compute_ratio(13312, 132, "host", m) * 8 >= S.BALANCED_GROUP
    assert first(8192, 106496) == ([6, 6, 6], False) and first(16384, 106496)[1] is False
    assert first(8192, 106496, ramp=True) == ([1, 2, 4], True)
    assert S.ramp_needed(4, 13312, 132, 6, "host", m)  # 4 own bands first: 4 * 0.88 < 6
    assert first(8192, 18432, band_group=6)[1] is True  # rho 0.15
    assert S.ramp_needed(8, 13312, 132, 6, "nvlink") and not S.ramp_needed(8, 13312, 132, 6, "host", m)


# ---------------------------------------------------------------------------------------
# ag-wgrad: the all-gather along the GEMM's K (tiles over all of K, bands waited for inside)


def _wgrad_k_order(sch: S.RankSchedule) -> list[int]:
    """The band flags of the tiles' K order: the own rows need none, then r+1's, r+2's, ..."""
    W, r, nb = sch.world, sch.rank, sch.meta["num_bands"]
    return [sch.flags.band + ((r + s) % W) * nb + j for s in range(1, W) for j in range(nb)]


@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_wgrad_items_cover_c_and_every_k(W):
    """Tiles cover C_r (M x N/W) once, each over all of K; movers pull every peer row of At
    once (byte ranges of M-element rows); every tile waits for the same remote bands, in ring
    order by rank (never by arrival), with kpart = rows per band."""
    M, N, K = 3000, 777 * W, 1000 * W  # k_loc 1000: 7 bands of 128 rows + one of 104
    for r in sorted({0, W - 1}):
        sch = S.build_schedule("ag-wgrad", M, N, K, W, r, BM=128, BN=256, num_wgs=16, mover_bytes=64 * 1024,
                               wgrad_items="tile")
        _check_queues(sch)
        bt, mv = sch.builders, sch.movers
        assert set(bt.col("kind")) == {S.AGW_BUILD} and len(sch.reduces) == 0
        cover = np.zeros((M, N // W), dtype=np.int32)
        for row in bt.table:
            m0, rr, n0, cc = row[2:6]
            cover[m0:m0 + rr, n0:n0 + cc] += 1
        assert np.all(cover == 1)
        assert bt.flops.sum() == 2.0 * M * (N // W) * K
        assert np.all(bt.col("kpart") == 128) and sch.meta["band_rows"] == 128 and sch.meta["k_loc"] == K // W
        order = _wgrad_k_order(sch)
        assert len(order) == (W - 1) * 8 == len(set(order))
        for i in range(len(bt)):
            assert bt.deps_of(i, sch.deps).tolist() == order
        # movers: every remote row of At exactly once, slices release their band's flag
        assert mv.bytes.sum() == (W - 1) * (K // W) * M * 2
        assert set(mv.col("kind")) <= {S.AG_PULL} and r not in set(mv.col("peer"))
        for f in np.unique(mv.col("rel_flag")):
            sel = mv.col("rel_flag") == f
            assert sch.flag_mult[f] == sel.sum() == mv.col("cols")[sel][0]
            rows = mv.col("rows")[sel][0]
            assert mv.bytes[sel].sum() == rows * M * 2
        assert sorted(set(mv.col("rel_flag").tolist())) == sorted(order)
        # demand: movers in ring order (the order the tiles need them)
        first = [int(mv.table[i, S.F["peer"]]) for i in mv.queue]
        assert first == sorted(first, key=lambda p: (p - r) % W)


def test_wgrad_k_order_is_the_ranks_not_the_queue_order():
    """Every queue order permutes the items; the tiles' K order (deps) stays the rank's."""
    W, r = 4, 2
    kw = {"BM": 128, "BN": 256, "num_wgs": 8, "wgrad_items": "tile"}
    base = S.build_schedule("ag-wgrad", 512, 1024, 4096, W, r, **kw)
    for order in ORDERS:
        sch = S.build_schedule("ag-wgrad", 512, 1024, 4096, W, r, queue_order=order, seed=3, **kw)
        _check_queues(sch)
        assert all(sch.builders.deps_of(i, sch.deps).tolist() == _wgrad_k_order(base) for i in range(len(sch.builders)))
    peers = [(f - base.flags.band) // base.meta["num_bands"] for f in _wgrad_k_order(base)]
    assert peers[0] == 3 and peers[-1] == 1 and sorted(set(peers)) == [0, 1, 3]


def test_wgrad_always_has_a_mover_cap():
    """Its tiles wait for the movers inside: a cap >= 1 on every fabric keeps movers going."""
    assert S.max_inflight_movers("ag-wgrad", "local", 16) == 15
    assert S.max_inflight_movers("ag-wgrad", "local", 16, override=0) == 1
    assert S.max_inflight_movers("ag-wgrad", "host", 132, override=0) == 1
    assert S.max_inflight_movers("ag-wgrad", "nvlink", 132) == S.max_inflight_movers("ag-gemm", "nvlink", 132)
    assert S.build_schedule("ag-wgrad", 512, 1024, 4096, 4, 0, num_wgs=8, fabric="local").max_inflight >= 1
    assert S.build_schedule("ag-wgrad", 512, 1024, 4096, 4, 0, num_wgs=8, policy="fixed:2").max_inflight == 0


def test_wgrad_without_a_cap_deadlocks_in_the_step_model():
    """Why the cap: with none, every WG claims a tile (always ready) and waits inside it (tile items;
    band items wait at claim time)."""
    sch = S.build_all("ag-wgrad", 64 * 8, 64 * 12, 64 * 3, 3, 6, BM=64, BN=64, wgrad_items="tile")
    for s in sch:
        s.max_inflight = 0
    with pytest.raises(RuntimeError, match="deadlock"):
        S.simulate_steps(sch)
    for s in sch:
        s.max_inflight = 1
    S.simulate_steps(sch)


def test_wgrad_validate_and_model():
    assert "K=1001" in S.validate("ag-wgrad", 512, 1024, 1001, 4)
    assert "N=1001" in S.validate("ag-wgrad", 512, 1001, 1024, 4)
    assert S.validate("ag-wgrad", 510, 1024, 1024, 4) is None  # M need not divide (C_r has all M rows)
    # link bytes: the peers' rows of At; predicted movers like ag-gemm's of the transposed shape
    assert S._comm_and_compute("ag-wgrad", 4096, 8192, 16384, 8)[0] == S._comm_and_compute("ag-gemm", 16384, 8192, 4096, 8)[0]
    assert S.predicted_movers("ag-wgrad", 4096, 8192, 16384, 8, 132, fabric="host") == S.predicted_movers(
        "ag-gemm", 16384, 8192, 4096, 8, 132, fabric="host")


# ag-wgrad band variant (wgrad_items='band'): (band group, tile) partials in a fixed order per tile


def _band_sched(W, r, **kw):
    kw = {"BM": 128, "BN": 256, "num_wgs": 16, "mover_bytes": 64 * 1024, "wgrad_items": "band", **kw}
    return S.build_schedule("ag-wgrad", 3000, 777 * W, 1000 * W, W, r, **kw)


def _check_band_items(sch, W, r, group):
    """tests below: the band schedule's items, deps and order flags (every assertion of the
    band layout; test_band_checks_fail_on_a_broken_schedule breaks it on purpose)."""
    M, N, K = 3000, 777 * W, 1000 * W
    bt, nb, tn = sch.builders, sch.meta["num_bands"], S.cdiv(M, 128) * S.cdiv(N // W, 256)
    gb = group or min(S.cdiv(2048, 128), nb)  # the rule: >= 2048 K rows a group, at most a shard
    # (peer, kpart, shards) of each group: the own shard whole (kpart -1), then gb <= nb: each ring
    # shard (r+1, r+2, ...) cut into groups of gb bands (a shard in one group: whole, -1); more:
    # ceil(gb / nb) ring shards a group (kpart -shards)
    n = S.cdiv(gb, nb)
    whole = gb >= nb
    want = [(r, -1, [r])] + (
        [((r + s) % W, -1 if whole else j * 128 * gb, [(r + s) % W]) for s in range(1, W) for j in range(S.cdiv(nb, gb))]
        if gb <= nb else [((r + 1 + i) % W, -c, [(r + 1 + i + j) % W for j in range(c)])
                          for i in range(0, W - 1, n) for c in [min(n, W - 1 - i)]])
    ng = sch.meta["num_groups"]
    assert set(bt.col("kind")) == {S.AGW_BAND} and ng == len(want) and len(bt) == ng * tn
    assert bt.flops.sum() == 2.0 * M * (N // W) * K
    tiles: dict = {}
    rel = {}
    for i, row in enumerate(bt.table.tolist()):
        tiles.setdefault((row[2], row[4]), []).append(i)
        if row[S.F["rel_flag"]] >= 0:
            assert row[S.F["rel_rank"]] == r and row[S.F["rel_flag"]] not in rel
            rel[row[S.F["rel_flag"]]] = i
    for (m0, n0), items in tiles.items():
        assert len(items) == ng
        cover = np.zeros((M, N // W), dtype=np.int32)
        m_, rr, n_, cc = bt.table[items[0], 2:6]
        cover[m_:m_ + rr, n_:n_ + cc] += 1
        kseen = []
        for g, i in enumerate(items):  # natural order = group order
            row = bt.table[i]
            p, k0 = int(row[S.F["peer"]]), int(row[S.F["kpart"]])
            assert p == want[g][0]
            kseen.append((p, k0))
            d = bt.deps_of(i, sch.deps).tolist()
            bands = [f for f in d if sch.flags.band <= f < sch.flags.built]
            if k0 >= 0:  # one shard's bands [k0 / 128, + gb)
                assert bands == ([] if p == r else
                                 [sch.flags.band + p * nb + k0 // 128 + j for j in range(min(gb, nb - k0 // 128))])
            else:  # whole shards: every band of each
                assert bands == [sch.flags.band + q * nb + j for q in want[g][2] if q != r for j in range(nb)]
            krows = min(128 * gb, 1000 - k0) if k0 >= 0 else 1000 * len(want[g][2])
            assert bt.flops[i] == 2.0 * row[3] * row[5] * krows
            # order flag (g, mt, nt) at built + g*m_tiles*n_tiles + mt*n_tiles + nt (FlagLayout)
            tile_flag = (m0 // 128) * S.cdiv(N // W, 256) + n0 // 256
            # (with both, group g waits for exactly the flag group g-1 of this tile releases)
            order = [f for f in d if f >= sch.flags.built]
            assert order == ([] if g == 0 else [sch.flags.built + (g - 1) * tn + tile_flag]), "order dep"
            release = -1 if g == ng - 1 else sch.flags.built + g * tn + tile_flag
            assert row[S.F["rel_flag"]] == release, "order release"
        assert kseen == [(p, k) for p, k, _ in want]
    assert sch.flags.num_flags == sch.flags.built + ng * tn
    assert np.all(sch.flag_mult[sch.flags.built:] == 1)


@pytest.mark.parametrize("W", [1, 2, 3, 8])
@pytest.mark.parametrize("group", [None, 1, 3, 8, 16, 24])
def test_wgrad_band_items_cover_every_tile_once_per_group(W, group):
    """Every tile once per group; the groups cover each shard's K rows once, own shard first,
    then r+1, r+2, ... (groups of bands, or of whole shards: 16 and 24 bands are 2 and 3 shards
    of 8 bands); per tile, group g waits for its bands and (g-1)'s order flag, which only
    (g-1, tile) releases; the last group releases nothing (it stores C)."""
    M, N, K = 3000, 777 * W, 1000 * W
    for r in sorted({0, W - 1}):
        sch = _band_sched(W, r, wgrad_group=group)
        _check_queues(sch)
        _check_band_items(sch, W, r, group)


@pytest.mark.parametrize("break_it,check", [("drop_order_dep", "order dep"), ("last_releases", "order release"),
                                             ("swapped_tile_flags", "order release")])
def test_band_checks_fail_on_a_broken_schedule(break_it, check):
    """Each order-flag assertion of _check_band_items catches its way of breaking the chain (the
    breaks keep every released flag distinct, so the duplicate-release check does not fire first)."""
    sch = _band_sched(2, 0)
    bt = sch.builders
    group0 = {(row[2], row[4]): i for i, row in reversed(list(enumerate(bt.table.tolist())))}
    items = [i for i, row in enumerate(bt.table.tolist()) if (row[2], row[4]) == (0, 0)]
    if break_it == "drop_order_dep":  # group 1 of tile (0, 0) no longer waits for group 0
        d0 = int(bt.table[items[1], S.F["dep_begin"]])
        for k in range(int(bt.table[items[1], S.F["dep_count"]])):
            if sch.deps[d0 + k] >= sch.flags.built:
                sch.deps[d0 + k] = sch.flags.entry
    elif break_it == "last_releases":  # the last group releases a flag nobody else does
        bt.table[items[-1], S.F["rel_rank"]], bt.table[items[-1], S.F["rel_flag"]] = 0, sch.flags.num_flags
    else:  # group 0 of tiles (0, 0) and (0, 256) release each other's order flag
        a, b = group0[0, 0], group0[0, 256]
        bt.table[[a, b], S.F["rel_flag"]] = bt.table[[b, a], S.F["rel_flag"]]
    with pytest.raises(AssertionError, match=check):
        _check_band_items(sch, 2, 0, None)


def test_wgrad_band_demand_order_follows_the_movers_and_every_order_keeps_each_tiles_groups():
    """demand: group g's tiles after group g-1's (the movers' order); fifo / reverse / random
    permute, but each tile's items stay in group order (never (g, t) before (g-1, t))."""
    W, r = 4, 1
    for order in ORDERS:
        sch = _band_sched(W, r, wgrad_group=2, queue_order=order, seed=5)
        _check_queues(sch)
        bt = sch.builders
        seen: dict = {}
        for i in sch.builders.queue.tolist():
            row = bt.table[i]
            t = (int(row[2]), int(row[4]))
            seen.setdefault(t, []).append(i)
        for items in seen.values():
            assert items == sorted(items)  # natural ids ascend with the group
        if order == "demand":  # natural ids are group-major: group of item i = i // tiles
            tn = len(bt) // sch.meta["num_groups"]
            gq = [int(i) // tn for i in bt.queue]
            assert gq == sorted(gq)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("policy", ["self", "fixed:1", "fixed:3"])
@pytest.mark.parametrize("W", [1, 2, 3])
def test_wgrad_band_is_deadlock_free(order, policy, W):
    """Every queue order and policy, even with one builder WG and no mover cap override."""
    for wgs in (4, 7):
        sch = S.build_all("ag-wgrad", 64 * 5, 64 * 4 * W, 64 * 6 * W, W, wgs * W, BM=64, BN=64, chunk=1,
                          policy=policy, queue_order=order, seed=2, wgrad_items="band", wgrad_group=2)
        S.simulate_steps(sch)
        S.simulate_steps(sch, durations=lambda rank, q, i: 1 + (7 * i + 3 * rank) % 5)


def test_wgrad_band_needs_no_claim_time_wait_and_rejects_bad_items():
    sch = _band_sched(2, 0, wgrad_group=1)
    assert not S.wgrad_tiles(sch) and S.wgrad_tiles(_band_sched(2, 0, wgrad_items="tile"))
    with pytest.raises(ValueError, match="wgrad_items"):
        _band_sched(2, 0, wgrad_items="tiles")
    assert S.wgrad_group_bands(128, 8) == 8 and S.wgrad_group_bands(128, 32) == 16
    assert S.wgrad_group_bands(4096, 8) == 1 and S.wgrad_group_bands(256, 32, 3) == 3
    assert S.wgrad_group_bands(128, 2, 5) == 5  # more than a shard: whole shards (wgrad_groups)
