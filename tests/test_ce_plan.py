"""Copy-engine mover plan (kosmos_bench/ce_plan.py): every byte of every remote band copied
exactly once, in consumer-demand order, flags released after their bytes, K-slices of the
last group slice-major and aligned the way the kernel's SliceWait reads them."""
import numpy as np
import pytest

from kosmos_bench import ce_plan
from kosmos_bench import schedule as S
from kosmos_bench.kernels import ag_sm90
from kosmos_bench.kosmos import builder


def _sched(M, N, K, W, r, wgs=132, stream_k=False):  # as kosmos.py builds it for the sm90 builder
    return S.build_schedule("ag-gemm", M, N, K, W, r, BM=128, BN=256, num_wgs=wgs, fabric="host",
                            stream_k=stream_k, model=builder.schedule_model("host"))


def _band_flags(sch) -> dict:
    """(peer, M-tile) -> the band's flag."""
    return {(int(t[S.F["peer"]]), int(t[S.F["m0"]]) // 128): int(t[S.F["rel_flag"]]) for t in sch.movers.table}


def _assert_remote_bytes_once(cover, W, r, m_loc):
    for p in range(W):  # own rows are never copied, every remote byte once
        want = 0 if p == r else 1
        assert np.all(cover[p * m_loc:(p + 1) * m_loc] == want), p


def _replay(sch, plan, K, m_loc, epoch=3):
    """Bytes covered per band row/col, and the flag values seen in order."""
    W = sch.world
    cover = np.zeros((W * m_loc, K), dtype=np.int32)
    flags: dict[int, list[int]] = {}
    last = None
    for e in plan:
        if e.rows:
            cover[e.peer * m_loc + e.row0:e.peer * m_loc + e.row0 + e.rows, e.col0:e.col0 + e.cols] += 1
            last = e
        assert last is not None, "a release before any copy"
        flags.setdefault(e.flag, []).append(e.value(epoch))
    return cover, flags


@pytest.mark.parametrize("slices", [1, 4, 8, 1000])
@pytest.mark.parametrize("shape", [(8192, 57344, 8192), (3000 * 8, 776 * 8, 1000), (1024, 2048, 96)])
def test_plan_covers_every_remote_byte_once_and_releases_every_band(shape, slices):
    M, N, K = shape
    W, r = 8, 3
    m_loc = M // W
    sch = _sched(M, N, K, W, r, stream_k=slices > 1)
    plan, mult = ce_plan.build(sch, K, slices, bk=64)
    cover, flags = _replay(sch, plan, K, m_loc)
    _assert_remote_bytes_once(cover, W, r, m_loc)
    bands = {int(x) for x in sch.movers.table[:, S.F["rel_flag"]]}
    assert set(flags) == bands == set(mult)
    for f, vals in flags.items():  # K-slices arrive in order; the last release completes the band
        assert vals == sorted(vals) and vals[-1] == mult[f] * 3 and len(vals) == mult[f]
        assert vals[0] == mult[f] * 2 + 1  # the first slice: what a builder claims on (dep_target)
    nkb = -(-K // 64)
    flag_of = _band_flags(sch)
    groups = sch.meta["remote_groups"]
    for g, grp in enumerate(groups):  # the last group: `slices`; others: whole
        want = slices if g == len(groups) - 1 else 1
        assert {mult[flag_of[b]] for b in grp} == {max(1, min(nkb, want))}, (g, grp)


def test_only_the_last_group_is_sliced_slice_major_and_copies_follow_demand():
    M, N, K, W, r = 8192, 57344, 8192, 8, 0
    sch = _sched(M, N, K, W, r, stream_k=True)
    plan, mult = ce_plan.build(sch, K, 4)
    flag_of = _band_flags(sch)
    groups = sch.meta["remote_groups"]
    assert {f for f, m in mult.items() if m == 4} == {flag_of[b] for b in groups[-1]}
    assert all(m == 1 for f, m in mult.items() if f not in {flag_of[b] for b in groups[-1]})
    copies = [e for e in plan if e.rows]
    peers = [len({p for p, _ in g}) for g in groups]  # one copy per peer run of a group
    assert len(copies) == sum(peers[:-1]) + 4 * peers[-1]
    tail = copies[-4 * peers[-1]:]
    assert all(e.cols < K for e in tail) and all(e.cols == K for e in copies[:-len(tail)])
    assert [(e.col0, e.col0 + e.cols) for e in tail[::peers[-1]]] == ce_plan.slice_cols(K, 4, 64)
    order = [(e.peer, e.row0) for e in copies if e.cols == K]  # demand order: ring r+1, r+2, ..., bands ascending
    assert order == sorted(order, key=lambda x: ((x[0] - r) % W, x[1]))


def test_slice_cols_match_the_kernel_slice_of_k():
    for K in (96, 1000, 8192, 16384):
        nkb = -(-K // 64)
        for slices in range(1, min(nkb, 12) + 1):
            cols = ce_plan.slice_cols(K, slices, 64)
            assert cols[0][0] == 0 and cols[-1][1] == K
            assert all(a[1] == b[0] for a, b in zip(cols, cols[1:]))
            for k in range(nkb):  # csrc/ag_gemm_sm90.cu SliceWait: need = ceil((k+1)*mult/nkb)
                need = -(-(k + 1) * slices // nkb)
                c0, c1 = cols[need - 1]
                assert c0 <= k * 64 < c1


def test_stream_k_groups_end_at_one_wave_of_tiles():
    sch = _sched(8192, 57344, 8192, 8, 0, stream_k=True)  # 28 N tiles: 132 // 28 = 4 bands
    sizes = [len(g) for g in sch.meta["remote_groups"]]
    assert sizes[-1] == 4 and sum(sizes) == 56
    for M in (16384, 8192 + 8 * 128 * 3):  # no smaller remainder after the one-wave group
        sizes = [len(g) for g in _sched(M, 57344, 8192, 8, 0, stream_k=True).meta["remote_groups"]]
        assert sizes[-1] == 4 and sum(sizes) == 7 * M // 8 // 128, sizes
    plain = _sched(8192, 57344, 8192, 8, 0)
    assert [len(g) for g in plain.meta["remote_groups"]][-1] == 1


def test_bad_slices():
    sch = _sched(1024, 2048, 96, 8, 0)
    with pytest.raises(ValueError, match="slices"):
        ce_plan.build(sch, 96, 0)


@pytest.mark.parametrize("split", [(3, 1), (1, 2, 1), (7, 1), (1, 1)])
@pytest.mark.parametrize("shape", [(8192, 57344, 8192), (1024, 2048, 512)])
def test_split_merges_slices_into_fewer_copies(shape, split):
    """split (3, 1): 4 kernel slices, 2 copies per band of the last group: the first carries 3/4
    of K and releases "3 slices there", the last the final quarter; every byte once."""
    M, N, K = shape
    W, r = 8, 5
    m_loc, n = M // W, sum(split)
    sch = _sched(M, N, K, W, r, stream_k=True)
    plan, mult = ce_plan.build(sch, K, n, bk=64, split=split)
    cover, flags = _replay(sch, plan, K, m_loc)
    _assert_remote_bytes_once(cover, W, r, m_loc)
    flag_of = _band_flags(sch)
    last = {flag_of[b] for b in sch.meta["remote_groups"][-1]}
    cols = ce_plan.slice_cols(K, n, 64)
    ends = list(np.cumsum(split))
    for f, vals in flags.items():
        if f in last:  # one release per copy, each saying how many of the n slices are there
            assert mult[f] == n and vals == [n * 3 - (n - e) for e in ends]
        else:
            assert mult[f] == 1 and vals == [3]
    tail = [e for e in plan if e.rows and e.flag in last]
    bounds = [(cols[e0 - s][0], cols[e0 - 1][1]) for s, e0 in zip(split, ends)]
    assert sorted({(e.col0, e.col0 + e.cols) for e in tail}) == bounds


def test_bad_split():
    sch = _sched(8192, 57344, 8192, 8, 0, stream_k=True)
    with pytest.raises(ValueError, match="add up"):
        ce_plan.build(sch, 8192, 4, split=(2, 1))
    with pytest.raises(ValueError, match="parts >= 1"):
        ce_plan.parse_split("3,0")
    with pytest.raises(ValueError, match="parts >= 1"):
        ce_plan.parse_split("x")
    with pytest.raises(ValueError, match="need K"):
        ce_plan.build(_sched(1024, 2048, 128, 8, 0, stream_k=True), 128, 4, split=(3, 1))
    assert ce_plan.parse_split(3) == (1, 1, 1) and ce_plan.parse_split("3, 1") == (3, 1)


@pytest.mark.parametrize("shape", [(8192, 57344, 8192), (16384, 106496, 16384), (3000 * 8, 776 * 8, 1000)])
def test_merge_copies_each_peer_once_before_the_sliced_groups(shape):
    """merge: one copy per peer (its bands outside the sliced tail groups), whatever the demand
    groups; every byte once, every band released once after its bytes; the tail unchanged."""
    M, N, K = shape
    W, r = 8, 2
    m_loc = M // W
    sch = _sched(M, N, K, W, r, stream_k=True)
    plan, mult = ce_plan.build(sch, K, 2, bk=64, merge=True)
    ref, ref_mult = ce_plan.build(sch, K, 2, bk=64)
    assert mult == ref_mult
    cover, flags = _replay(sch, plan, K, m_loc)
    _assert_remote_bytes_once(cover, W, r, m_loc)
    flag_of = _band_flags(sch)
    tail_flags = {flag_of[b] for b in sch.meta["remote_groups"][-1]}
    head = [e for e in plan if e.flag not in tail_flags]
    assert all(flags[e.flag] == [3] for e in head)  # whole bands, one release each
    copies = [e for e in head if e.rows]
    per_peer = {p: [e.rows // 128 for e in copies if e.peer == p] for p in range(W) if p != r}
    last = copies[-1].peer  # its run before the tail is cut ..., 4, 2, 1 bands; others: one copy
    assert all(len(v) == 1 for p, v in per_peer.items() if p != last)
    assert per_peer[last] == [len(x) for x in ce_plan.halving(list(range(sum(per_peer[last]))))]
    assert len([e for e in ref if e.rows and e.flag not in tail_flags]) > len(copies)  # groups: more copies
    assert [e for e in plan if e.flag in tail_flags] == [e for e in ref if e.flag in tail_flags]


def test_halving_sizes():
    sizes = {n: [len(x) for x in ce_plan.halving(list(range(n)))] for n in (1, 2, 3, 7, 8, 15, 16)}
    assert sizes == {1: [1], 2: [1, 1], 3: [2, 1], 7: [4, 2, 1], 8: [5, 2, 1], 15: [8, 4, 2, 1], 16: [9, 4, 2, 1]}
    assert sum(ce_plan.halving(list(range(11))), []) == list(range(11))


@pytest.mark.parametrize("shape", [(8192, 57344, 8192), (16384, 57344, 8192), (3000 * 8, 776 * 8, 1000)])
def test_peer_groups_need_fewer_copies_and_cover_every_byte(shape):
    """band_group="peer": no group straddles two peers, so the plan copies each middle peer once
    and the whole plan needs fewer copies than the default groups; still every byte once."""
    M, N, K = shape
    W, r = 8, 0
    m_loc = M // W
    kw = dict(BM=128, BN=256, num_wgs=132, fabric="host", stream_k=True, model=builder.schedule_model("host"))
    sch = S.build_schedule("ag-gemm", M, N, K, W, r, band_group=S.PEER_GROUPS, **kw)
    for grp in sch.meta["remote_groups"]:
        assert len({p for p, _ in grp}) == 1, grp
    plan, _ = ce_plan.build(sch, K, 2, bk=64)
    cover, _ = _replay(sch, plan, K, m_loc)
    _assert_remote_bytes_once(cover, W, r, m_loc)
    copies = [e for e in plan if e.rows]
    ring = [(r + i) % W for i in range(1, W)]
    for p in ring[1:-1]:
        assert sum(e.peer == p for e in copies) == 1, p
    default, _ = ce_plan.build(S.build_schedule("ag-gemm", M, N, K, W, r, **kw), K, 2, bk=64)
    assert len(copies) < sum(1 for e in default if e.rows)


def _values_after_each_copy(plan, epoch=3):
    """{flag: value} after each copy and the releases that follow it."""
    out, cur = [], {}
    for i, e in enumerate(plan):
        cur[e.flag] = e.value(epoch)
        if i + 1 == len(plan) or plan[i + 1].rows:
            out.append(dict(cur))
    return out


@pytest.mark.parametrize("kw", [dict(slices=1), dict(slices=3), dict(slices=4, split=(3, 1)), dict(slices=2, merge=True)])
@pytest.mark.parametrize("shape", [(8192, 57344, 8192), (16384, 106496, 16384), (3000 * 8, 776 * 8, 1000)])
def test_share_flags_one_release_per_copy_and_the_same_values_where_read(shape, kw):
    """share_flags: the copies unchanged, one release per copy, and at every point between two
    copies each band's (shared) flag reads what its own flag read in the per-band plan, so a
    builder waiting on it sees exactly the slices of its band that are there."""
    M, N, K = shape
    W, r = 8, 1
    sch = _sched(M, N, K, W, r, stream_k=kw["slices"] > 1)
    kw = dict(kw)
    plan, _ = ce_plan.build(sch, K, kw.pop("slices"), bk=64, **kw)
    shared, alias = ce_plan.share_flags(plan)
    assert [e for e in shared if e.rows] == [e for e in plan if e.rows]
    assert all(e.rows for e in shared) and len(shared) < len(plan)  # every release rides on its copy
    bands = {e.flag for e in plan}
    assert set(alias) == bands - {e.flag for e in shared} and not set(alias.values()) - {e.flag for e in shared}
    for before, after in zip(_values_after_each_copy(plan), _values_after_each_copy(shared), strict=True):
        for f in before:
            assert after.get(alias.get(f, f)) == before[f], f


def test_share_flags_keeps_a_release_it_cannot_fold():
    E = ce_plan.CeEntry
    plan = [E(1, 0, 256, 0, 64, 10, 2, 1), E(1, 0, 0, 0, 64, 11, 2, 1),  # band 11 rides on copy 10 ...
            E(1, 0, 256, 64, 64, 10, 2, 0), E(1, 0, 0, 0, 64, 11, 2, 0),
            E(2, 0, 128, 0, 128, 20, 1, 0), E(2, 0, 0, 0, 128, 21, 1, 0),  # ... 21 on 20 ...
            E(3, 0, 128, 0, 128, 30, 1, 0), E(3, 0, 0, 0, 128, 21, 1, 0)]  # ... and again on 30: kept
    shared, alias = ce_plan.share_flags(plan)
    assert alias == {11: 10}
    assert [e.flag for e in shared] == [10, 10, 20, 21, 30, 21]


# ---- gemm-rs (ce_plan.build_rs) ----

@pytest.mark.parametrize("W,M,N,K,chunk", [(8, 8192, 8192, 8192, 1), (8, 8000, 1064, 1600, 1), (3, 3000, 520, 999, 2),
                                           (5, 5000, 4096, 1000, 1), (8, 16384, 8192, 28672, 1)])
def test_build_rs_covers_every_tile_once_in_demand_order(W, M, N, K, chunk):
    """Pushes: the other destinations' staging rows [m_loc, M) in demand order, each row in exactly
    one copy; every partial tile of another destination aliased to the counter of the copy holding
    its rows, each counter's multiplicity its tile count; copies ramp 1, 2, 4, ... bands and stay
    within RS_PUSH_MAX_BYTES. Proxies: one per peer, whole band r, every arrival flag of the peer
    aliased to its flag."""
    from kosmos_bench.ce_plan import RS_PUSH_MAX_BYTES, build_rs

    sch = S.build_schedule("gemm-rs", M, N, K, W, 0, BN=256, chunk=chunk, fabric="host")
    rs = build_rs(sch)
    lay, mt_n, nt_n = sch.flags, sch.meta["m_tiles"], sch.meta["n_tiles"]
    m_loc, band = M // W, 128 * chunk
    g = m_loc
    for c in rs.pushes:  # global staging rows, back to back
        g0 = c.dest * m_loc + c.row0
        assert g0 == g and c.rows > 0 and c.row0 % band == 0
        g = g0 + c.rows
        assert c.rows * N * 2 <= max(RS_PUSH_MAX_BYTES, band * N * 2)
        mine = [f for f, to in rs.built_alias.items() if to == c.wait]
        assert rs.flag_mult[c.wait] == c.tiles == len(mine)
        for f in mine:
            d, rest = divmod(f - lay.built, mt_n * nt_n)
            row = d * m_loc + rest // nt_n * 128
            assert g0 <= row < g
    assert g == M
    assert len(rs.built_alias) == (W - 1) * mt_n * nt_n
    assert rs.pushes[0].rows == min(band, m_loc)  # the link starts after one band's tiles
    assert [e.peer for e in rs.proxies] == list(range(1, W))
    assert all(e.rows == m_loc and e.cols == N and e.mult == 1 and e.back == 0 for e in rs.proxies)
    assert len(rs.arrival_alias) == (W - 1) * sch.meta["num_bands"] * nt_n
    assert set(rs.arrival_alias.values()) == {e.flag for e in rs.proxies}


def test_ramp_sizes():
    from kosmos_bench.ce_plan import ramp_sizes

    assert ramp_sizes(56, 8) == [1, 2, 4, 7, 7, 7, 7, 7, 7, 4, 2, 1]
    assert ramp_sizes(1, 8) == [1] and ramp_sizes(3, 1) == [1, 1, 1]
    for n in range(1, 80):
        for cap in (1, 2, 5, 8, 64):
            sz = ramp_sizes(n, cap)
            assert sum(sz) == n and max(sz) <= max(cap, 1) and sz[0] == 1


def test_build_rs_refuses_ag_gemm():
    from kosmos_bench.ce_plan import build_rs

    with pytest.raises(ValueError):
        build_rs(S.build_schedule("ag-gemm", 1024, 1024, 1024, 2, 0))


# ---- ag-wgrad (the same plan over At's rows: K x M gathered along K) ----

def _wgrad_plan(M, N, K, W, chunk=1, items="tile", group=0, wgs=132):
    """The runner's plan (kosmos.plan.plan) of a host ag-wgrad point with copy-engine movers."""
    from kosmos_bench.kosmos.config import KosmosConfig
    from kosmos_bench.kosmos.plan import plan
    from kosmos_bench.point import Point

    knobs = (("wgrad_items", items),) + ((("wgrad_group", group),) if items == "band" else ())
    p = Point("ag-wgrad", "kosmos", M, N, K, W, fabric="host", policy="self", mover="ce", chunk=chunk, knobs=knobs)
    return plan(p, KosmosConfig.from_point(p), {0: wgs}, builder="sm90")


@pytest.mark.parametrize("shape,chunk", [((8192, 57344, 8192), 1), ((16384, 16384, 8192), 2), ((264, 1088, 1600), 1),
                                         ((1024, 2048, 4096), 2), ((4096, 4096, 8 * 8 * 128 * 3), 1)])
def test_wgrad_plan_covers_every_remote_band_once_in_the_tiles_k_order(shape, chunk):
    """ag-wgrad with copy-engine movers: the ag-gemm plan over At's rows (whole rows of M columns,
    no K-slices); every remote row of At copied exactly once, one copy per peer in ring order; the
    kernel's per-band waits (band_wait: deps[dep_begin + (s-1)*nb + j] of every tile, read through
    ce_rank_arrays) each wait for a flag that only reaches its target once that band's bytes are
    in, and in the tiles' K order the flags complete in copy order (no tile waits on a band that a
    later copy brings while an earlier band of its K order is still missing)."""
    from kosmos_bench.kosmos.plan import ce_rank_arrays

    M, N, K = shape
    W, r, epoch = 8, 0, 5
    pl = _wgrad_plan(M, N, K, W, chunk)
    sch = pl.scheds[r]
    k_loc, nb, band_rows = K // W, sch.meta["num_bands"], sch.meta["band_rows"]
    assert not pl.resolved.k_stream and pl.ce_slices == 1
    cover, _ = _replay(sch, pl.ce_entries, M, k_loc, epoch)
    _assert_remote_bytes_once(cover, W, r, k_loc)
    copies = [e for e in pl.ce_shared if e.rows]
    ring = [(r + i) % W for i in range(1, W)]
    assert [e.peer for e in copies] == ring and all(e.col0 == 0 and e.cols == M for e in copies)
    assert all(e.rows for e in pl.ce_shared), "one release per copy"
    arrs = ce_rank_arrays(pl, sch.arrays())
    deps, mult = arrs["deps"], arrs["flag_mult"]
    # the flag values after each copy of the shared plan (its release rides on the copy)
    landed, value = [], {}
    for e in pl.ce_shared:
        value[e.flag] = e.value(epoch)
        landed.append(dict(value))
    tiles = sch.builders.table
    assert len(tiles) and set(tiles[:, S.F["kind"]].tolist()) == {S.AGW_BUILD}
    for t in tiles[:3]:
        d0, dn = int(t[S.F["dep_begin"]]), int(t[S.F["dep_count"]])
        assert dn == (W - 1) * nb and int(t[S.F["kpart"]]) == band_rows
        first_copy = []  # per wait in K order: the first copy after which it is satisfied
        for s in range(1, W):
            for j in range(nb):
                f = int(deps[d0 + (s - 1) * nb + j])
                target = epoch * int(mult[f])
                c = next(i for i, v in enumerate(landed) if v.get(f, 0) >= target)
                e = copies[c]
                assert e.peer == ring[s - 1] and e.row0 <= j * band_rows < e.row0 + e.rows, (s, j, e)
                assert all(v.get(f, 0) < target for v in landed[:c]), "a flag is complete before its bytes"
                first_copy.append(c)
        assert first_copy == sorted(first_copy)


def test_wgrad_band_items_copy_each_remote_group_together():
    """wgrad_items=band (simulator only): the copies follow the schedule's band groups, so a
    group's items are released when its own bands land, not the peer's last ones."""
    M, N, K, W = 8192, 57344, 8192, 8
    for group, per_peer in ((2, 4), (4, 2), (0, 1)):
        pl = _wgrad_plan(M, N, K, W, items="band", group=group)
        sch = pl.scheds[0]
        copies = [e for e in pl.ce_entries if e.rows]
        assert len(copies) == (W - 1) * per_peer, group
        rows = sch.meta["group_rows"]
        assert all(e.rows == rows and e.row0 % rows == 0 for e in copies)
        cover, _ = _replay(sch, pl.ce_entries, M, K // W)
        _assert_remote_bytes_once(cover, W, 0, K // W)
