"""GPU tests of the kosmos kernels (local and host fabrics). Skip without CUDA.

Every check: fresh random inputs (never zeros), outputs poisoned with NaN before each call,
`wrong` counted with the op's tolerance against the fp32 reference, bitwise equality
across repeated calls.
"""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from kosmos_bench.impls.base import RankCtx  # noqa: E402
from kosmos_bench.ops import get_op  # noqa: E402
from kosmos_bench.ops.base import check_output  # noqa: E402
from kosmos_bench.point import Point  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.hopper]

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: kosmos GPU tests need an sm_90 GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("kosmos kernels are built for sm_90a", allow_module_level=True)

from kosmos_bench.impls.kosmos import IMPLS, WatchdogError  # noqa: E402

IMPL = IMPLS[0]
DEV = torch.device("cuda", 0)


def awkward(op: str, W: int) -> tuple[int, int, int]:
    """M=3000*W, N=777*W, K=1000 where the op allows (gemm-rs needs W | K)."""
    K = 1000 if (op == "ag-gemm" or 1000 % W == 0) else 999
    return 3000 * W, 777 * W, K


def make(op, W, M, N, K, fabric="local", seed=0, **kw):
    """A prepared runner. Point fields and configuration knobs (band_group=..., spin_ns=...: the
    point's knobs) go into the point; builder / mover / ce_slices / mover_bulk / max_inflight
    are prepare's overrides of the point's configuration."""
    from kosmos_bench.kosmos.config import KNOB_FIELDS

    pkw = {k: kw.pop(k) for k in ("policy", "queue_order", "local_first", "chunk") if k in kw}
    over = ("builder", "mover", "ce_slices", "mover_bulk", "max_inflight")
    knobs = tuple((k, kw.pop(k)) for k in list(kw) if k in KNOB_FIELDS and k not in over)
    p = Point(op=op, impl="kosmos", M=M, N=N, K=K, world=W, fabric=fabric, seed=seed, knobs=knobs, **pkw)
    assert IMPL.unsupported(p) is None, IMPL.unsupported(p)
    ctx = RankCtx(rank=0, world=W, procs=1, device=DEV, fabric=fabric, backend="gpu")
    o = get_op(op)
    ranks = list(range(W))
    inputs, A, B = o.inputs(p, ranks, DEV, seed=1234 + seed)
    kw.setdefault("builder", "mma")  # the portable kernel unless a test asks for sm90 (auto picks sm90 on H200)
    runner = IMPL.prepare(p, ctx, inputs, **kw)
    return p, ctx, inputs, A, B, runner


def expect_correct(p, runner, A, B, calls=2):
    """run_checked: no element outside tolerance and the calls bitwise equal."""
    wrong, err, same = run_checked(p, runner, A, B, calls=calls)
    assert wrong == 0, f"{wrong} wrong, max_rel_err {err:.3g}"
    assert same, f"outputs differ bitwise across {calls} calls"


def expect_correct_around_trace(p, runner, A, B, calls=4):
    """expect_correct, one traced call, expect_correct again (the epochs stay in step)."""
    expect_correct(p, runner, A, B, calls=calls)
    runner.run_traced()
    expect_correct(p, runner, A, B, calls=2)


def assert_checked(p, runner, A, B, calls=2):
    """expect_correct, then close the runner (also when it fails)."""
    try:
        expect_correct(p, runner, A, B, calls=calls)
    finally:
        runner.close()


def run_checked(p, runner, A, B, calls=2):
    """Poison, run `calls` times; returns (total wrong, max err, bitwise identical)."""
    o = get_op(p.op)
    first = None
    same = True
    for _ in range(calls):
        for out in runner.outputs.values():
            out.fill_(float("nan"))
        runner.run()
        if hasattr(runner, "check"):  # kosmos runners surface watchdog errors here
            runner.check()
        torch.cuda.synchronize()
        cur = {r: t.clone() for r, t in runner.outputs.items()}
        if first is None:
            first = cur
        else:
            same = same and all(torch.equal(first[r], cur[r]) for r in first)
    wrong, err = 0, 0.0
    for r, out in first.items():
        w, e = check_output(out, o.reference(A, B, r, p.world), p.dtype)
        wrong += w
        err = max(err, e)
    return wrong, err, same


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
@pytest.mark.parametrize("W", [2, 3, 4, 8])
def test_local_awkward_self_bitwise_20(op, W):
    M, N, K = awkward(op, W)
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, policy="self")
    try:
        expect_correct(p, runner, A, B, calls=20)
    finally:
        runner.close()


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
@pytest.mark.parametrize("order", ["demand", "fifo", "reverse", "random"])
@pytest.mark.parametrize("policy", ["self", "fixed:1", "fixed:k", "predicted"])
def test_local_policies_orders(op, order, policy):
    W = 4
    M, N, K = awkward(op, W)
    if policy == "fixed:k":
        wgs = torch.cuda.get_device_properties(0).multi_processor_count // W
        policy = f"fixed:{max(2, wgs // 2)}"
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, policy=policy, queue_order=order, seed=7)
    assert_checked(p, runner, A, B, calls=20)


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
@pytest.mark.parametrize("W,policy,chunk,local_first", [(3, "fixed:2", 2, False), (8, "predicted", 1, None),
                                                        (8, "fixed:1", 3, True), (2, "self", 2, False)])
def test_local_variants(op, W, policy, chunk, local_first):
    M, N, K = awkward(op, W)
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, policy=policy, chunk=chunk, local_first=local_first, seed=3)
    assert_checked(p, runner, A, B, calls=2)


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
def test_local_aligned_fast_path(op):
    """Shapes whose operands take the cp.async (16-byte) path."""
    W = 4
    p, ctx, inputs, A, B, runner = make(op, W, 2048 * W, 512 * W, 1024 * W, policy="self", seed=11)
    assert_checked(p, runner, A, B, calls=3)


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
def test_watchdog_missing_peer(op):
    W = 2
    timeout_s = 0.5
    M, N, K = 512 * W, 256 * W, 256 * W
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, timeout_s=timeout_s, debug_skip_rank=1)
    try:
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError) as ei:
            runner.check()
        dt = time.perf_counter() - t0
        msg = str(ei.value)
        for word in ("rank", "WG", "flag", "item"):
            assert word in msg, msg
        assert dt < timeout_s + 5.0, f"watchdog took {dt:.2f} s"
        # The same GPU (and the same runner, with the peer back) works on the next call.
        runner.set_debug_skip(None)
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()
    p2, ctx2, inputs2, A2, B2, r2 = make(op, W, M, N, K)
    try:
        wrong, err, same = run_checked(p2, r2, A2, B2, calls=2)
        assert wrong == 0 and same
    finally:
        r2.close()


@pytest.mark.parametrize("op,shape", [("ag-gemm", (8 * 1024, 4096, 2048)), ("gemm-rs", (8 * 1024, 2048, 4096)),
                                      ("ag-gemm", (3000 * 8, 777 * 8, 1000))])
def test_host_fabric_correct_and_roles_change(op, shape):
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, fabric="host", policy="self")
    try:
        assert list(runner.outputs) == [0]
        expect_correct(p, runner, A, B, calls=3)
        df = runner.run_traced()
        assert set(df.columns) == {"rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns", "lane"}
        assert len(df) > 0 and runner.info["trace_dropped"] == 0
        assert (df["t1_ns"] >= df["t0_ns"]).all()
        roles = df[df.role != "WAIT"].groupby("wg")["role"].nunique()
        assert (roles > 1).any(), "no WG changed role"
        n_moves = (df.role == "MOVE").sum()
        assert n_moves == len(runner.scheds[0].movers)
    finally:
        runner.close()


def test_local_trace_and_info():
    W = 4
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, 1024 * W, 256 * W, 512, policy="fixed:2", trace_cap=8)
    try:
        df = runner.run_traced()
        assert sorted(df["rank"].unique()) == list(range(W))
        assert runner.info["num_movers"] == 2
        assert runner.info["trace_dropped"] >= 0
        assert df.groupby(["rank", "wg"]).size().max() <= 8
        movers = df[df.role == "MOVE"]
        assert (movers["wg"] < 2).all(), "fixed:2 -> only WGs 0, 1 move"
    finally:
        runner.close()


@pytest.mark.parametrize("W,shape", [(4, None), (8, None), (4, (2048 * 4, 512 * 4, 1000))])
def test_local_bulk_mover(W, shape):
    """ag-gemm movers through TMA bulk copies (mover_bulk=True) give identical results."""
    M, N, K = shape or awkward("ag-gemm", W)
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, policy="self", mover_bulk=True, seed=5)
    assert_checked(p, runner, A, B, calls=3)


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
@pytest.mark.parametrize("cap", [1, 3])
def test_local_self_inflight_cap(op, cap):
    W = 4
    M, N, K = awkward(op, W)
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, policy="self", max_inflight=cap, seed=9)
    try:
        assert runner.info["max_inflight_movers"] == cap
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()


@pytest.mark.parametrize("op,bulk", [("ag-gemm", True), ("gemm-rs", False)])
def test_host_fabric_self_capped_and_bulk(op, bulk):
    W = 8
    M, N, K = (8 * 1024, 4096, 2048) if op == "ag-gemm" else (8 * 1024, 2048, 4096)
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, fabric="host", policy="self", mover_bulk=bulk)
    try:
        assert runner.info["max_inflight_movers"] > 0
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@pytest.mark.parametrize("shape", [(8 * 1024, 4096, 2048), (3000 * 8, 777 * 8, 1000)])
def test_host_fabric_ag_copy_engine_movers(shape):
    """mover='ce': bands move by cudaMemcpyAsync + stream-memop flag releases; WGs only build."""
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", mover="ce")
    try:
        expect_correct(p, runner, A, B, calls=4)
        df = runner.run_traced()
        assert (df.role == "MOVE").sum() == 0 and (df.role == "BUILD").sum() == len(runner.scheds[0].builders)
        expect_correct(p, runner, A, B, calls=2)  # epochs stay in step after a traced call
    finally:
        runner.close()


# ---- opt-in Hopper-builder AG+GEMM (builder="sm90", csrc/ag_gemm_sm90.cu) ----------------
# Shapes: N/W a multiple of 8 (TMA), m_loc not a multiple of 128 and N/W not a multiple of
# 256 (partial tiles in both dims), K not a multiple of 64.


def _sm90_ready() -> str | None:
    import shutil

    from kosmos_bench.kernels import ag_sm90

    if torch.cuda.get_device_capability() != (9, 0):
        return "the sm90 builder needs an sm_90 GPU"
    if ag_sm90.find_lib() is None:
        if shutil.which("nvcc") is None:
            return "no prebuilt libkosmos_ag_sm90 and no nvcc to build it"
        try:
            ag_sm90.cutlass_include()
        except Exception as e:  # noqa: BLE001
            return f"cannot build the sm90 variant: {e}"
    return None


sm90 = pytest.mark.skipif(_sm90_ready() is not None, reason=str(_sm90_ready()))


@sm90
@pytest.mark.parametrize("W", [2, 4, 8])
def test_sm90_local_ag_correct_bitwise(W):
    M, N, K = 3000 * W, 776 * W, 1000
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, policy="self", builder="sm90", seed=21)
    try:
        assert runner.info["builder"] == "sm90"
        assert all(int(t[5]) <= 256 for s in runner.scheds for t in s.builders.table)  # BN = 256
        expect_correct(p, runner, A, B, calls=5)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("policy,order", [("fixed:2", "fifo"), ("predicted", "random")])
def test_sm90_local_ag_policies(policy, order):
    W = 4
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, 2048 * W, 512 * W, 1024, policy=policy, queue_order=order,
                                        builder="sm90", seed=22)
    try:
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
def test_sm90_watchdog_missing_peer():
    W, timeout_s = 2, 0.5
    M, N, K = 512 * W, 256 * W, 256 * W
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, timeout_s=timeout_s, debug_skip_rank=1,
                                        builder="sm90")
    try:
        runner.run()
        with pytest.raises(WatchdogError):
            runner.check()
        runner.set_debug_skip(None)
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("group", ["balanced", "peer"])
@pytest.mark.parametrize("mover", ["sm", "ce"])
@pytest.mark.parametrize("shape", [(8 * 1024, 8 * 13312 // 4, 1024), (3000 * 8, 776 * 8, 1000)])
def test_sm90_host_fabric_ag_balanced_demand_groups(shape, mover, group):
    """Small remote demand groups (what schedule.demand_group picks when link and builders are
    balanced; forced here with band_group) and groups aligned to peer shards (band_group=peer):
    correct and bitwise stable for both movers."""
    from kosmos_bench import schedule as S

    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover=mover, seed=11,
                                        band_group=S.BALANCED_GROUP if group == "balanced" else S.PEER_GROUPS)
    try:
        groups = runner.scheds[0].meta["remote_groups"]
        sizes = [len(g) for g in groups]
        assert sum(sizes) == 7 * -(-(M // W) // 128)
        if group == "balanced":
            assert max(sizes) == S.BALANCED_GROUP
        else:
            assert all(len({peer for peer, _ in g}) == 1 for g in groups) and runner.info["band_group"] == -1
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("shape", [(8 * 1024, 4096, 2048), (3000 * 8, 776 * 8, 1000)])
def test_sm90_host_fabric_ag(shape):
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="sm")  # SM movers (auto is ce here)
    try:
        expect_correct(p, runner, A, B, calls=3)
        df = runner.run_traced()
        assert len(df) > 0 and runner.info["trace_dropped"] == 0
        assert (df["t1_ns"] >= df["t0_ns"]).all()
        assert (df.role == "MOVE").sum() == len(runner.scheds[0].movers)
        assert (df.role == "BUILD").sum() == len(runner.scheds[0].builders)
        expect_correct(p, runner, A, B, calls=2)  # epochs stay in step after a traced call
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("shape", [(8 * 1024, 4096, 2048), (3000 * 8, 776 * 8, 1000), (8 * 1024, 40960, 1024)])
def test_sm90_host_fabric_ag_copy_engine_movers(shape):
    """builder sm90 + mover ce: the copy engine moves every band (enqueued after the kernel
    launch), all CTAs build; correct, bitwise stable, epochs in step across traced calls.
    Defaults by regime: copy-bound (N/W small) = per-peer copies, 1-band groups, 4 K-slices;
    link-bound (the larger N/W here) = 8-band groups without a ramp, 3 K-slices."""
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=5)
    try:
        assert runner.info["mover"] == "ce"
        bound = N // W < 5000  # rho < COPY_BOUND_RHO at the host model's rates; else rho < 0.7
        want = {"ce_regime": "copy-bound", "ce_slices": 4, "ce_merge": True, "band_group": 1} if bound else \
            {"ce_regime": "link-bound", "ce_slices": 3, "ce_merge": False, "band_group": 8}
        assert runner.k_stream and {k: runner.info[k] for k in want} == want
        expect_correct(p, runner, A, B, calls=4)
        df = runner.run_traced()
        assert (df.role == "MOVE").sum() == 0 and (df.role == "BUILD").sum() == len(runner.scheds[0].builders)
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()



@sm90
@pytest.mark.parametrize("fabric,policy,want", [("host", "self", "ce"), ("host", "fixed:16", "sm"),
                                                ("local", "self", "sm")])
def test_mover_auto_resolves_and_runs(fabric, policy, want):
    """mover auto (the default, None) with the builder auto: on the H200 the sm90 builder, and
    copy-engine movers for host ag-gemm under policy self (kosmos.builder.mover_choice), SM
    movers otherwise; correct and bitwise stable, and the runner's info (the row's mover column)
    records the resolved mover."""
    W = 8 if fabric == "host" else 4
    M, N, K = (3000 * W, 776 * W, 1000)
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric=fabric, policy=policy, builder=None, seed=23)
    try:
        assert p.mover is None and runner.builder == "sm90"
        assert (runner.mover, runner.info["mover"]) == (want, want)
        assert (runner.info["ce_copies"] > 0) == (want == "ce")
        if fabric == "local":  # copies within one GPU's HBM: no mover cap (schedule.max_inflight_movers)
            assert runner.info["max_inflight_movers"] == 0
        if policy == "fixed:16":  # SM movers, as many as the policy says
            assert runner.info["num_movers"] == 16
        expect_correct(p, runner, A, B, calls=4)
    finally:
        runner.close()


@sm90
def test_harness_row_records_the_resolved_mover():
    """The default point of the main job on one GPU (host fabric, mover and builder auto):
    the row's mover column says ce, its variant carries no mover, and it is correct."""
    from kosmos_bench import harness

    p = Point(op="ag-gemm", impl="kosmos", M=8 * 1024, N=8 * 2048, K=2048, world=8, fabric="host", policy="self",
              queue_order="demand", local_first=True, chunk=1, seed=4, warmup=1, reps=3, concurrent=False)
    row, _ = harness.run_point(p, rank=0, procs=1)
    assert row["status"] == "ok", row.get("error")
    assert (row["mover"], row["builder"], row["variant"]) == ("ce", "sm90", "kosmos[self]")
    assert row["wrong"] == 0 and row["deterministic"]


@sm90
def test_failed_setup_releases_what_it_made(monkeypatch):
    """A runner whose set-up fails after it has made everything (mapped error record, CE plan,
    TMA descriptors) closes itself before the error propagates."""
    from kosmos_bench.impls.kosmos import KosmosRunner

    seen = []
    real_close = KosmosRunner.close

    def held(r):
        return list(r._mapped), r.sm90_handle, r.ce_plan

    def close(self):
        seen.append(held(self))
        real_close(self)
        seen.append(held(self))

    def broken(self, trace):
        raise RuntimeError("injected set-up failure")

    monkeypatch.setattr(KosmosRunner, "close", close)
    monkeypatch.setattr(KosmosRunner, "_params", broken)
    with pytest.raises(RuntimeError, match="injected set-up failure"):
        make("ag-gemm", 8, 8 * 1024, 8 * 2048, 2048, fabric="host", policy="self", builder="sm90", mover="ce")
    assert len(seen) == 2, f"close() ran {len(seen) // 2} times, expected once"
    before, after = seen
    assert all(before), f"set-up had not made everything before the failure: {before}"
    assert after == ([], None, None), f"close() left {after}"


@sm90
def test_ce_plan_streams_are_the_process_s_pair():
    """Every runner's CE plan runs on the same two streams of the process (per runner, every
    second runner of a process ran 5% slower); closing one runner leaves them to the next, which
    stays correct and bitwise stable."""
    W, M, N, K = 8, 8 * 1024, 8 * 2048, 2048
    first = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90", mover="ce", seed=5)
    handles = [s.cuda_stream for s in first[-1].ce_streams]
    first[-1].close()
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=6)
    try:
        assert [s.cuda_stream for s in runner.ce_streams] == handles and handles[0] != handles[1]
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
def test_sm90_copy_engine_overlaps_after_pool_streams_carried_copies():
    """The CE plan runs on the library's own streams: after copies on every stream of torch's
    pool (a sweep's earlier points), the runner still overlaps copies and GEMM. On pool
    streams that had carried copies, the flag releases waited for the last copy and a call
    took copy + GEMM alone (t14). Back-to-back medians; the bound sits halfway between."""
    from kosmos_bench import timing
    from kosmos_bench.impls import nccl as nccl_impls

    W, M, N, K = 8, 8 * 1024, 8 * 4096, 4096  # copy ~1.1 ms, GEMM ~0.4 ms on H200
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=21)
    try:
        copy, gemm = nccl_impls.comm_alone(p, ctx, inputs), nccl_impls.gemm_alone(p, ctx, inputs)
        dst = torch.empty((M // W, K), dtype=torch.bfloat16, device=DEV)
        src = inputs.A[1].cpu().pin_memory()
        main = torch.cuda.current_stream()
        for _ in range(32):  # every pool stream issues a copy (what earlier points leave behind)
            s = torch.cuda.Stream(DEV)
            s.wait_stream(main)
            with torch.cuda.stream(s):
                dst.copy_(src, non_blocking=True)
            main.wait_stream(s)
        t = {k: float(torch.tensor(v).median()) for k, v in timing.bench(
            {"kosmos": runner.run, "copy": copy, "gemm": gemm}, device=DEV, warmup=2, reps=8, min_warmup_s=0.05).items()}
        runner.check()
        bound = t["copy"] + 0.5 * t["gemm"]
        assert t["kosmos"] < bound, f"kosmos {t['kosmos']:.0f} us: copy {t['copy']:.0f} + GEMM {t['gemm']:.0f} not overlapped"
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()

@sm90
@pytest.mark.parametrize("ce_slices", [1, 2, 3, 16, "3,1", "1,5,2"])
@pytest.mark.parametrize("shape", [(8 * 1024, 8 * 2048, 2048), (3000 * 8, 776 * 8, 1000)])
def test_sm90_copy_engine_streamed_k_slices(shape, ce_slices):
    """The last remote group arrives in K-slices (2-D copies, slice-major) that the builders
    stream (Params.k_stream: claim on slice 0, wait per slice inside the tile): correct,
    bitwise stable over calls, epochs in step after a traced call; 1 = whole bands; "3,1" =
    4 slices in 2 copies (one release says "3 slices there")."""
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", ce_slices=ce_slices, seed=7)
    n = ce_slices if isinstance(ce_slices, int) else sum(int(x) for x in ce_slices.split(","))
    try:
        assert runner.k_stream == (n > 1) and runner.info["ce_slices"] == n
        if n > 1:
            assert max(e.mult for e in runner.ce_entries) == min(n, -(-K // 64))
            assert any(0 < e.cols < K for e in runner.ce_entries)  # 2-D copies present
        expect_correct_around_trace(p, runner, A, B, calls=4)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("tail_bands", [1, 2])
def test_sm90_copy_engine_tail_bands(tail_bands):
    """tail_bands: a last remote group of that many bands (instead of one wave of tiles), in 4
    K-slices: correct and bitwise stable over calls."""
    W, M, N, K = 8, 8 * 1024, 8 * 7168, 2048
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", ce_slices=4, seed=21, tail_bands=tail_bands)
    try:
        assert len(runner.scheds[0].meta["remote_groups"][-1]) == tail_bands
        assert runner.info["ce_tail_bands"] == tail_bands and runner.info["ce_slices"] == 4
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("spin_ns", [0, 4096])
def test_sm90_copy_engine_flag_spin_sleep(spin_ns):
    """Params.spin_ns (configuration spin_ns): builders that poll a band flag without sleeping or
    every ~4 us still see every release: correct and bitwise stable; bad values refused."""
    W, M, N, K = 8, 8 * 1024, 8 * 2048, 2048
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=9, spin_ns=spin_ns)
    try:
        assert runner.info["spin_ns"] == spin_ns
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()
    with pytest.raises(ValueError, match="spin_ns"):
        make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90", mover="ce", seed=9, spin_ns=-1)


@sm90
@pytest.mark.parametrize("shape", [(8 * 1024, 8 * 2048, 2048), (3000 * 8, 776 * 8, 1000)])
def test_sm90_copy_engine_merged_peer_copies(shape):
    """ce_merge=on: one copy per peer before the sliced groups (flags of a group's early bands
    released with the peer's later ones): correct and bitwise stable over calls."""
    W, (M, N, K) = 8, shape
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=17, ce_merge=True)
    try:
        assert runner.info["ce_merge"] and runner.k_stream
        head = [e for e in runner.ce_entries if e.rows and e.cols == K]
        peers = [e.peer for e in head]  # one whole-K copy per peer, the last one's cut 4, 2, 1
        assert sum(peers.count(p) > 1 for p in set(peers)) <= 1 and len(set(peers)) == W - 1
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
def test_sm90_copy_engine_inline_releases():
    """The last copy's releases on the copy stream (after the flag stream's earlier ones: the
    band's earlier K-slice releases), the others on the flag stream: correct and bitwise stable
    over calls, K-slices included (this shape's last band: 4 slices, each a copy)."""
    W, M, N, K = 8, 8 * 1024, 8 * 2048, 2048
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", seed=13)
    try:
        last_copy = max(i for i, e in enumerate(runner.ce_entries) if e.rows)
        assert runner.ce_streams[0] is not runner.ce_streams[1] and runner.ce_inline_from == last_copy
        assert runner.ce_entries[-1].mult > 1  # the inline releases include a K-slice's
        expect_correct(p, runner, A, B, calls=3)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("ahead", ["-1", "0", "1", "8", "100000"])
def test_sm90_lookahead_claim_settings_agree(ahead):
    """ahead_blocks: no lookahead (-1), at the last load (0, 1), 8 k-blocks before it, at
    the first load: correct, and bitwise equal to the default's output, with CE movers (a
    K-sliced tail) and with SM movers (policy self and fixed: claims ahead become pending)."""
    W, M, N, K = 8, 8 * 1024, 8 * 2048, 2048
    for kw in (dict(mover="ce"), dict(mover="sm", policy="self"), dict(mover="sm", policy="fixed:16")):
        kw = {"policy": "self", **kw}
        p, ctx, inputs, A, B, ref = make("ag-gemm", W, M, N, K, fabric="host", builder="sm90", seed=31, **kw)
        try:
            ref.run()
            ref.check()
            want = ref.outputs[0].clone()
        finally:
            ref.close()
        p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", builder="sm90", seed=31,
                                            ahead_blocks=int(ahead), **kw)
        try:
            assert runner.info["ahead_blocks"] == int(ahead)
            expect_correct(p, runner, A, B, calls=2)
            assert torch.equal(runner.outputs[0].view(torch.int16), want.view(torch.int16)), kw
        finally:
            runner.close()


@sm90
def test_sm90_k_slice_wait_has_a_watchdog():
    """A K-slice that never arrives (its last release held back) times out inside the tile
    (SliceWait), names the builder item, and the runner works again afterwards."""
    W, M, N, K = 8, 8 * 1024, 8 * 2048, 2048
    p, ctx, inputs, A, B, runner = make("ag-gemm", W, M, N, K, fabric="host", policy="self", builder="sm90",
                                        mover="ce", ce_slices=4, timeout_s=0.5, seed=8)
    try:
        last = max(i for i, e in enumerate(runner.ce_entries) if e.mult > 1)  # final slice release of a band
        runner.ce_back[last] += 1
        runner._ce_commit()
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError, match="builder item"):
            runner.check()
        assert time.perf_counter() - t0 < 5.5
        runner.ce_back[last] -= 1
        runner._ce_commit()
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("kernel", ["fused", "standalone"])
def test_sm90_gemm_world1_kernels(kernel):
    """op gemm: the fused AG+GEMM kernel at world 1 (default) and the standalone builder,
    poisoned output, awkward shape (partial tiles both ways, K not a multiple of 64)."""
    M, N, K = 997, 1000, 1000
    p = Point(op="gemm", impl="kosmos", M=M, N=N, K=K, world=1, fabric="local", seed=3)
    ctx = RankCtx(rank=0, world=1, procs=1, device=DEV, fabric="local", backend="gpu")
    o = get_op("gemm")
    inputs, A, B = o.inputs(p, [0], DEV, seed=77)
    runner = IMPL.prepare(p, ctx, inputs, gemm_kernel=kernel)
    try:
        assert kernel in runner.info["gemm_kernel"]
        expect_correct(p, runner, A, B, calls=3)
    finally:
        if hasattr(runner, "close"):
            runner.close()


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
def test_host_fabric_inflight_cap_knob(op):
    """The configuration's max_inflight reaches the kernel's mover slots through the schedule."""
    M, N, K = (8 * 1024, 4096, 2048) if op == "ag-gemm" else (8 * 1024, 2048, 4096)
    p, ctx, inputs, A, B, runner = make(op, 8, M, N, K, fabric="host", policy="self", seed=3,
                                        max_inflight=5)
    try:
        assert runner.info["max_inflight_movers"] == 5
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()


@pytest.mark.parametrize("impl,extra", [("kosmos", {"builder": "sm90", "mover": "ce"}), ("nccl-overlap", {})])
def test_harness_times_gemm_and_collective_concurrently(impl, extra):
    """run_point's t_concurrent_us: the GEMM alone and the copy alone issued together on two
    streams. Both must finish, so it is not below the longer of them (5% noise), and on a
    host-fabric shape the copy engine overlaps the GEMM, so it is well below their sum."""
    from kosmos_bench import harness

    p = Point(op="ag-gemm", impl=impl, M=8192, N=57344, K=8192, world=8, fabric="host", seed=0,
              warmup=2, reps=5, **({"policy": "self"} if impl == "kosmos" else {}), **extra)
    row, _ = harness.run_point(p, rank=0, procs=1)
    assert row["status"] == "ok", row.get("error")
    g, c, both = row["t_gemm_us"], row["t_comm_us"], row["t_concurrent_us"]
    assert both >= 0.95 * max(g, c), (g, c, both)
    assert both <= 0.9 * (g + c), (g, c, both)
    assert row["eff_concurrent"] == pytest.approx(both / row["t_median_us"])


def test_harness_concurrent_timing_off():
    from kosmos_bench import harness

    p = Point(op="ag-gemm", impl="nccl-overlap", M=8192, N=10240, K=8192, world=8, fabric="host", seed=0,
              warmup=2, reps=3, concurrent=False)
    row, _ = harness.run_point(p, rank=0, procs=1)
    assert row["status"] == "ok", row.get("error")
    assert row["t_comm_us"] > 0 and row.get("t_concurrent_us") is None and row.get("eff_concurrent") is None


# ---- GEMM+RS on the Hopper builder (builder="sm90", gemm_rs_sm90_kernel in csrc/ag_gemm_sm90.cu) ----
# Uneven shapes: m_loc = 1000 (not a multiple of 128), N not a multiple of 256, K/W = 200 (not a
# multiple of 64); TMA needs K/W and N multiples of 8. Reduction in rank order: bitwise stable.

def rs_uneven(W: int) -> tuple[int, int, int]:
    return 1000 * W, 1000 + 8 * W, 200 * W


def _rs_policy(policy: str, W: int, fabric: str = "local") -> str:
    if policy != "fixed:k":
        return policy
    ctas = torch.cuda.get_device_properties(0).multi_processor_count // (W if fabric == "local" else 1)
    return f"fixed:{max(2, ctas // 2)}" if fabric == "local" else "fixed:16"


@sm90
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8])
def test_sm90_rs_local_uneven_bitwise_20(W):
    M, N, K = rs_uneven(W)
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, policy="self", builder="sm90", seed=40 + W)
    try:
        assert runner.info["builder"] == "sm90" and runner.sm90_rs
        assert all(int(t[5]) <= 256 for s in runner.scheds for t in s.builders.table)  # BN = 256
        expect_correct(p, runner, A, B, calls=20)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("W,policy,order", [(4, "fixed:k", "demand"), (4, "predicted", "demand"),
                                            (7, "fixed:k", "random"), (7, "predicted", "fifo"),
                                            (5, "fixed:1", "reverse"), (6, "self", "random")])
def test_sm90_rs_local_policies_bitwise_20(W, policy, order):
    M, N, K = rs_uneven(W)
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, policy=_rs_policy(policy, W), queue_order=order,
                                        builder="sm90", seed=50 + W)
    try:
        expect_correct(p, runner, A, B, calls=20)
    finally:
        runner.close()


@sm90
@pytest.mark.parametrize("policy", ["self", "fixed:k", "predicted"])
@pytest.mark.parametrize("shape", [(8 * 1024, 2048, 4096), rs_uneven(8)])
def test_sm90_rs_host_fabric(shape, policy):
    """Host fabric W = 8, SM movers (mover auto is the copy engine there): rank 0 executes, peers'
    contributions come through RS_PROXY movers, its partials for peers go to pinned host memory
    (RS_PUSH). Correct, bitwise over 20 calls, every item traced once, epochs in step after the
    traced call."""
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, fabric="host", policy=_rs_policy(policy, W, "host"),
                                        builder="sm90", mover="sm", seed=60)
    try:
        assert list(runner.outputs) == [0] and runner.info["builder"] == "sm90"
        expect_correct(p, runner, A, B, calls=20)
        df = runner.run_traced()
        sch = runner.scheds[0]
        assert runner.info["trace_dropped"] == 0 and (df["t1_ns"] >= df["t0_ns"]).all()
        assert (df.role == "MOVE").sum() == len(sch.movers)
        assert (df.role == "BUILD").sum() == len(sch.builders)
        assert (df.role == "REDUCE").sum() == len(sch.reduces)
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()


@sm90
def test_sm90_rs_watchdog_missing_peer():
    """A rank that never signals: WatchdogError within the timeout; the same runner (peer back)
    and a fresh runner are correct afterwards (the GPU stays usable)."""
    W, timeout_s = 2, 0.5
    M, N, K = 512 * W, 256 * W, 256 * W
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, timeout_s=timeout_s, debug_skip_rank=1,
                                        builder="sm90")
    try:
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError) as ei:
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        for word in ("rank", "WG", "flag", "item"):
            assert word in str(ei.value)
        runner.set_debug_skip(None)
        expect_correct(p, runner, A, B, calls=2)
    finally:
        runner.close()
    p2, ctx2, inputs2, A2, B2, r2 = make("gemm-rs", W, M, N, K, builder="sm90", seed=3)
    try:
        expect_correct(p2, r2, A2, B2, calls=2)
    finally:
        r2.close()


@sm90
def test_sm90_rs_agrees_with_portable_kernel():
    """The sm90 and the portable GEMM+RS: both within tolerance of the fp32 reference and close to
    each other (the partials' accumulation order differs, the reduction arithmetic is the same)."""
    W = 4
    M, N, K = rs_uneven(W)
    outs = {}
    for b in ("mma", "sm90"):
        p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, policy="self", builder=b, seed=70)
        try:
            expect_correct(p, runner, A, B, calls=2)
            outs[b] = {r: t.float().clone() for r, t in runner.outputs.items()}
        finally:
            runner.close()
    for r in outs["mma"]:
        d = (outs["mma"][r] - outs["sm90"][r]).abs().max().item()
        scale = outs["mma"][r].abs().max().item()
        assert d <= 0.02 * scale, (r, d, scale)


# ---- Determinism of both ops, both builders, every policy, W = 2..8 with uneven shapes (issue 30) ----

def uneven(op: str, W: int) -> tuple[int, int, int]:
    """m_loc = 1000 (not a multiple of 128), no dimension a multiple of its tile; both builders
    take it (sm90: K/W resp. K, N resp. N/W multiples of 8)."""
    return rs_uneven(W) if op == "gemm-rs" else (1000 * W, 136 * W, 1000)


def bitwise_diff(first: dict, cur: dict, BM: int = 128, BN: int = 128) -> str:
    """'' when equal, else where the outputs differ: per rank the count and the distinct
    (tile row, tile col) of the first differing elements (what locates a race)."""
    out = []
    for r in first:
        a, b = first[r], cur[r]
        ne = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
        n = int(ne.sum())
        if n:
            idx = ne.nonzero()[:4096].cpu().tolist()
            tiles = sorted({(i // BM, j // BN) for i, j in idx})[:12]
            out.append(f"rank {r}: {n} differ, rows {idx[0][0]}..{idx[-1][0]}, tiles {tiles}")
    return "; ".join(out)


def expect_bitwise(p, runner, A, B, calls=20):
    """Correct on the first call and bitwise identical over `calls` calls (a failure names the tiles)."""
    o = get_op(p.op)
    first = None
    for c in range(calls):
        for out in runner.outputs.values():
            out.fill_(float("nan"))
        runner.run()
        runner.check()
        cur = {r: t.clone() for r, t in runner.outputs.items()}
        if first is None:
            first = cur
            for r, out in cur.items():
                wrong, err = check_output(out, o.reference(A, B, r, p.world), p.dtype)
                assert wrong == 0, f"rank {r}: {wrong} wrong, max_rel_err {err:.3g}"
        else:
            d = bitwise_diff(first, cur)
            assert not d, f"call {c} differs from call 0: {d}"


@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
@pytest.mark.parametrize("builder", ["mma", "sm90"])
@pytest.mark.parametrize("W", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("policy", ["self", "fixed:k", "predicted"])
def test_local_uneven_every_policy_bitwise_20(op, builder, W, policy):
    if builder == "sm90" and _sm90_ready() is not None:
        pytest.skip(str(_sm90_ready()))
    M, N, K = uneven(op, W)
    p, ctx, inputs, A, B, runner = make(op, W, M, N, K, policy=_rs_policy(policy, W), builder=builder, seed=80 + W)
    try:
        assert runner.info["builder"] == builder
        expect_bitwise(p, runner, A, B, calls=20)
    finally:
        runner.close()


# ---- GEMM+RS copy-engine movers (host fabric, sm90 builder): pushes D2H after builder counters ----

@sm90
@pytest.mark.parametrize("shape", [(8 * 1024, 2048, 4096), rs_uneven(8), (8 * 1024, 8192, 8192)])
def test_sm90_rs_host_copy_engine_movers(shape):
    """mover ce: every CTA builds and reduces, the copy engine pushes partial bands D2H (stream
    waits on builder counters) and brings the peers' contributions H2D (releases): correct and
    bitwise stable over 20 calls, epochs in step after a traced call (no MOVE records)."""
    W = 8
    M, N, K = shape
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, fabric="host", builder="sm90", mover="ce", seed=61)
    try:
        assert runner.info["mover"] == "ce" and runner.ce_push_plan and runner.ce_plan
        assert runner.info["ce_copies"] == len(runner.plan.rs_ce.pushes) + (W - 1)
        expect_bitwise(p, runner, A, B, calls=20)
        df = runner.run_traced()
        assert (df.role == "MOVE").sum() == 0
        assert (df.role == "BUILD").sum() == len(runner.scheds[0].builders)
        expect_bitwise(p, runner, A, B, calls=2)
    finally:
        runner.close()


@sm90
def test_sm90_rs_host_copy_engine_watchdog_no_hang():
    """A proxy release held back (its flag one short): the reduces time out -> WatchdogError, the
    kernel fills the builder counters so the pushes' stream waits drain (no hang); the runner is
    correct again once the release is restored."""
    W, timeout_s = 8, 0.5
    M, N, K = 8 * 1024, 2048, 4096
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, fabric="host", builder="sm90", mover="ce",
                                        timeout_s=timeout_s, seed=62)
    try:
        runner.ce_back[-1] = 1
        runner._ce_commit()
        t0 = time.perf_counter()
        runner.run()
        with pytest.raises(WatchdogError) as ei:
            runner.check()
        assert time.perf_counter() - t0 < timeout_s + 5.0
        assert "reduce" in str(ei.value).lower() or "flag" in str(ei.value), str(ei.value)
        runner.ce_back[-1] = 0
        runner._ce_commit()
        expect_bitwise(p, runner, A, B, calls=2)
    finally:
        runner.close()


@pytest.mark.parametrize("W", [5, 6, 7])
@pytest.mark.parametrize("policy", ["self", "predicted"])
def test_local_awkward_rs_portable_bitwise_20(W, policy):
    """The portable GEMM+RS on the awkward shapes of test_local_awkward_self_bitwise_20 at the world
    sizes it skips (K rounded down to a multiple of W): odd N takes the scalar copy / reduce /
    epilogue paths (where issue 30 saw calls differ at W = 5, 6, 7)."""
    M, N, K = 3000 * W, 777 * W, W * (1000 // W)
    p, ctx, inputs, A, B, runner = make("gemm-rs", W, M, N, K, policy=policy, seed=90 + W)
    try:
        expect_bitwise(p, runner, A, B, calls=20)
    finally:
        runner.close()
