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
    assert builder.builder_choice(None, "gemm-rs", shape, (9, 0)) == "mma"  # no sm90 variant
    assert builder.builder_choice(None, "ag-gemm", (8192, 8192, 999, 8), (9, 0)) == "mma"  # K % 8
    assert builder.builder_choice(None, "ag-gemm", shape, (9, 0), mover_bulk=True) == "mma"
    assert builder.builder_choice("mma", "ag-gemm", shape, (9, 0)) == "mma"  # explicit wins
    with pytest.raises(ValueError):
        builder.builder_choice("tensor")
