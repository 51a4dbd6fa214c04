"""CPU tests of the KOSMOS MoE backward kernel's plumbing and numerics (csrc/moe_bwd_sm90.cu,
kernels/moe_bwd_sm90.py, impls/kosmos_moe_bwd.py); the kernel itself runs in
tests/test_moe_bwd_gpu.py.

`emulate` below is the kernel's algorithm step by step in torch (the forward's expert-sorted
rows with segments padded to 128, the bf16 roundings where the kernel rounds, fp32 where it
accumulates, pad rows zero, natural [g | u] layout, per-rank router / shared wgrads): run
through op moe-bwd's own check it must give wrong == 0, so the formulas (the softmax / sigmoid
backward through the renormalised top-k, the SwiGLU backward, the fold) are the reference's.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from kosmos_bench.impls import get_impl, kosmos_moe_bwd
from kosmos_bench.kernels import libs, moe_bwd_sm90, moe_sm90
from kosmos_bench.ops import get_op
from kosmos_bench.ops import moe_math as mm
from kosmos_bench.ops.moe import preset_point_dims
from kosmos_bench.point import Point

BM = 128
bf = torch.bfloat16


def _lib(math="joint"):
    try:
        return moe_bwd_sm90.load(math)
    except libs.ToolchainMissing as e:
        pytest.skip(str(e))


# ----------------------------------------------------------------------------- ABI
def test_args_layout_matches_the_c_struct():
    lib = _lib()
    assert moe_bwd_sm90.layout_mismatches(lib) == []
    assert lib.kosmos_moe_bwd_smem_bytes() <= 227 * 1024
    assert lib.kosmos_moe_bwd_threads() == 384
    assert lib.kosmos_moe_bwd_fwd_abi_version() == moe_sm90.ABI_VERSION
    assert moe_bwd_sm90.MoeBwdArgs.f.offset == 0
    sizes = sum(ctypes.sizeof(t) for _, t in moe_bwd_sm90.MoeBwdArgs._fields_)
    assert sizes == ctypes.sizeof(moe_bwd_sm90.MoeBwdArgs)  # no implicit padding


@pytest.mark.parametrize("T,H,F,Fs,E,k,W,Et,R", [(8192, 7168, 2048, 2048, 32, 8, 1, 32, 0),
                                                  (1000, 512, 256, 0, 16, 8, 1, 16, 0),
                                                  (384 * 4, 512, 384, 256, 128, 8, 4, 128, 0),
                                                  (40, 256, 256, 0, 4, 2, 2, 4, 0),
                                                  (384, 512, 256, 256, 256, 8, 1, 32, 2713)])  # host view
@pytest.mark.parametrize("math", ["joint", "pingpong"])
def test_item_counts_match_the_kernel_layout(T, H, F, Fs, E, k, W, Et, R, math):
    """The claim sequence's counts per kind, C (kernel Layout) against the Python mirror, for
    both builds (the ping-pong one's 128-wide n-tiles: twice the DH / DX / wgrad tiles)."""
    lib = _lib(math)
    a = moe_bwd_sm90.MoeBwdArgs()
    f = a.f
    f.T, f.H, f.F, f.Fs, f.E, f.topk, f.E_tiles, f.peer_rows = T, H, F, Fs, E, k, Et, R
    f.route_blocks, f.tiles_max = -(-T // BM), moe_sm90.tiles_max(T, k, Et, R)
    a.W, a.T1, a.E8 = W, T // W, moe_bwd_sm90.e8(E)
    want = moe_bwd_sm90.item_counts(T, H, F, Fs, E, k, W, Et, R, math)
    got = {name: lib.kosmos_moe_bwd_item_count(ctypes.byref(a), i) for i, name in enumerate(moe_bwd_sm90.KINDS)}
    assert got == want
    assert lib.kosmos_moe_bwd_item_count(ctypes.byref(a), len(moe_bwd_sm90.KINDS)) == -1
    assert (want["SHARED_DH"] > 0) == (Fs > 0) and want["FOLD"] == -(-T // 32)
    # the kernel's own count, against the rule stated from the parameters (not from the mirror):
    # without peers the movers gather (no GATHER items); with them one GATHER per 32 tokens
    assert got["GATHER"] == (0 if (Et, R) == (E, 0) else -(-T // 32))
    assert want["PEER_GATHER"] == want["PEER_COMBINE"] == -(-R // 32) and want["PAD"] == Et


def test_validate_reasons():
    lib = _lib()
    assert lib.kosmos_moe_bwd_validate(8192, 7168, 2048, 2048, 32, 8, 1) == b""
    assert b"256 experts" in lib.kosmos_moe_bwd_validate(64, 512, 256, 0, 512, 8, 1)
    assert b"of 128" in lib.kosmos_moe_bwd_validate(64, 512, 192, 0, 16, 8, 1)
    assert b"split evenly" in lib.kosmos_moe_bwd_validate(100, 512, 256, 0, 16, 8, 3)


def test_unsupported_reasons():
    assert kosmos_moe_bwd.unsupported_bwd(mm.preset("deepseek-v3", T=8192), "world1") is None
    assert kosmos_moe_bwd.unsupported_bwd(mm.preset("qwen3-235b-a22b", T=1024, world=8), "local") is None
    assert kosmos_moe_bwd.unsupported_bwd(mm.preset("qwen3-235b-a22b", T=1024, world=8), "host") is None
    why = kosmos_moe_bwd.unsupported_bwd(mm.preset("tiny", T=64, world=2), "nvlink")
    assert "fabric nvlink is not implemented yet" in why
    assert "256" in kosmos_moe_bwd.unsupported_bwd(mm.preset("deepseek-v3", T=64, world=16, E_loc=32), "local")
    assert "128" in kosmos_moe_bwd.unsupported_bwd(mm.MoeShape(T=64, H=512, F=192, E=8, topk=2), "world1")
    p = Point("moe-bwd", "kosmos", world=8, fabric="nvlink", backend="gpu", moe="deepseek-v3", routing="uniform",
              **preset_point_dims("deepseek-v3", 1024))
    assert "fabric nvlink" in get_impl("kosmos").unsupported(p)
    assert get_impl("kosmos").unsupported(p.replace(fabric="local")) is None
    assert get_impl("kosmos").unsupported(p.replace(fabric="host")) is None
    assert get_impl("kosmos").unsupported(p.replace(op="moe-step", world=1)) is None


def test_counter_names_for_the_watchdog():
    T, k, E = 1000, 8, 16
    tm, nb = moe_sm90.tiles_max(T, k, E), -(-T // BM)
    assert moe_bwd_sm90.ctr_words(T, k, E) == moe_bwd_sm90.CTR_HEAD + 3 * tm + 5 * nb
    assert moe_bwd_sm90.ctr_words(T, k, E, 300) == moe_bwd_sm90.CTR_HEAD + 3 * moe_sm90.tiles_max(T, k, E, 300) + 5 * nb
    name = lambda w: moe_bwd_sm90.counter_name(w, T, k, E)  # noqa: E731
    assert name(0) == "counter claim"
    assert name(moe_bwd_sm90.CTR_HEAD + 5) == "arrived[5]"
    assert name(moe_bwd_sm90.CTR_HEAD + tm) == "dh_done[0]"
    assert name(moe_bwd_sm90.CTR_HEAD + 3 * tm + 1) == "lg_done[1]"
    assert name(moe_bwd_sm90.CTR_HEAD + 3 * tm + 3 * nb + 2) == "shared_dx_done[2]"
    assert name(moe_bwd_sm90.CTR_HEAD + 3 * tm + 4 * nb + 1) == "dw_done[1]"
    assert name(1) == "counter mover gather claim" and name(3) == "counter mover logits claim"


# ----------------------------------------------------------------------------- numerics
def _swiglu_back(dh, g, u):
    sg = torch.sigmoid(g)
    return dh * u * sg * (1 + g * (1 - sg)), dh * g * sg


def _router_back(s, w, dw, logits, idx):
    """dlogits (T x E) of the renormalised chosen weights, as the GATHER item computes them."""
    wdw = (w * dw).sum(-1, keepdim=True)
    if s.scoring == "softmax":
        dl = w * (dw - wdw)
    else:
        sg = torch.sigmoid(logits.gather(1, idx))
        dl = (s.scale * dw - wdw) / sg.sum(-1, keepdim=True) * sg * (1 - sg)
    return torch.zeros_like(logits).scatter_(1, idx, dl)


def emulate(s: mm.MoeShape, inputs, W: int) -> dict:
    """The kernel's backward (and the saved state of its forward) for ranks 0..W-1 in one launch."""
    T1, H, F, Fs, E = s.T, s.H, s.F, s.shared_F, s.E
    x = torch.cat([inputs.x[r] for r in range(W)])
    dy = torch.cat([inputs.dy[r] for r in range(W)])
    W1 = torch.cat([inputs.W1[r] for r in range(W)])
    W2 = torch.cat([inputs.W2[r] for r in range(W)])
    T = x.shape[0]
    logits = x.float() @ inputs.Wr.float().t()
    idx = torch.cat([mm.route(s, inputs.x[r], inputs.Wr, inputs.bias)[0] for r in range(W)])
    w = mm.weights_for(s, logits, idx)
    f = lambda t: t.float()  # noqa: E731
    dx = torch.zeros(T, H)
    dw = torch.zeros(T, s.topk)
    dW1, dW2, rows_of = torch.zeros(E, 2 * F, H), torch.zeros(E, H, F), {}
    for e in range(E):  # the forward's segment of e: its rows in token order, padded to 128
        tok, j = (idx == e).nonzero(as_tuple=True)
        n = len(tok)
        pad = -(-n // BM) * BM
        xs = torch.zeros(pad, H, dtype=bf)
        xs[:n] = x[tok]
        gus = (f(xs) @ f(W1[e]).t()).to(bf)  # saved pre-activations [g | u]
        g, u = f(gus[:, :F]), f(gus[:, F:])
        hs = (torch.nn.functional.silu(f(xs) @ f(W1[e, :F]).t()) * (f(xs) @ f(W1[e, F:]).t())).to(bf)
        os_ = (f(hs) @ f(W2[e]).t()).to(bf)
        dos = torch.zeros(pad, H, dtype=bf)  # pad rows zero (PAD)
        dos[:n] = (w[tok, j, None] * f(dy[tok])).to(bf)
        dw[tok, j] = (f(dy[tok]) * f(os_[:n])).sum(-1)
        dg, du = _swiglu_back(f(dos) @ f(W2[e]), g, u)
        dgus = torch.cat([dg, du], 1).to(bf)
        dgus[n:] = 0  # the DH epilogue zeroes pad rows
        dxs = (f(dgus) @ f(W1[e])).to(bf)
        dW2[e] = f(dos).t() @ f(hs)
        dW1[e] = f(dgus).t() @ f(xs)
        rows_of[e] = (tok, j, dxs[:n])
    dlogits = _router_back(s, w, dw, logits, idx).to(bf)
    dxr = (f(dlogits) @ f(inputs.Wr)).to(bf)
    dxsh, dWs1, dWs2 = torch.zeros(T, H, dtype=bf), [], []
    if Fs:
        ws1, ws2 = inputs.shared
        gush = (f(x) @ f(ws1).t()).to(bf)
        g, u = f(gush[:, :Fs]), f(gush[:, Fs:])
        hsh = (torch.nn.functional.silu(f(x) @ f(ws1[:Fs]).t()) * (f(x) @ f(ws1[Fs:]).t())).to(bf)
        dgush = torch.cat(_swiglu_back(f(dy) @ f(ws2), g, u), 1).to(bf)
        dxsh = (f(dgush) @ f(ws1)).to(bf)
        for r in range(W):
            sl = slice(r * T1, (r + 1) * T1)
            dWs2.append((f(dy[sl]).t() @ f(hsh[sl])).to(bf))
            dWs1.append((f(dgush[sl]).t() @ f(x[sl])).to(bf))
    # FOLD: sum over j in order, then the router's and the shared expert's parts
    slot = torch.zeros(T, s.topk, H)
    for e, (tok, j, d) in rows_of.items():
        slot[tok, j] = f(d)
    for jj in range(s.topk):
        dx += slot[:, jj]
    dx = (dx + f(dxr) + f(dxsh)).to(bf)
    out = {"routes": {}, "dx": {}, "dWr": {}, "dW1": {}, "dW2": {}}
    if Fs:
        out.update(dWs1={}, dWs2={})
    El = s.E_loc
    for r in range(W):
        sl = slice(r * T1, (r + 1) * T1)
        out["routes"][r] = idx[sl].to(torch.int32)
        out["dx"][r] = dx[sl]
        out["dWr"][r] = (f(dlogits[sl]).t() @ f(x[sl])).to(bf)
        out["dW1"][r] = dW1[r * El:(r + 1) * El].to(bf)
        out["dW2"][r] = dW2[r * El:(r + 1) * El].to(bf)
        if Fs:
            out["dWs1"][r], out["dWs2"][r] = dWs1[r], dWs2[r]
    return out


@pytest.mark.parametrize("preset,world,routing", [("tiny", 1, "uniform"), ("tiny-grouped", 1, "zipf:1.2"),
                                                  ("tiny-grouped", 2, "uniform"), ("tiny", 4, "zipf:3")])
def test_the_kernels_algorithm_passes_the_ops_check(preset, world, routing):
    p = Point("moe-bwd", "kosmos", world=world, fabric="local", backend="cpu", moe=preset, routing=routing,
              **preset_point_dims(preset, 40))  # partial token blocks and tiles
    op = get_op("moe-bwd")
    ranks = list(range(world))
    inputs, state = op.setup(p, ranks, torch.device("cpu"), 3)
    s = inputs.shape
    snap = emulate(s, inputs, world)
    res = op.compare(p, ranks, snap, inputs, state)
    assert res["wrong"] == 0, res
    # (max_rel_err is max |err| / rms: the torch-moe baseline's on these points is 0.06-0.19 for dW)
    assert 0 < res["max_rel_err_dx"] < 5e-2 and 0 < res["max_rel_err_dWr"] < 5e-2 and 0 < res["max_rel_err_dW"] < 0.1
    # a wrong router backward (the renormalisation's term dropped) is caught
    bad = dict(snap, dWr={r: t * 1.5 for r, t in snap["dWr"].items()})
    assert op.compare(p, ranks, bad, inputs, state)["wrong"] > 0


# ----------------------------------------------------------------------------- the runner's wiring
class _FakeLib:
    """Stands in for both MoE libraries on the CPU: every entry point succeeds, the launch does
    nothing (the runner's Python wiring is what is under test)."""

    def __getattr__(self, name):
        if name.endswith("_max_wgs"):
            return lambda dev, out: setattr(out._obj, "value", 132) or 0
        if name.endswith("_create"):
            return lambda: 1
        return lambda *a: 0


@pytest.fixture
def fake_gpu(monkeypatch):
    from kosmos_bench.impls import kosmos_moe

    monkeypatch.setattr(kosmos_moe.K, "load", lambda math="joint": _FakeLib())
    monkeypatch.setattr(moe_bwd_sm90, "load", lambda math="joint": _FakeLib())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: type("S", (), {"cuda_stream": 0})())


@pytest.mark.parametrize("op_name,preset,world,fabric", [("moe-bwd", "tiny-grouped", 1, "nvlink"),
                                                         ("moe-step", "tiny", 2, "local"),
                                                         ("moe-bwd", "tiny-grouped", 2, "host")])
def test_runner_wires_the_buffers(fake_gpu, monkeypatch, op_name, preset, world, fabric):
    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.impls.kosmos import WatchdogError
    from kosmos_bench.ops.moe_bwd import grad_buffers

    # the kernel's shared expert width is a multiple of 128 (tiny-grouped's is 64)
    monkeypatch.setitem(mm.PRESETS, "tiny-grouped", dict(mm.PRESETS["tiny-grouped"], shared_F=128))
    p = Point(op_name, "kosmos", world=world, fabric=fabric, backend="cpu", moe=preset, routing="uniform",
              **preset_point_dims(preset, 40))
    op = get_op(op_name)
    ranks = list(range(world)) if fabric in ("local", "host") else [0]
    inputs, _ = op.setup(p, ranks, torch.device("cpu"), 3)
    s = inputs.shape
    ctx = RankCtx(0, world, 1, torch.device("cpu"), fabric, "cpu")
    runner = kosmos_moe_bwd.prepare_moe_bwd(p, ctx, inputs, timeout_s=1.0)
    here = [0] if fabric == "host" else ranks
    a, f = runner.args, runner.args.f
    try:
        want = grad_buffers(s, here, "cpu")
        assert set(runner.grads) == set(want)
        for name, bufs in want.items():
            assert set(runner.grads[name]) == set(here)
            for r, t in bufs.items():
                assert runner.grads[name][r].shape == t.shape, (name, r)
        assert f.gus == runner.fwd.gus.data_ptr() and bool(f.gush) == bool(s.shared_F)
        for name in ("dy", "w1", "w2", "wr", "dos", "dgus", "dxs", "dlogits", "dxr", "dx", "dwr", "dw1", "dw2",
                     "dwc", "ctr", "state", "err"):
            assert getattr(a, name) == getattr(runner, name).data_ptr(), name
        assert a.W == len(here) and a.T1 == s.T and a.E8 == moe_bwd_sm90.e8(s.E) and f.E == s.E
        assert a.ctr_words == moe_bwd_sm90.CTR_HEAD + 3 * f.tiles_max + 5 * f.route_blocks
        assert runner.wr.shape == (a.E8, s.H) and torch.equal(runner.wr[:s.E], inputs.Wr)
        assert runner.w1.shape == (f.E_tiles, 2 * s.F, s.H) and runner.dw1.shape[0] == f.E_tiles
        if fabric == "host":
            gv = inputs.host["view"].grad
            assert f.E_tiles == s.E_loc and f.peer_rows > 0
            assert a.recv_gout[1] == gv.recv_gout[1].data_ptr() and a.send_dx[1] == gv.send_dx[1].data_ptr()
        assert (runner.outputs != {}) == (op_name == "moe-step") and set(runner.routes) == set(here)
        runner.run()
        runner.check()
        assert list(runner.run_traced().columns) == ["rank", "wg", "sm", "role", "item", "kind", "t0_ns", "t1_ns",
                                                  "lane"]
        # a watchdog record (as the kernel writes it): DH item 7 waited for arrived[1]
        rec = torch.zeros(16, dtype=torch.int32)
        rec[0], rec[1], rec[4], rec[5], rec[7], rec[8], rec[9] = 1, 2, moe_bwd_sm90.KINDS.index("DH"), 7, \
            moe_bwd_sm90.CTR_HEAD + 1, 128, 100
        runner.err.copy_(rec.view(torch.uint8))
        with pytest.raises(WatchdogError, match=r"backward watchdog: DH item 7 .* arrived\[1\] \(expected >= 128, saw 100\)"):
            runner.check()
        runner.check()  # reported once
    finally:
        runner.close()
    assert runner.grads == {}
