"""Helpers the multi-GPU baseline families share (``symm_mem.py``, ``te.py``, ``flux.py``,
``deepep.py``): optional-library probing, availability and skip reasons, the process group.

Imports no family, so every family imports it (and ``impls/__init__.py`` imports them all).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from types import ModuleType

import torch

from ..point import Point
from .base import RankCtx, common_unsupported

MULTI_GPU_FABRICS = ("nvlink",)
SINGLE_GPU_FABRICS = ("local", "host")


def keep_multicast_off() -> None:
    """Leave NVLink multicast off (setdefault only: an explicit user value is kept)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def module_present(module: str) -> bool:
    """True when `module` can be found on sys.path (nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module without __spec__
        return False


_IMPORT_PROBES: dict[str, tuple[ModuleType | None, str]] = {}


def probe_import(module: str) -> tuple[ModuleType | None, str]:
    """Import `module` once per process: (module, '') or (None, one-line reason).

    Only called after `module_present` said the module exists, so a failure here is a broken
    install (missing CUDA library, ABI mismatch with this torch, ...) and the reason says so.
    """
    if module not in _IMPORT_PROBES:
        try:
            mod = importlib.import_module(module)
            _IMPORT_PROBES[module] = (mod, "")
        except Exception as e:  # noqa: BLE001 -- reported, never hidden
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            _IMPORT_PROBES[module] = (None, f"'{module}' is installed but fails to import: {type(e).__name__}: {msg}")
    return _IMPORT_PROBES[module]


def dist_version(*dists: str, module: str | None = None) -> str | None:
    """Installed version of the first distribution found, else the imported module's __version__."""
    for name in dists:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 -- a broken metadata dir must not break `list`
            continue
    if module is not None:
        mod, _ = _IMPORT_PROBES.get(module, (None, ""))
        v = getattr(mod, "__version__", None)
        if v is not None:
            return str(v)
    return None


def gpu_nccl_ready(name: str, backend: str) -> tuple[bool, str]:
    """Shared checks: the gpu backend, a visible CUDA device, torch.distributed with NCCL."""
    if backend != "gpu":
        return False, f"{name} runs only on the gpu backend (backend here: {backend!r})"
    if not torch.cuda.is_available():
        build = "CPU-only torch build" if torch.version.cuda is None and getattr(torch.version, "hip", None) is None else "no device visible"
        return False, f"{name} needs a CUDA GPU (torch.cuda.is_available() is False: {build}, torch {torch.__version__})"
    import torch.distributed as dist

    if not dist.is_available():
        return False, f"{name} needs torch.distributed, which this torch build ({torch.__version__}) lacks"
    if not dist.is_nccl_available():
        return False, f"{name} needs torch.distributed's NCCL backend, which this torch build ({torch.__version__}) lacks"
    return True, ""


def optional_available(name: str, backend: str, module: str, not_installed: str, api: str | None = None,
                       check=None) -> tuple[bool, str]:
    """available() of an optional multi-GPU baseline, in the order a user fixes things: the
    package installed (``not_installed`` says how to get it), the gpu backend with NCCL, its
    API module (``api``, default ``module``) importing, then ``check(mod)`` -> a reason or None
    (the API it needs is there). Never raises: a failing check is the reason."""
    try:
        if not module_present(module):
            return False, f"{name}: {not_installed}"
        ok, why = gpu_nccl_ready(name, backend)
        if not ok:
            return ok, why
        mod, why = probe_import(api or module)
        if mod is None:
            return False, f"{name}: {why}"
        bad = check(mod) if check else None
        return (False, f"{name}: {bad}") if bad else (True, "")
    except Exception as e:  # noqa: BLE001 -- available() never raises; the reason is reported
        return False, f"{name}: availability check failed: {type(e).__name__}: {e}"


def multi_gpu_unsupported(impl, point: Point) -> str | None:
    """Skip reasons of every multi-GPU-only baseline (symm-mem, te-ub, flux, deepep)."""
    if point.fabric in SINGLE_GPU_FABRICS:
        return (f"{impl.name} needs >=2 GPUs with peer access (fabric {point.fabric} is a "
                f"single-GPU emulation)")
    if point.world < 2:
        return f"{impl.name} needs >=2 GPUs with peer access (world={point.world})"
    if not getattr(impl, "runs_shared_gpu", False) and point.backend == "gpu":
        from .. import sharing

        if sharing.is_shared(point):
            return sharing.needs_nccl_reason(impl.name)
    return common_unsupported(impl, point)


def half_precision_unsupported(impl, point: Point, what: str) -> str | None:
    """multi_gpu_unsupported, then: `what` runs bf16/fp16 only (te-ub, flux)."""
    why = multi_gpu_unsupported(impl, point)
    if why:
        return why
    if point.dtype not in ("bf16", "fp16"):
        return f"{what}, not {point.dtype}"
    return None


def resolve_group(ctx: RankCtx, name: str):
    """The NCCL process group of this point, checked against ctx's rank and world.

    ctx.group is None when only one process takes part (world 1); the default group is used
    then, if torch.distributed is initialized.
    """
    import torch.distributed as dist

    group = ctx.group
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{name} needs an initialized torch.distributed NCCL process group "
                               "(ctx.group is None and torch.distributed is not initialized)")
        group = dist.group.WORLD
    g_rank, g_size = dist.get_rank(group), dist.get_world_size(group)
    if (g_rank, g_size) != (ctx.rank, ctx.world):
        raise RuntimeError(f"{name}: process group has rank {g_rank} of {g_size}, but the point "
                           f"expects rank {ctx.rank} of {ctx.world}")
    return group


def set_device(ctx: RankCtx) -> None:
    if ctx.device.type != "cuda":
        raise RuntimeError(f"needs a CUDA device, got {ctx.device}")
    if ctx.device.index is not None and torch.cuda.current_device() != ctx.device.index:
        torch.cuda.set_device(ctx.device)


def start_prepare(impl, point: Point, ctx: RankCtx) -> None:
    """The first steps of every multi-GPU family's prepare(): the op is one of the family's,
    NVLink multicast stays off, ctx's device is the current one."""
    if point.op not in impl.ops:
        raise ValueError(f"{impl.name} does not implement {point.op}")
    keep_multicast_off()
    set_device(ctx)
