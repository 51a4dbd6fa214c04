"""CPU tests of the ag-wgrad band items' kernel side (wgrad_items=band; csrc/ag_gemm_sm90.cu, A-transposed
build): the C ABI mirror (RankArgs.carry, Params.wgrad_group_rows), the runner's launch fields, and a torch
emulation of what the kernel does with the arrays the runner hands it (the schedule's items after
kosmos.plan.ce_rank_arrays): an item runs once its deps are at their targets (decide()), reads its band
group's K rows, adds into the fp32 carry in the kernel's rule (first: peer == rank at row 0, last: no
release) and releases its order flag. Any arrival order and any claim order among ready items must give the
same bits, and every tile must sum every K row exactly once. The kernel itself runs in
tests/test_backward_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kosmos_bench import schedule as S
from kosmos_bench.impls.kosmos import carry_floats, wgrad_group_rows
from kosmos_bench.kernels import abi
from kosmos_bench.kosmos.config import KosmosConfig
from kosmos_bench.kosmos.plan import ce_rank_arrays, plan
from kosmos_bench.point import Point

BK = 64


def test_abi_layout_matches_the_c_structs():
    """Every RankArgs / Params field of the ctypes mirror at the C offset (the main library, built if needed)."""
    from kosmos_bench import kernels
    from kosmos_bench.kernels import libs

    try:
        lib = kernels.load()
    except libs.ToolchainMissing as e:
        pytest.skip(str(e))
    assert abi.layout_mismatches(lib) == []
    assert lib.kosmos_abi_version() == abi.ABI_VERSION == 9
    # the two fields of the band items, where the kernel reads them
    assert abi.RankArgs.carry.offset == abi.RankArgs.work.offset + 8
    assert abi.Params.wgrad_group_rows.offset == abi.Params.spin_ns.offset + 4


def _plan(W, M, N, K, fabric, mover, group=0, chunk=1, items="band", rank=0, wgs=16):
    p = Point("ag-wgrad", "kosmos", M, N, K, W, fabric=fabric, policy="self", mover=mover, chunk=chunk,
              knobs=(("wgrad_items", items),) + ((("wgrad_group", group),) if group else ()))
    return plan(p, KosmosConfig.from_point(p), {rank: wgs}, builder="sm90")


def test_launch_fields_of_band_and_tile_schedules():
    pl = _plan(8, 264, 136 * 8, 200 * 8, "host", "ce", group=1)
    s = pl.scheds[0]
    assert wgrad_group_rows(s) == 128 and wgrad_group_rows(s) % BK == 0
    assert carry_floats(s) == 3 * 1 * 128 * 256  # 264 x 136: 3 x 1 tiles of 128 x 256, padded
    assert wgrad_group_rows(_plan(8, 264, 136 * 8, 200 * 8, "host", "ce").scheds[0]) == 256  # one group per shard
    assert wgrad_group_rows(_plan(8, 264, 136 * 8, 200 * 8, "host", "ce", items="tile").scheds[0]) == 0


def _arrivals(pl, s, arrs, mover):
    """The arrival events of rank 0's remote rows, in the order they land: (flag updates, rows landed)."""
    k_loc = s.meta["k_loc"]
    if mover == "ce":
        for e in pl.ce_shared:
            yield [(e.flag, e.value(1))], ([(e.peer, e.row0, e.rows)] if e.rows else [])
        return
    mv = s.movers.table
    done: dict = {}
    for i in s.movers.queue:  # every slice of a band, in the queue's order
        row = mv[i]
        peer, m0, rows, f = (int(row[S.F[k]]) for k in ("peer", "m0", "rows", "rel_flag"))
        done[peer, m0] = done.get((peer, m0), 0) + 1
        full = done[peer, m0] == int(arrs["flag_mult"][f])
        assert m0 + rows <= k_loc
        yield [(f, None)], ([(peer, m0, rows)] if full else [])


def emulate(pl, At, B, seed):
    """Rank 0's band items as the kernel runs them (see the module docstring); returns C_0 (bf16)."""
    s = pl.scheds[0]
    r, W, M = s.rank, s.world, s.M
    mover = pl.config.mover
    arrs = s.arrays()
    if mover == "ce":
        arrs = ce_rank_arrays(pl, arrs)
    items = arrs["builder_items"].reshape(-1, S.ITEM_STRIDE)
    deps, mult = arrs["deps"], arrs["flag_mult"].astype(np.int64)
    k_loc, group_rows = s.meta["k_loc"], wgrad_group_rows(s)
    n_loc = B.shape[1]
    # flags: the builders' (order flags) and the movers' / copies' start at 0, every other one is ready
    # (entry / exit handshake, peers' flags on the host fabric)
    flags = mult.copy()
    flags[items[:, S.F["rel_flag"]][items[:, S.F["rel_flag"]] >= 0]] = 0
    events = list(_arrivals(pl, s, arrs, mover))
    for ups, _ in events:
        for f, _ in ups:
            flags[f] = 0
    landed = {p: np.zeros(k_loc, dtype=bool) for p in range(W)}
    landed[r][:] = True
    rng = np.random.default_rng(seed)
    carry: dict = {}
    C = torch.full((M, n_loc), float("nan"), dtype=torch.bfloat16)
    cover = torch.zeros(M, n_loc, W * k_loc // 8, dtype=torch.int32)  # K rows summed per element (/8: rows come in 8s)
    done = np.zeros(len(items), dtype=bool)

    def ready(i):
        b, c = items[i, S.F["dep_begin"]], items[i, S.F["dep_count"]]
        return bool(np.all(flags[deps[b:b + c]] >= mult[deps[b:b + c]]))

    def run(i):
        kind, peer, m0, rows, n0, cols, _, _, rel_rank, rel_flag, kpart = (int(x) for x in items[i])
        assert kind == S.AGW_BAND
        # (shard, first row, rows) in the item's K order: a span of one shard, or -kpart whole shards
        spans = ([(peer, kpart, min(group_rows, k_loc - kpart))] if kpart >= 0 else
                 [((peer + j) % W, 0, k_loc) for j in range(-kpart)])
        ks = []
        for p, k0, krows in spans:
            assert krows > 0 and k0 % BK == 0 and (kpart >= 0 or p != r or kpart == -1)
            assert landed[p][k0:k0 + krows].all(), f"item {i} ran before its rows of rank {p} landed"
            ks.append(torch.arange(p * k_loc + k0, p * k_loc + k0 + krows))
            cover[m0:m0 + rows, n0:n0 + cols, (p * k_loc + k0) // 8:(p * k_loc + k0 + krows + 7) // 8] += 1
        ks = torch.cat(ks)
        part = At[ks, m0:m0 + rows].float().t() @ B[ks, n0:n0 + cols].float()
        t = (m0 // s.BM, n0 // s.BN)
        first, last = peer == r, rel_flag < 0  # the own shard: always the first group, whole
        if not first:
            part = part + carry[t]  # the previous group's carry (a KeyError: a group ran out of order)
        if last:
            C[m0:m0 + rows, n0:n0 + cols] = part.to(torch.bfloat16)
            carry.pop(t)
        else:
            carry[t] = part
            assert rel_rank == r
            flags[rel_flag] += 1
        done[i] = True

    def drain():
        while True:
            ok = [i for i in np.flatnonzero(~done) if ready(i)]
            if not ok:
                return
            run(int(rng.choice(ok)))  # any ready item may be claimed first

    drain()
    for ups, rows in events:
        for f, v in ups:
            flags[f] = v if v is not None else flags[f] + 1
        for peer, row0, n in rows:
            landed[peer][row0:row0 + n] = True
        if rng.random() < 0.7:  # arrivals sometimes come in bursts
            drain()
    drain()
    assert done.all(), f"{int((~done).sum())} band items never became ready (deadlock)"
    assert not carry, "a tile's last group did not end its carry"
    assert bool((cover == 1).all()), "some tile element does not sum every K row exactly once"
    return C


@pytest.mark.parametrize("W,fabric,mover,group,chunk", [
    (2, "local", "sm", 0, 1), (3, "local", "sm", 1, 1), (8, "local", "sm", 1, 1),
    (8, "host", "sm", 0, 1), (8, "host", "sm", 1, 1), (8, "host", "ce", 0, 1), (8, "host", "ce", 1, 1),
    (4, "host", "ce", 1, 2), (8, "host", "ce", 4, 1), (8, "local", "sm", 5, 1), (8, "host", "sm", 16, 1)])
def test_band_items_sum_in_one_order_whatever_the_arrivals(W, fabric, mover, group, chunk):
    """K/W = 200 (a shard's last band 72 rows, a partial k-block), M = 264 and N/W = 136 (partial
    tiles); groups of one band (wgrad_group 1), the default (one group per shard here), or of whole
    shards: 4 bands (2 shards a group), 5 (3 shards; the last group 1), 16 (all remote shards)."""
    M, N, K = 264, 136 * W, 200 * W
    pl = _plan(W, M, N, K, fabric, mover, group=group, chunk=chunk)
    assert pl.config.mover == mover
    g = torch.Generator().manual_seed(5)
    At = torch.randn(K, M, generator=g).to(torch.bfloat16)
    B = torch.randn(K, N // W, generator=g).to(torch.bfloat16)
    ref = At.float().t() @ B.float()
    outs = [emulate(pl, At, B, seed) for seed in range(3)]
    assert torch.allclose(outs[0].float(), ref, rtol=2e-2, atol=0.3)
    for o in outs[1:]:
        assert torch.equal(outs[0], o), "band items: different bits for another arrival / claim order"
