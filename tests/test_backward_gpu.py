"""The backward ops and the layer step on a GPU: kosmos (forward kernels, B_r read transposed; ag-wgrad:
the sm90 A-transposed kernel, tile and band items) on the local fabric at W = 2..8 and every implementation on the host
fabric; correct against the fp32 reference (the layer: outputs and every weight gradient) and
bitwise the same over 20 calls."""
from __future__ import annotations

import pytest

from kosmos_bench.point import Point

CALLS = 20


def _check(p: Point) -> dict:
    """Poisoned outputs, 20 calls: wrong elements (first call) and whether every call is bitwise equal."""
    import torch

    from kosmos_bench.harness import seed_for
    from kosmos_bench.impls import get_impl
    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.ops import get_op

    op, impl = get_op(p.op), get_impl(p.impl)
    from kosmos_bench.harness import skip_reason
    from kosmos_bench.impls import layer

    why = skip_reason(p)
    assert why is None, why
    dev = torch.device("cuda", 0)
    ctx = RankCtx(rank=0, world=p.world, procs=1, device=dev, fabric=p.fabric, backend="gpu")
    ranks = list(range(p.world))
    inputs, A, B = op.inputs(p, ranks, dev, seed_for(p))
    runner = layer.prepare(p, ctx, inputs) if p.op == "layer" else impl.prepare(p, ctx, inputs)
    try:
        first, wrong, same = None, 0, True
        for _ in range(CALLS):
            for o in runner.outputs.values():
                o.fill_(float("nan"))
            runner.run()
            torch.cuda.synchronize(dev)
            if hasattr(runner, "check"):
                runner.check()
            outs = {r: o.clone() for r, o in runner.outputs.items()}
            if first is None:
                first = outs
                for r in ctx.ranks_here:
                    wrong += op.check(outs[r], op.reference(A, B, r, p.world), p.dtype, B)[0]
            else:
                same = same and all(torch.equal(first[r], outs[r]) for r in outs)
        return {"wrong": wrong, "same": same, "info": dict(getattr(runner, "info", None) or {})}
    finally:
        runner.close()


def _shape(op: str, W: int) -> tuple[int, int, int]:
    # awkward but TMA-legal: partial tiles in M, N and K, N/W (resp. K/W) a multiple of 8
    return {"ag-gemm-dgrad": (200 * W, 136 * W, 264), "gemm-rs-dgrad": (136 * W, 264, 72 * W),
            "ag-wgrad": (264, 136 * W, 200 * W)}[op]


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("op", ["ag-gemm-dgrad", "gemm-rs-dgrad"])
def test_kosmos_dgrad_local(op, world):
    r = _check(Point(op, "kosmos", *_shape(op, world), world, fabric="local", policy="self"))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("impl", ["kosmos", "nccl-seq", "nccl-overlap"])
@pytest.mark.parametrize("op", ["ag-gemm-dgrad", "gemm-rs-dgrad", "ag-wgrad"])
def test_backward_ops_host(op, impl):
    r = _check(Point(op, impl, *_shape(op, 8), 8, fabric="host", policy="self" if impl == "kosmos" else None))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 7, 8])
def test_kosmos_ag_wgrad_local(world):
    """Tiles over all of K (own rows first, then the peers' bands as they arrive), partial tiles
    in M, N and in each rank's K segment (K/W = 200: 3 k-blocks and 8 rows)."""
    r = _check(Point("ag-wgrad", "kosmos", *_shape("ag-wgrad", world), world, fabric="local", policy="self"))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("order", ["demand", "fifo", "reverse", "random"])
@pytest.mark.parametrize("policy", ["self", "fixed:2", "predicted"])
def test_kosmos_ag_wgrad_policies(policy, order):
    """Every policy and queue order: the same K order per rank, so the same bits every call;
    bands of BM x chunk rows of At (chunk 1: two k-blocks per band wait, chunk 2: four)."""
    for chunk in (1, 2):
        p = Point("ag-wgrad", "kosmos", 1024, 512 * 4, 1024 * 4, 4, fabric="local", policy=policy,
                  queue_order=order, chunk=chunk)
        r = _check(p)
        assert r["wrong"] == 0, (chunk, r)
        assert r["same"], f"chunk {chunk}: {CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_watchdog_missing_peer():
    """Rank 1 never signals: rank 0's movers and its tiles' in-tile band waits give up (watchdog,
    a WatchdogError naming the wait), the launch drains, and the next calls are right."""
    import time

    import torch

    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.impls.kosmos import IMPLS, WatchdogError
    from kosmos_bench.ops import get_op

    W, timeout_s = 2, 0.5
    p = Point("ag-wgrad", "kosmos", 512, 256 * W, 512 * W, W, fabric="local", policy="self")
    dev = torch.device("cuda", 0)
    ctx = RankCtx(rank=0, world=W, procs=1, device=dev, fabric="local", backend="gpu")
    op = get_op(p.op)
    inputs, A, B = op.inputs(p, list(range(W)), dev, 99)
    runner = IMPLS[0].prepare(p, ctx, inputs, timeout_s=timeout_s, debug_skip_rank=1)
    try:
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError):
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        runner.set_debug_skip(None)
        for _ in range(2):
            runner.run()
            runner.check()
            for r in range(W):
                assert op.check(runner.outputs[r], op.reference(A, B, r, W), p.dtype, B)[0] == 0
    finally:
        runner.close()


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("shape,chunk", [((264, 136 * 8, 200 * 8), 1), ((1024, 256 * 8, 512 * 8), 1),
                                         ((1024, 256 * 8, 512 * 8), 2), ((4096, 1024 * 8, 1024 * 8), 1)])
def test_kosmos_ag_wgrad_host_copy_engine_movers(shape, chunk):
    """mover ce (host W=8, policy self): the copy engine brings each peer's At rows in one copy (the
    ag-gemm plan over At's rows, ring order = the tiles' K order), one release per copy that the
    tiles' per-band waits read (deps aliased, flag_mult 1); every CTA builds. Right, and bitwise the
    same over 20 calls."""
    r = _check(Point("ag-wgrad", "kosmos", *shape, 8, fabric="host", policy="self", mover="ce", chunk=chunk))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"
    info = r["info"]
    assert info["mover"] == "ce" and info["ce_copies"] == 7 and info["ce_releases"] == 7, info
    assert info["builder"] == "sm90" and not info["num_movers"], info


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_host_copy_engine_watchdog():
    """The last copy's release held back: the tiles' in-tile band waits time out (a WatchdogError
    naming a builder item), the launch drains, and the runner is right once it is restored."""
    import time

    import torch

    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.impls.kosmos import IMPLS, WatchdogError
    from kosmos_bench.ops import get_op

    W, timeout_s = 8, 0.5
    p = Point("ag-wgrad", "kosmos", 1024, 256 * W, 512 * W, W, fabric="host", policy="self", mover="ce")
    dev = torch.device("cuda", 0)
    ctx = RankCtx(rank=0, world=W, procs=1, device=dev, fabric="host", backend="gpu")
    op = get_op(p.op)
    inputs, A, B = op.inputs(p, list(range(W)), dev, 31)
    runner = IMPLS[0].prepare(p, ctx, inputs, timeout_s=timeout_s)
    try:
        runner.ce_back[-1] += 1
        runner._ce_commit()
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError, match="builder item"):
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        runner.ce_back[-1] -= 1
        runner._ce_commit()
        for _ in range(2):
            runner.run()
            runner.check()
            assert op.check(runner.outputs[0], op.reference(A, B, 0, W), p.dtype, B)[0] == 0
    finally:
        runner.close()


BAND = (("wgrad_items", "band"),)


def _band(shape, W, fabric, group=0, **kw) -> Point:
    knobs = BAND + ((("wgrad_group", group),) if group else ())
    return Point("ag-wgrad", "kosmos", *shape, W, fabric=fabric, policy=kw.pop("policy", "self"), knobs=knobs, **kw)


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("group", [0, 1, 5])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 7, 8])
def test_kosmos_ag_wgrad_band_local(world, group):
    """wgrad_items=band: (band group, tile) partials over their group's K rows into the fp32 carry,
    one group after another per tile (order flags), the last storing bf16 C_r. K/W = 200: the own
    shard one group; group 1 (one band of each remote shard) = 128 + 72 rows (a partial k-block),
    default = the whole shard, 5 bands = groups of 3 whole shards of 2 bands; M, N/W partial tiles."""
    r = _check(_band(_shape("ag-wgrad", world), world, "local", group))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("order", ["fifo", "reverse", "random"])
@pytest.mark.parametrize("policy", ["fixed:2", "predicted"])
def test_kosmos_ag_wgrad_band_policies(policy, order):
    """Fixed roles block on a claimed item: the queue keeps each tile's groups in order
    (schedule._tile_order), so a WG never waits on a group nobody claimed."""
    r = _check(_band((1024, 512 * 4, 1024 * 4), 4, "local", 1, policy=policy, queue_order=order))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("mover", ["sm", "ce"])
@pytest.mark.parametrize("shape,group", [((264, 136 * 8, 200 * 8), 1), ((1024, 256 * 8, 512 * 8), 0),
                                         ((4096, 1024 * 8, 1024 * 8), 2), ((4096, 1024 * 8, 1024 * 8), 16)])
def test_kosmos_ag_wgrad_band_host(shape, group, mover):
    """Host W=8, SM movers or copy-engine movers (one copy per band group and peer: the group's band
    items wait on that copy's release). 16 bands: groups of 2 whole 1024-row shards."""
    r = _check(_band(shape, 8, "host", group, mover=mover))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"
    assert r["info"]["mover"] == mover and r["info"]["builder"] == "sm90", r["info"]


def _band_runner(p: Point, seed: int, **kw):
    import torch

    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.impls.kosmos import IMPLS
    from kosmos_bench.ops import get_op

    dev = torch.device("cuda", 0)
    ctx = RankCtx(rank=0, world=p.world, procs=1, device=dev, fabric=p.fabric, backend="gpu")
    op = get_op(p.op)
    inputs, A, B = op.inputs(p, list(range(p.world)), dev, seed)
    return op, A, B, IMPLS[0].prepare(p, ctx, inputs, **kw)


def _right_again(runner, op, A, B, p: Point) -> None:
    for _ in range(2):
        runner.run()
        runner.check()
        for r in runner.outputs:
            assert op.check(runner.outputs[r], op.reference(A, B, r, p.world), p.dtype, B)[0] == 0


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_band_right_on_every_call_with_inputs_dropped():
    """Every call of one runner right against the reference, although the caller dropped its inputs
    (_band_runner keeps only the global A, B): the runner owns the shards its kernel reads through
    raw pointers. On 2026-12-05, before it did, the shards' memory went to the reference's
    temporaries: call 1 right, every later call wrong with the same bits (the band watchdog tests)."""
    import torch

    W = 2
    p = _band((512, 256 * W, 512 * W), W, "local", 1)
    op, A, B, runner = _band_runner(p, 99, timeout_s=0.5)
    try:
        for call in range(4):
            for o in runner.outputs.values():
                o.fill_(float("nan"))
            runner.run()
            runner.check()
            torch.cuda.synchronize()
            wrong = {r: op.check(runner.outputs[r], op.reference(A, B, r, W), p.dtype, B)[0] for r in runner.outputs}
            assert not any(wrong.values()), f"call {call}: wrong elements per rank {wrong}"
    finally:
        runner.close()


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_band_watchdog_order_flag():
    """An order flag never reaches its target (flag_mult 2 on the device: the group after waits for
    a second release that never comes, and so, one after another, do the later groups of that tile):
    a claim-time wait gives up (WatchdogError naming an order flag of that tile and a builder item),
    the launch drains, and the runner is right once it is restored."""
    import re
    import time

    from kosmos_bench import schedule as S
    from kosmos_bench.impls.kosmos import WatchdogError

    W, timeout_s = 2, 0.5
    p = _band((512, 256 * W, 512 * W), W, "local", 1)
    op, A, B, runner = _band_runner(p, 7, timeout_s=timeout_s)
    try:
        f = runner.scheds[0].flags.built  # order flag (group 0, tile 0), on both ranks (none reaches its exit wait)
        for a in runner.rank_arrays:
            a["flag_mult"][f] = 2
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError, match="builder item") as e:
            runner.check()
        items = runner.scheds[0].builders
        tile0 = (items.col("kind") == S.AGW_BAND) & (items.col("m0") == 0) & (items.col("n0") == 0)
        chain = {f} | {int(x) for x in items.col("rel_flag")[tile0] if x >= 0}  # tile (0, 0)'s order flags
        assert int(re.search(r"on flag (\d+) ", str(e.value)).group(1)) in chain, (str(e.value), chain)
        assert time.perf_counter() - t0 < timeout_s + 5.0
        for a in runner.rank_arrays:
            a["flag_mult"][f] = 1
        _right_again(runner, op, A, B, p)
    finally:
        runner.close()


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_band_watchdog_missing_peer():
    """Rank 1 never signals: rank 0's movers and its band items' claim-time waits on rank 1's bands
    give up (WatchdogError), the launch drains, and the next calls are right."""
    import time

    from kosmos_bench.impls.kosmos import WatchdogError

    W, timeout_s = 2, 0.5
    p = _band((512, 256 * W, 512 * W), W, "local", 1)
    op, A, B, runner = _band_runner(p, 99, timeout_s=timeout_s, debug_skip_rank=1)
    try:
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError):
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        runner.set_debug_skip(None)
        _right_again(runner, op, A, B, p)
    finally:
        runner.close()


@pytest.mark.gpu
@pytest.mark.hopper
def test_kosmos_ag_wgrad_band_host_copy_engine_watchdog():
    """Host W=8, mover ce: the last copy's release held back: the band items of that group never
    become ready (WatchdogError naming a builder item), the launch drains, right once restored."""
    import time

    from kosmos_bench.impls.kosmos import WatchdogError

    W, timeout_s = 8, 0.5
    p = _band((1024, 256 * W, 512 * W), W, "host", 1, mover="ce")
    op, A, B, runner = _band_runner(p, 31, timeout_s=timeout_s)
    try:
        runner.ce_back[-1] += 1
        runner._ce_commit()
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError, match="builder item"):
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        runner.ce_back[-1] -= 1
        runner._ce_commit()
        _right_again(runner, op, A, B, p)
    finally:
        runner.close()


def _layer_point(impl: str, world: int, fabric: str) -> Point:
    # one head of 128 per rank (MHA: not a catalog model), 128 tokens and FFN 256 per rank
    return Point("layer", impl, 128 * world, 128 * world, 256 * world, world, fabric=fabric,
                 policy="self" if impl == "kosmos" else None)


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 7, 8])
def test_kosmos_layer_local(world):
    r = _check(_layer_point("kosmos", world, "local"))
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("impl", ["kosmos", "nccl-seq", "nccl-overlap"])
def test_layer_host_llama3_8b(impl):
    p = Point("layer", impl, 2048, 4096, 14336, 8, fabric="host", policy="self" if impl == "kosmos" else None)
    r = _check(p)
    assert r["wrong"] == 0, r
    assert r["same"], f"{CALLS} calls not bitwise equal: {r}"
