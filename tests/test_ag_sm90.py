"""CPU tests of the opt-in Hopper-builder AG+GEMM plumbing (kernels/ag_sm90.py); the kernel
itself is tested on the GPU (tests/test_kosmos_gpu.py, -k sm90)."""
from __future__ import annotations

import pytest

from kosmos_bench import schedule as S
from kosmos_bench.kernels import ag_sm90, libs
from kosmos_bench.kosmos import builder


def test_validate_mirrors_tma_rules():
    assert builder.validate(3000 * 8, 776 * 8, 1000, 8) is None
    assert builder.validate(16384, 57344, 8192, 8) is None
    assert "N/world" in builder.validate(3000 * 8, 777 * 8, 1000, 8)
    assert "K must be" in builder.validate(1024, 1024, 1001, 2)
    assert "divisible" in builder.validate(1001, 1024, 1024, 2)
    assert "world" in builder.validate(1024, 1024, 1024, 9)


def test_builder_choice():
    assert builder.builder_choice(None) == "mma"  # default unchanged
    assert builder.builder_choice("sm90") == "sm90"
    assert builder.builder_choice("mma") == "mma"
    with pytest.raises(ValueError):
        builder.builder_choice("wgmma")


def test_lib_name_covers_kosmos_headers():
    names = {p.name for p in libs.hashed_files(ag_sm90.LIB)}
    assert {"persistent.cuh", "builder_sm90.cuh", "sync.cuh", "queue.cuh", "trace.cuh", "mover.cuh",
            "params.h"} <= names
    assert ag_sm90.lib_name().startswith("libkosmos_ag_sm90-") and ag_sm90.lib_name().endswith("-sm_90a.so")


@pytest.mark.parametrize("W,M,N,K", [(8, 3000 * 8, 776 * 8, 1000), (4, 2048 * 4, 512 * 4, 1024)])
def test_schedule_bn256_tiles(W, M, N, K):
    """The variant's schedule: 128 x 256 builder tiles, n0 on 256-column block boundaries, m0 on
    128-row block boundaries inside each rank's band (what produce_at's TMA coordinates need)."""
    sch = S.build_schedule("ag-gemm", M, N, K, W, 0, BM=builder.BM, BN=builder.BN, num_wgs=132 // W)
    t = sch.builders.table
    n_loc, m_loc = N // W, M // W
    assert (t[:, S.F["n0"]] % 256 == 0).all() and (t[:, S.F["cols"]] <= 256).all()
    assert (t[:, S.F["m0"]] % 128 == 0).all() and (t[:, S.F["rows"]] <= 128).all()
    assert (t[:, S.F["cols"]] % 8 == 0).all()
    # every C element covered exactly once
    area = int((t[:, S.F["rows"]].astype(int) * t[:, S.F["cols"]].astype(int)).sum())
    assert area == M * n_loc
    assert len(sch.builders) == W * -(-m_loc // 128) * -(-n_loc // 256)


def test_builder_choice_picks_by_device_and_shape(monkeypatch):
    monkeypatch.setattr(ag_sm90, "find_lib", lambda: "prebuilt")
    shape = (8192, 8192, 8192, 8)
    assert builder.builder_choice(None, "ag-gemm", shape, (9, 0)) == "sm90"
    assert builder.builder_choice(None, "ag-gemm", shape, (8, 0)) == "mma"  # not Hopper
    assert builder.builder_choice(None, "ag-gemm", shape, None) == "mma"  # no GPU
    assert builder.builder_choice(None, "gemm-rs", shape, (9, 0)) == "sm90"  # sm90 gemm-rs: the default (AUTO_OPS)
    assert builder.builder_choice("sm90", "gemm-rs", shape, (9, 0)) == "sm90"
    assert builder.builder_choice(None, "ag-gemm", (8192, 8192, 999, 8), (9, 0)) == "mma"  # K % 8
    assert builder.builder_choice(None, "ag-gemm", shape, (9, 0), mover_bulk=True) == "mma"
    assert builder.builder_choice("mma", "ag-gemm", shape, (9, 0)) == "mma"  # explicit wins
    with pytest.raises(ValueError):
        builder.builder_choice("tensor")


# ---- GEMM+RS on the Hopper builder (gemm_rs_sm90_kernel, opt-in: builder=sm90) ----

def test_validate_rs_mirrors_tma_rules():
    assert builder.validate(8192, 8192, 8192, 8, op="gemm-rs") is None
    assert builder.validate(3000 * 5, 776, 1000, 5, op="gemm-rs") is None  # K/W = 200
    assert builder.validate(3000 * 8, 777 * 8, 1000, 8, op="ag-gemm") is not None
    assert "K/world" in builder.validate(3000 * 8, 776, 1000, 8, op="gemm-rs")  # K/W = 125
    assert "N must be" in builder.validate(1024, 1001, 1024, 2, op="gemm-rs")
    assert "divisible" in builder.validate(1024, 1024, 1001, 2, op="gemm-rs")
    assert "divisible" in builder.validate(1001, 1024, 1024, 2, op="gemm-rs")
    assert "world" in builder.validate(1024, 1024, 1024, 9, op="gemm-rs")
    # N need not divide by world for gemm-rs (N/W is ag-gemm's rule)
    assert builder.validate(1024 * 3, 776, 240 * 3, 3, op="gemm-rs") is None


def test_auto_ops_pick_sm90_for_both_ops():
    """Both fused ops get the Hopper builder by default (verified on the H200); ag-wgrad has no
    other (A read transposed: TMA), where the shape suits it."""
    assert builder.AUTO_OPS == ("ag-gemm", "gemm-rs", "ag-wgrad")
    assert builder.builder_choice(None, "ag-wgrad", (264, 1088, 1600, 8), (9, 0), library_ok=lambda: True) == "sm90"
    assert builder.validate(264, 1088, 1600, 8, op="ag-wgrad") is None
    assert "M must be a multiple of 8" in builder.validate(260, 1088, 1600, 8, op="ag-wgrad")
    assert "N/world" in builder.validate(264, 1000, 1600, 8, op="ag-wgrad")
    assert "K and N" in builder.validate(264, 1088, 1601, 8, op="ag-wgrad")


def test_sm90_schedule_model_scales_tile_movers():
    m = builder.schedule_model("host")
    base = S.MODEL_DEFAULTS["host"]
    assert m["wg_tile_copy_gbs"] == pytest.approx(base["wg_tile_copy_gbs"] * builder.MOVER_THREADS / 256)
    assert m["wg_copy_gbs"] == pytest.approx(base["wg_copy_gbs"] * builder.MOVER_THREADS / 256)


@pytest.mark.parametrize("W,M,N,K", [(8, 3000 * 8, 776, 1000 * 8 // 5), (5, 3000 * 5, 776 * 5, 1000),
                                     (3, 1000 * 3, 8 * 97, 240 * 3), (1, 4096, 8192, 8192)])
@pytest.mark.parametrize("fabric", ["local", "host"])
def test_rs_schedule_bn256_tiles(W, M, N, K, fabric):
    """gemm-rs with the sm90 tile: builder tiles on 128 x 256 block boundaries of each destination
    band (produce_at's TMA coordinates), cols % 8 == 0 (consume_to), every partial element built
    once per band, reduces cover C_r once, pushes/proxies cover the other bands."""
    from kosmos_bench.kosmos.config import KosmosConfig
    from kosmos_bench.kosmos.plan import plan
    from kosmos_bench.point import Point

    assert builder.validate(M, N, K, W, op="gemm-rs") is None
    pt = Point(op="gemm-rs", impl="kosmos", M=M, N=N, K=K, world=W, fabric=fabric, builder="sm90")
    cfg = KosmosConfig.from_point(pt)
    pl = plan(pt, cfg, {0: 132 if fabric == "host" else 132 // W}, builder="sm90")
    sch = pl.scheds[0]
    assert (sch.BM, sch.BN) == (128, 256)
    t = sch.builders.table
    m_loc = M // W
    assert (t[:, S.F["kind"]] == S.RS_BUILD).all()
    assert (t[:, S.F["n0"]] % 256 == 0).all() and (t[:, S.F["cols"]] <= 256).all()
    assert (t[:, S.F["m0"]] % 128 == 0).all() and (t[:, S.F["rows"]] <= 128).all()
    assert (t[:, S.F["cols"]] % 8 == 0).all()
    assert ((t[:, S.F["m0"]] + t[:, S.F["rows"]]) <= m_loc).all()
    area = int((t[:, S.F["rows"]].astype(int) * t[:, S.F["cols"]].astype(int)).sum())
    assert area == M * N  # W bands of m_loc x N
    r = sch.reduces.table
    assert int((r[:, S.F["rows"]].astype(int) * r[:, S.F["cols"]].astype(int)).sum()) == m_loc * N
    mv = sch.movers.table
    push = mv[mv[:, S.F["kind"]] == S.RS_PUSH]
    assert int((push[:, S.F["rows"]].astype(int) * push[:, S.F["cols"]].astype(int)).sum()) == (W - 1) * m_loc * N
    assert not pl.resolved.k_stream  # the sm90 gemm-rs kernel has no K-slice streaming


def test_unsupported_rs_sm90_names_tma_rule():
    from kosmos_bench.impls.kosmos import IMPLS
    from kosmos_bench.point import Point

    impl = IMPLS[0]
    ok = Point(op="gemm-rs", impl="kosmos", M=8192, N=8192, K=8192, world=8, fabric="host", builder="sm90")
    assert impl.unsupported(ok) is None
    bad = ok.replace(K=1000)  # K/W = 125
    assert "K/world" in impl.unsupported(bad)


def test_validate_rs_agrees_with_the_library():
    """The C validate_rs (kosmos_sm90_rs_validate) and kosmos.builder.validate(op='gemm-rs') say
    the same, when a built library is at hand (no GPU needed to call it)."""
    import ctypes

    path = ag_sm90.find_lib()
    if path is None:
        pytest.skip("no built libkosmos_ag_sm90 in the cache")
    lib = ag_sm90._declare(ctypes.CDLL(str(path)))
    for shape in [(8192, 8192, 8192, 8), (8000, 1064, 1000, 8), (1000, 1001, 800, 1), (1000, 1000, 1000, 9),
                  (1001, 1000, 1000, 2), (3000, 776, 600, 3), (0, 8, 8, 1)]:
        assert lib.kosmos_sm90_rs_validate(*shape).decode() == (builder.validate(*shape, op="gemm-rs") or ""), shape
