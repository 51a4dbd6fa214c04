"""Hopper builder GEMM (csrc/gemm_sm90.cu): validation on CPU; correctness on a Hopper GPU.

GPU tests skip (marker `hopper`) without a compute-capability-9.0 device or without the
library (prebuilt in .kb-cache/ or buildable here).
"""
from __future__ import annotations

import pytest

from kosmos_bench.kernels import sm90_gemm


def test_validate_shape_cpu():
    assert sm90_gemm.validate_shape(4096, 6144, 4096) is None
    assert sm90_gemm.validate_shape(997, 1000, 1000) is None  # prime M, partial tiles
    assert "multiple of 8" in sm90_gemm.validate_shape(128, 1001, 64)
    assert "multiple of 8" in sm90_gemm.validate_shape(128, 256, 100)
    assert "positive" in sm90_gemm.validate_shape(0, 8, 8)


def test_library_name_tracks_sources():
    name = sm90_gemm.lib_name()
    assert name.startswith("libsm90_gemm-") and name.endswith("-sm_90a.so")
    assert name == sm90_gemm.lib_name()  # stable


def _hopper() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch missing"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return False, "not a Hopper (sm_90) device"
    return sm90_gemm.available()


_ok, _why = _hopper()
hopper = pytest.mark.skipif(not _ok, reason=f"needs a Hopper GPU and the sm90 library: {_why}")


@pytest.mark.hopper
@hopper
@pytest.mark.parametrize("M,N,K", [
    (256, 256, 64), (997, 1000, 1000), (131, 264, 72), (3001, 6216, 1000), (1, 8, 8),
    (4099, 776, 16392),
])
def test_gemm_matches_fp32_reference(M, N, K):
    r = sm90_gemm.check_one(M, N, K, seed=M + N + K)
    assert r["nan"] == 0, f"unwritten outputs: {r}"
    assert r["wrong"] == 0, f"elements outside tolerance: {r}"
    assert r["rel_err"] < 1e-2, f"relative error too large: {r}"
    assert r["bitwise_repeat"], f"two calls differ: {r}"


@pytest.mark.hopper
@hopper
def test_gemm_rejects_unaligned():
    import torch
    A = torch.randn(128, 64, device="cuda").to(torch.bfloat16)
    B = torch.randn(64, 1001, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        sm90_gemm.gemm(A, B)


@pytest.mark.hopper
@hopper
@pytest.mark.parametrize("M,N,K,max_ctas", [
    (256, 256, 64, 0), (997, 1000, 1000, 0), (131, 264, 72, 0), (3001, 6216, 1000, 6), (1, 8, 8, 0),
    (4099, 776, 16392, 2),
])
def test_gemm_pair_clusters_match_reference(M, N, K, max_ctas):
    """Variant 3 (2-CTA clusters, B multicast): odd band counts leave the pair's second CTA past
    M (zero loads, no stores); small grids make each cluster walk many pairs in lock step."""
    import torch
    r = sm90_gemm.check_one(M, N, K, seed=M + N + K + 3, variant=3)
    assert r["nan"] == 0 and r["wrong"] == 0 and r["rel_err"] < 1e-2 and r["bitwise_repeat"], r
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    A = torch.randn((M, K), generator=g, device="cuda").to(torch.bfloat16)
    B = torch.randn((K, N), generator=g, device="cuda").to(torch.bfloat16)
    C0 = sm90_gemm.gemm(A, B, variant=0)
    C3 = torch.full_like(C0, float("nan"))
    sm90_gemm.gemm(A, B, out=C3, variant=3, max_ctas=max_ctas)
    torch.cuda.synchronize()
    # same k order per tile as the 1-CTA builder: the same bits
    assert torch.equal(C0.view(torch.int16), C3.view(torch.int16))
