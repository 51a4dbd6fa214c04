"""Shared-GPU mode of the nvlink fabric: the launch decision (CPU only)."""
from __future__ import annotations

import pytest

from kosmos_bench import harness, launch, sharing
from kosmos_bench.point import Point


def P(world, fabric="nvlink", backend="gpu", impl="kosmos"):
    return Point(op="ag-gemm", impl=impl, M=96, N=60, K=40, world=world, fabric=fabric, backend=backend)


@pytest.mark.parametrize("world,n,shared,backend,devices", [
    (2, 1, True, "gloo", (0, 0)),
    (4, 1, True, "gloo", (0, 0, 0, 0)),
    (4, 2, True, "gloo", (0, 1, 0, 1)),
    (2, 2, False, "nccl", (0, 1)),
    (2, 8, False, "nccl", (0, 1)),
])
def test_nvlink_layout_by_gpu_count(world, n, shared, backend, devices):
    lay = sharing.layout("nvlink", "gpu", world, n)
    assert (lay.shared_gpu, lay.group_backend, lay.devices) == (shared, backend, devices)
    assert lay.reason


def test_explicit_sharing_and_its_refusal():
    lay = sharing.layout("nvlink", "gpu", 2, 8, force_shared=True)
    assert lay.shared_gpu and lay.group_backend == "gloo" and lay.devices == (0, 0)
    lay = sharing.layout("nvlink", "gpu", 4, 1, force_shared=False)
    assert not lay.shared_gpu and lay.group_backend == "nccl"


def test_other_fabrics_never_share():
    assert not sharing.layout("local", "gpu", 4, 1).shared_gpu
    assert sharing.layout("local", "gpu", 4, 1).group_backend is None
    assert not sharing.layout("host", "gpu", 8, 1).shared_gpu
    assert sharing.layout("gloo", "cpu", 3, 0).group_backend == "gloo"
    assert sharing.layout("nvlink", "cpu", 3, 0).group_backend == "gloo"
    assert not sharing.layout("nvlink", "cpu", 3, 0).shared_gpu


def test_rows_are_labelled_emulated_in_shared_mode(monkeypatch):
    monkeypatch.setattr(sharing, "visible_gpus", lambda: 1)
    row = harness.base_row(P(2))
    assert row["shared_gpu"] is True and row["emulated"] is True
    monkeypatch.setattr(sharing, "visible_gpus", lambda: 2)
    row = harness.base_row(P(2))
    assert row["shared_gpu"] is False and row["emulated"] is False
    assert harness.base_row(P(2, fabric="local"))["emulated"] is True
    assert harness.base_row(P(2, fabric="gloo", backend="cpu"))["shared_gpu"] is False


def test_forced_setting_reaches_the_layout(monkeypatch):
    monkeypatch.setattr(sharing, "visible_gpus", lambda: 8)
    try:
        sharing.set_forced(True)
        assert launch.group_layout(P(2)).shared_gpu
        sharing.set_forced(None)
        assert not launch.group_layout(P(2)).shared_gpu
    finally:
        sharing.set_forced(None)


def test_nccl_baselines_and_nccl_families_skip_in_shared_mode(monkeypatch):
    from kosmos_bench.impls import get_impl

    monkeypatch.setattr(sharing, "visible_gpus", lambda: 1)
    for name in ("nccl-seq", "nccl-overlap"):
        why = get_impl(name).unsupported(P(2, impl=name))
        assert why and "shared-GPU" in why and "Duplicate GPU" in why
    from kosmos_bench.impls.optional import multi_gpu_unsupported
    from kosmos_bench.impls.symm_mem import SYMM_MEM

    assert multi_gpu_unsupported(SYMM_MEM, P(2, impl="symm-mem")) is None

    class Other:
        name, ops, fabrics = "te-ub", ("ag-gemm",), ("nvlink",)

    assert "Duplicate GPU" in multi_gpu_unsupported(Other(), P(2, impl="te-ub"))
    monkeypatch.setattr(sharing, "visible_gpus", lambda: 2)
    assert get_impl("nccl-seq").unsupported(P(2, impl="nccl-seq")) is None


def test_sweep_header_says_emulated(monkeypatch):
    monkeypatch.setattr(sharing, "visible_gpus", lambda: 1)
    assert "measure nothing about NVLink" in sharing.EMULATED_NOTE
    assert sharing.is_shared(P(2)) and not sharing.is_shared(P(1))


def test_sweep_header_line_names_the_emulation(monkeypatch, tmp_path, capsys):
    from kosmos_bench import cli
    from kosmos_bench.store import RunStore

    monkeypatch.setattr(sharing, "visible_gpus", lambda: 1)
    monkeypatch.setattr(cli, "execute", lambda *a, **k: None)
    store = RunStore.create(tmp_path, run_id="shared")
    cli.run_and_report(store, "smoke", [P(2)], "gpu", total=1)
    assert "measure nothing about NVLink" in capsys.readouterr().out
