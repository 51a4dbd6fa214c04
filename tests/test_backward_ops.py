"""The backward ops (ops/backward.py): layouts, references, and the baselines on gloo."""
import pytest
import torch

from kosmos_bench import launch
from kosmos_bench.ops import get_op
from kosmos_bench.point import Point

BWD = ("ag-gemm-dgrad", "gemm-rs-dgrad", "ag-wgrad")


def _run(points):
    rows = {}
    launch.run_points(points, lambda p: None, lambda p, row, tr: rows.__setitem__(p.key(), row), timeout_s=120)
    return [rows[p.key()] for p in points]


def test_dgrad_ops_hold_the_weight_as_stored():
    """B_r is a transposed view of a contiguous W_r (N/W x K resp. N x K/W), as the forward keeps it."""
    p = Point("ag-gemm-dgrad", "nccl-seq", 64, 48, 40, 4, backend="cpu", fabric="gloo")
    inp, A, B = get_op(p.op).inputs(p, [0, 3], "cpu", 1)
    assert inp.B[3].shape == (40, 12) and inp.B[3].t().is_contiguous() and not inp.B[3].is_contiguous()
    assert torch.equal(inp.B[3], B[:, 36:48])
    p = Point("gemm-rs-dgrad", "nccl-seq", 64, 48, 40, 4, backend="cpu", fabric="gloo")
    inp, A, B = get_op(p.op).inputs(p, [1], "cpu", 1)
    assert inp.B[1].shape == (10, 48) and inp.B[1].t().is_contiguous()
    assert torch.equal(inp.A[1], A[:, 10:20])


def test_ag_wgrad_reference_is_the_gathered_transpose_product():
    p = Point("ag-wgrad", "nccl-seq", 24, 16, 32, 4, backend="cpu", fabric="gloo", dtype="fp32")
    op = get_op(p.op)
    inp, At, B = op.inputs(p, list(range(4)), "cpu", 3)
    assert inp.A[2].shape == (8, 24) and inp.B[2].shape == (32, 4)
    full = torch.cat([inp.A[q] for q in range(4)])  # the all-gather along K
    for r in range(4):
        assert torch.allclose(op.reference(At, B, r, 4), full.t() @ inp.B[r], atol=1e-5)
    assert op.out_shape(p) == (24, 4) and op.validate(p.replace(K=30)) == "K=30 is not divisible by world=4"


@pytest.mark.parametrize("world", [2, 3])
def test_backward_baselines_correct_on_gloo(world):
    shapes = {"ag-gemm-dgrad": (22 * world, 8 * world, 40), "gemm-rs-dgrad": (10 * world, 24, 8 * world),
              "ag-wgrad": (40, 8 * world, 12 * world)}
    pts = [Point(op, impl, *shapes[op], world, fabric="gloo", backend="cpu", warmup=1, reps=2)
           for op in BWD for impl in ("nccl-seq", "nccl-overlap")]
    for p, r in zip(pts, _run(pts)):
        assert r["status"] == "ok", (p.variant, p.op, r.get("error"))
        assert r["wrong"] == 0 and r["deterministic"] is True, (p.op, p.impl, r["max_rel_err"])
        assert 0 <= r["max_rel_err"] < 0.05
        assert r["t_comm_us"] > 0 and r["t_gemm_us"] > 0
