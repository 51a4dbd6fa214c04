"""Optional baselines (symm-mem, te-ub, flux, deepep): availability, skip reasons, registry.

CPU only. Availability is checked on both branches by mocking `importlib.util.find_spec`,
`sys.modules` entries and torch's CUDA/NCCL probes. The symm-mem argument mapping (gather /
scatter dims, B layouts, output bands) is checked on gloo with 2 and 3 ranks by swapping the
CUDA ops for torch's own reference fallbacks, which take the same arguments.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest
import torch

from kosmos_bench.impls import IMPLS, get_impl, optional_status
from kosmos_bench.impls import optional as opt
from kosmos_bench.impls import symm_mem as sm
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.point import Point

OPTIONAL = ("symm-mem", "te-ub", "flux", "deepep", "liger-moe")


@pytest.fixture(autouse=True)
def _fresh_probes():
    opt._IMPORT_PROBES.clear()
    yield
    opt._IMPORT_PROBES.clear()


def _gpu_machine(monkeypatch):
    """Pretend a CUDA device and an NCCL-enabled torch.distributed are present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)


def _fake_find_spec(present: set[str]):
    real = importlib.util.find_spec

    def find_spec(name, package=None):
        top = name.split(".")[0]
        if top in present:
            return importlib.machinery.ModuleSpec(name, loader=None)
        if top in ("transformer_engine", "flux", "deep_ep"):
            return None
        return real(name, package)

    return find_spec


def _fake_module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def _pt(**kw) -> Point:
    base = dict(op="ag-gemm", impl="symm-mem", M=256, N=384, K=512, world=2, dtype="bf16",
                fabric="nvlink", backend="gpu")
    base.update(kw)
    return Point(**base)


# ------------------------------------------------------------------ registry and status


def test_registry_exposes_optional_families():
    for name in OPTIONAL:
        impl = IMPLS[name]
        assert get_impl(name) is impl
        assert impl.name == name
        assert isinstance(impl.ops, tuple) and isinstance(impl.fabrics, tuple)
        # the multi-GPU libraries run only where every rank has its own GPU; liger-moe is a
        # single-GPU kernel that the host / local views run per rank
        expected = {"liger-moe": ("nvlink", "local", "host")}.get(name, ("nvlink",))
        assert impl.fabrics == expected, name
        for attr in ("available", "unsupported", "prepare", "version"):
            assert callable(getattr(impl, attr)), (name, attr)
    assert IMPLS["symm-mem"].ops == ("ag-gemm", "gemm-rs", "ag-gemm-dgrad", "gemm-rs-dgrad")
    assert IMPLS["te-ub"].ops == ("ag-gemm", "gemm-rs")
    assert IMPLS["flux"].ops == ("ag-gemm", "gemm-rs")
    assert IMPLS["deepep"].ops == ("moe", "moe-bwd", "moe-step")


def test_optional_status_shape():
    rows = optional_status()
    assert [r["name"] for r in rows] == list(OPTIONAL)
    keys = {"name", "ops", "fabrics", "module", "available", "why", "version"}
    for r in rows:
        assert set(r) == keys
        assert isinstance(r["available"], bool)
        assert isinstance(r["why"], str) and isinstance(r["ops"], list)
        assert r["version"] is None or isinstance(r["version"], str)
        # unavailable always carries a one-line reason; available carries none
        assert bool(r["why"]) != r["available"], r
        assert "\n" not in r["why"]
    assert rows[0]["version"] == torch.__version__


def test_optional_status_on_cpu_backend_names_the_backend():
    for r in optional_status("cpu"):
        assert r["available"] is False
    symm = optional_status("cpu")[0]
    assert "gpu backend" in symm["why"] and "'cpu'" in symm["why"]


# ------------------------------------------------------------------ symm-mem availability


def test_symm_mem_unavailable_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = IMPLS["symm-mem"].available("gpu")
    assert ok is False
    assert "needs a CUDA GPU" in why and "torch.cuda.is_available() is False" in why


def test_symm_mem_unavailable_without_nccl(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    ok, why = IMPLS["symm-mem"].available("gpu")
    assert ok is False and "NCCL" in why


def test_symm_mem_unavailable_when_ops_missing(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(sm, "_OPS_NEEDED", ("fused_all_gather_matmul", "no_such_fused_op"))
    ok, why = IMPLS["symm-mem"].available("gpu")
    assert ok is False
    assert "torch.ops.symm_mem.no_such_fused_op" in why and "fused_all_gather_matmul" not in why


def test_symm_mem_available_when_everything_is_there(monkeypatch):
    _gpu_machine(monkeypatch)
    assert IMPLS["symm-mem"].available("gpu") == (True, "")


def test_symm_mem_available_never_raises(monkeypatch):
    def boom():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    ok, why = IMPLS["symm-mem"].available("gpu")
    assert ok is False and "driver exploded" in why


# ------------------------------------------------------------------ te-ub / flux / deepep availability


@pytest.mark.parametrize("name, phrase", [
    ("te-ub", "TransformerEngine is not installed"),
    ("flux", "ByteDance Flux is not installed"),
    ("deepep", "DeepEP is not installed"),
])
def test_missing_library(monkeypatch, name, phrase):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec(set()))
    ok, why = IMPLS[name].available("gpu")
    assert ok is False and phrase in why
    assert IMPLS[name].version() is None or isinstance(IMPLS[name].version(), str)


def _install_fake_te(monkeypatch, with_init=True):
    _fake_module(monkeypatch, "transformer_engine", __version__="9.9")
    _fake_module(monkeypatch, "transformer_engine.pytorch", Linear=object)
    _fake_module(monkeypatch, "transformer_engine.pytorch.module")
    attrs = {"initialize_ub": lambda *a, **k: None} if with_init else {}
    _fake_module(monkeypatch, "transformer_engine.pytorch.module.base", **attrs)


def test_te_available_with_library(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"transformer_engine"}))
    _install_fake_te(monkeypatch)
    assert IMPLS["te-ub"].available("gpu") == (True, "")


def test_te_without_userbuffers_api(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"transformer_engine"}))
    _install_fake_te(monkeypatch, with_init=False)
    ok, why = IMPLS["te-ub"].available("gpu")
    assert ok is False and "initialize_ub" in why


def test_te_present_but_cpu_backend(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"transformer_engine"}))
    ok, why = IMPLS["te-ub"].available("cpu")
    assert ok is False and "gpu backend" in why


def test_flux_available_with_library(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"flux"}))
    _fake_module(monkeypatch, "flux", AGKernel=object, GemmRS=object)
    assert IMPLS["flux"].available("gpu") == (True, "")


def test_flux_name_clash_is_reported(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"flux"}))
    _fake_module(monkeypatch, "flux", AGKernel=object)  # some other package called flux
    ok, why = IMPLS["flux"].available("gpu")
    assert ok is False and "not ByteDance Flux" in why and "flux.GemmRS" in why


def test_broken_install_is_reported(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"flux", "deep_ep"}))
    monkeypatch.setitem(sys.modules, "flux", None)  # import_module raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "deep_ep", None)
    ok, why = IMPLS["flux"].available("gpu")
    assert ok is False and "installed but fails to import" in why and "ModuleNotFoundError" in why
    ok, why = IMPLS["deepep"].available("gpu")
    assert ok is False and "installed but fails to import" in why


def test_deepep_detected(monkeypatch):
    _gpu_machine(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec({"deep_ep"}))
    _fake_module(monkeypatch, "deep_ep", Buffer=object, __version__="1.2.3")
    assert IMPLS["deepep"].available("gpu") == (True, "")
    row = [r for r in optional_status() if r["name"] == "deepep"][0]
    assert row["available"] is True and row["version"] == "1.2.3"


# ------------------------------------------------------------------ skip reasons


@pytest.mark.parametrize("name", ["symm-mem", "te-ub", "flux"])
def test_skip_world_1(name):
    why = IMPLS[name].unsupported(_pt(impl=name, world=1))
    assert why and ">=2 GPUs" in why and "world=1" in why


@pytest.mark.parametrize("name", ["symm-mem", "te-ub", "flux"])
@pytest.mark.parametrize("fabric", ["host", "local"])
def test_skip_single_gpu_fabrics(name, fabric):
    why = IMPLS[name].unsupported(_pt(impl=name, fabric=fabric, world=8))
    assert why and f"fabric {fabric} is a single-GPU emulation" in why


@pytest.mark.parametrize("name", ["symm-mem", "te-ub", "flux"])
def test_skip_gloo_fabric(name):
    why = IMPLS[name].unsupported(_pt(impl=name, fabric="gloo", backend="cpu", world=2))
    assert why and "gloo" in why


@pytest.mark.parametrize("name", ["symm-mem", "te-ub", "flux"])
@pytest.mark.parametrize("op", ["ag-gemm", "gemm-rs"])
def test_multi_gpu_points_are_supported(name, op):
    assert IMPLS[name].unsupported(_pt(impl=name, op=op, world=8)) is None


def test_dtype_limits():
    assert IMPLS["symm-mem"].unsupported(_pt(dtype="fp32")) is None
    for name in ("te-ub", "flux"):
        why = IMPLS[name].unsupported(_pt(impl=name, dtype="fp32"))
        assert why and "fp32" in why


def test_deepep_is_detected_and_skipped_for_moe():
    why = IMPLS["deepep"].unsupported(_pt(impl="deepep", world=8))
    assert why and "does not implement ag-gemm" in why
    why = IMPLS["deepep"].unsupported(_pt(impl="deepep", op="moe", world=8))
    assert why and "detected only" in why
    why = IMPLS["deepep"].unsupported(_pt(impl="deepep", op="moe", world=8, fabric="host"))
    assert why and "needs >=2 GPUs" in why
    with pytest.raises(NotImplementedError, match="detection only"):
        IMPLS["deepep"].prepare(_pt(impl="deepep"), None, None)


def test_symm_mem_prepare_on_cpu_says_why():
    ctx = RankCtx(rank=0, world=2, procs=2, device=torch.device("cpu"), fabric="nvlink", backend="gpu")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        IMPLS["symm-mem"].prepare(_pt(), ctx, None)


def test_workspace_bytes():
    assert sm.workspace_bytes(_pt(op="ag-gemm", M=256, K=512, world=4)) == 64 * 512 * 2
    assert sm.workspace_bytes(_pt(op="gemm-rs", M=256, N=384, world=4, dtype="fp32")) == 2 * 64 * 384 * 4


def test_multicast_stays_off_by_default(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    opt.keep_multicast_off()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


# ------------------------------------------------------------------ symm-mem argument mapping (gloo)

_SHAPES = [("ag-gemm", 6, 10, 7), ("gemm-rs", 6, 10, 9), ("ag-gemm", 12, 9, 5), ("gemm-rs", 9, 7, 12)]


def _mapping_worker(rank: int, world: int, init_file: str) -> None:
    """Runs every shape at W=3 (the world group) and W=2 (a subgroup of ranks 0, 1)."""
    import torch.distributed as dist

    from kosmos_bench.ops import get_op
    from kosmos_bench.ops.base import check_output
    from torch.distributed._symmetric_memory import (
        _fused_all_gather_matmul_fallback,
        _fused_matmul_reduce_scatter_fallback,
    )

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        pair = dist.new_group([0, 1])  # collective: every rank creates it
        groups = [(dist.group.WORLD, world)] + ([(pair, 2)] if rank < 2 else [])
        for group, w in groups:
            for op_name, m, n, k in _SHAPES:
                for dtype in ("fp32", "bf16"):
                    # scale the shape so it splits across w ranks, keeping awkward sizes
                    p = Point(op=op_name, impl="symm-mem", M=m * w, N=n * w, K=k * w, world=w,
                              dtype=dtype, fabric="nvlink", backend="cpu")
                    op = get_op(op_name)
                    inputs, A, B = op.inputs(p, [rank], "cpu", seed=11)
                    out = torch.full(op.out_shape(p), float("nan"), dtype=inputs.A[rank].dtype)
                    fn = sm.fused_call(op_name, inputs.A[rank], inputs.B[rank], group.group_name, out,
                                       ag_op=_fused_all_gather_matmul_fallback,
                                       rs_op=_fused_matmul_reduce_scatter_fallback)
                    fn()
                    ref = op.reference(A, B, rank, w)
                    wrong, max_rel = check_output(out, ref, dtype)
                    assert wrong == 0, (op_name, dtype, w, rank, wrong, max_rel)
    finally:
        dist.destroy_process_group()


def test_symm_mem_argument_mapping_on_gloo(tmp_path):
    """symm-mem's gather/scatter dims and B layouts give each rank the op's reference (W=2, 3)."""
    import time

    import torch.multiprocessing as mp

    try:
        from torch.distributed._symmetric_memory import (  # noqa: F401
            _fused_all_gather_matmul_fallback,
            _fused_matmul_reduce_scatter_fallback,
        )
    except ImportError as e:
        pytest.skip(f"this torch has no symm_mem reference fallbacks: {e}")
    world, deadline = 3, 120.0
    ctx = mp.start_processes(_mapping_worker, args=(world, str(tmp_path / "store")), nprocs=world,
                             join=False, start_method="spawn")
    t0 = time.monotonic()
    while not ctx.join(timeout=1):
        if time.monotonic() - t0 > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"gloo mapping workers did not finish in {deadline:.0f}s")
