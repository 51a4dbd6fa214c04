"""Op `layer` (ops/layer.py, impls/layer.py): the step's composition against the single-device
fp32 layer, on CPU: a bf16 emulation of all ranks in one process, and the baselines over gloo."""
import pytest
import torch

from kosmos_bench import launch
from kosmos_bench.impls import layer as L
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.ops import get_op
from kosmos_bench.ops.layer import LAYER_RTOL, shape_of, unpack
from kosmos_bench.point import Point


def _emulated(p):
    op = get_op("layer")
    s = shape_of(p)
    ranks = list(range(p.world))
    inputs, G, _ = op.inputs(p, ranks, "cpu", 5)
    ctx = RankCtx(rank=0, world=p.world, procs=1, device=torch.device("cpu"), fabric="local", backend="cpu")
    bufs = {r: L._rank_buffers(inputs.A[r], s, ctx.device, torch.bfloat16) for r in ranks}
    step = L.LayerStep(s, ranks, L._build(p, ctx, s, ranks, bufs, None, "emulate"), deterministic_sdpa=False)
    step.run()
    return op, step, G, s


@pytest.mark.parametrize("world,H,heads_kv", [(2, 256, None), (4, 512, None)])
def test_emulated_step_matches_the_single_device_layer(world, H, heads_kv):
    p = Point("layer", "nccl-seq", 64, H, 128 * world, world, backend="cpu", fabric="gloo")
    op, step, G, s = _emulated(p)
    assert (s.heads, s.head_dim) == (H // 128, 128)
    for r in range(world):
        ref = op.reference(G, s, r, world)
        wrong, err = op.check(step.outputs[r], ref, "bf16", s)
        assert wrong == 0, (r, err)
        got = unpack(step.outputs[r], s)
        for name, t in ref.items():  # bf16 roundings of the chain: ~0.5% of rms(ref), far below LAYER_RTOL
            rms_err = ((got[name].float() - t).pow(2).mean().sqrt() / t.pow(2).mean().sqrt()).item()
            assert rms_err < LAYER_RTOL / 5, (name, rms_err)


def test_the_check_catches_a_wrong_gradient():
    p = Point("layer", "nccl-seq", 64, 256, 256, 2, backend="cpu", fabric="gloo")
    op, step, G, s = _emulated(p)
    out = step.outputs[1].clone()
    n = s.packed_size()
    out[n - 5] += 10.0  # last element of dW2
    assert op.check(out, op.reference(G, s, 1, 2), "bf16", s)[0] == 1
    out[0] = float("nan")
    assert op.check(out, op.reference(G, s, 1, 2), "bf16", s)[0] == 2


def test_llama_presets_and_sub_ops():
    p = Point("layer", "kosmos", 8192, 8192, 28672, 8, policy="self")
    s = shape_of(p)
    assert (s.heads, s.kv_heads, s.nq, s.nkv) == (64, 8, 1024, 128)
    g = s.gemms()
    assert g["qkv"] == ("ag-gemm", 8192, 8 * 1280, 8192) and g["fc2.dgrad"] == ("ag-gemm-dgrad", 8192, 28672, 8192)
    assert g["qkv.wgrad"] == ("ag-wgrad", 8192, 10240, 8192)
    # every sub-op of the kosmos step is kosmos's own (ag-wgrad included), with the step's fields
    assert L.sub_point(p, "qkv.wgrad", s).impl == "kosmos" and L.sub_point(p, "qkv.wgrad", s).policy == "self"
    assert L.sub_point(p, "fc1.dgrad", s).impl == "kosmos"
    assert L.sub_point(p.replace(fabric="local"), "fc1.wgrad", s).impl == "kosmos"
    assert L.sub_point(p.replace(impl="nccl-seq", policy=None), "fc1.wgrad", s).policy is None
    assert "divisible" in get_op("layer").validate(p.replace(world=16))
    assert "at least 2" in get_op("layer").validate(p.replace(world=1))


def _run(points):
    rows = {}
    launch.run_points(points, lambda p: None, lambda p, row, tr: rows.__setitem__(p.key(), row), timeout_s=300)
    return [rows[p.key()] for p in points]


@pytest.mark.parametrize("world,H", [(2, 256), (3, 384)])
def test_layer_baselines_on_gloo(world, H):
    pts = [Point("layer", impl, 24 * world, H, 64 * world, world, fabric="gloo", backend="cpu", warmup=1, reps=2,
                 concurrent=False) for impl in ("nccl-seq", "nccl-overlap")]
    for p, r in zip(pts, _run(pts)):
        assert r["status"] == "ok", (p.impl, r.get("error"))
        assert r["wrong"] == 0 and r["deterministic"] is True, (p.impl, r["max_rel_err"])
        assert r["tokens_per_s"] > 0 and 0 <= r["exposed_comm_share"] <= 1
        assert r["layer_ops"].count("=" + p.impl) == 10
