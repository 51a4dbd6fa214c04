import torch

from kosmos_bench.ops import get_op
from kosmos_bench.ops.base import check_output
from kosmos_bench.point import Point


def test_shards_reassemble_to_the_reference():
    for op_name, (M, N, K, W) in {"ag-gemm": (30, 21, 11, 3), "gemm-rs": (30, 7, 12, 3)}.items():
        op = get_op(op_name)
        p = Point(op_name, "nccl-seq", M, N, K, W, dtype="fp32", backend="cpu", fabric="gloo")
        inputs, A, B = op.inputs(p, list(range(W)), "cpu", seed=1)
        assert not torch.all(A == 0) and not torch.all(B == 0)
        for r in range(W):
            ref = op.reference(A, B, r, W)
            assert tuple(ref.shape) == op.out_shape(p)
            if op_name == "ag-gemm":
                manual = torch.cat([inputs.A[q] for q in range(W)]) @ inputs.B[r]
            else:
                m = M // W
                manual = sum(inputs.A[q][r * m:(r + 1) * m] @ inputs.B[q] for q in range(W))
            assert torch.allclose(manual, ref, rtol=1e-5, atol=1e-5)


def test_check_output_counts_poison_and_errors():
    ref = torch.randn(8, 5)
    out = ref.clone().to(torch.bfloat16)
    assert check_output(out, ref, "bf16")[0] == 0
    out[0, 0] = float("nan")  # an unwritten (poisoned) element
    out[1, 1] += 1.0  # a wrong one
    wrong, err = check_output(out, ref, "bf16")
    assert wrong == 2 and err == float("inf")


def test_validation_rejects_non_dividing_shapes():
    ag, rs = get_op("ag-gemm"), get_op("gemm-rs")
    assert "N=10 is not divisible by world=3" in ag.validate(Point("ag-gemm", "x", 9, 10, 7, 3))
    assert "K=7 is not divisible by world=3" in rs.validate(Point("gemm-rs", "x", 9, 10, 7, 3))
    assert ag.validate(Point("ag-gemm", "x", 9, 9, 7, 3)) is None


def test_counts_follow_nccl_tests():
    p = Point("ag-gemm", "x", 1024, 512, 256, 8)
    op = get_op("ag-gemm")
    assert op.flops(p) == 2 * 1024 * 512 * 256
    assert op.comm_bytes(p) == 1024 * 256 * 2
    assert op.bus_factor(p) == 7 / 8
