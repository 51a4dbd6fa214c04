"""`symm-mem`: PyTorch SymmetricMemory async-TP, the baseline torch users get for free.

The two ops (``torch.distributed._symmetric_memory``):

* ``torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], gather_dim, group_name,
  return_A=...)`` -> ``(A_gathered | None, [A_gathered @ B])``. It pipelines the all-gather
  over ranks: each step copies one peer's shard out of a symmetric workspace (a plain
  device copy over NVLink P2P) while the matmul of the previous shard runs on another stream.
* ``torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim,
  group_name)`` -> ``reduce_scatter(A @ B)``. It computes the partial for one destination at
  a time into a symmetric workspace, peers pull it, and the W partials are summed at the end.

Our layouts map onto them with no transposes (W = world, r = rank; see ``Point``):

* ag-gemm:  A_shard = A_r (M/W x K), B = B_r (K x N/W), gather_dim=0
            -> C_r = A_full @ B_r (M x N/W).
* gemm-rs:  A = A_r (M x K/W), B = B_r (K/W x N), reduce_op='sum', scatter_dim=0
            -> band r of sum_p A_p @ B_p (M/W x N).

Both ops return fresh tensors; the runner copies the result into the harness's output
buffer, and that copy (M*N/W elements) is *included* in the timed call and stated in the
row (``extra_copy_bytes``). NVLink multicast stays off (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NCCL_NVLS_ENABLE=0``; only set when unset, never switched on), so the small-M multimem
path of the all-gather never runs.

This module also holds the small helpers the optional families share (``te.py``,
``flux.py``, ``deepep.py``) and ``optional_status()`` for ``kosmos-bench list`` / ``doctor``.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from types import ModuleType

import torch

from ..ops import get_op
from ..ops.base import ELEM_BYTES, torch_dtype
from ..point import Point
from .base import FnRunner, RankCtx, common_unsupported

# Multicast stays off on the lent machines (the NVLS paths are broken there); this only fills
# the variables in when unset and never turns multicast on. TORCH_SYMM_MEM_DISABLE_MULTICAST
# is read when symmetric memory is allocated, so setting it at import is early enough and
# touches nothing but SymmetricMemory; NCCL_NVLS_ENABLE is set again right before any
# rendezvous in prepare().
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

MULTI_GPU_FABRICS = ("nvlink",)
SINGLE_GPU_FABRICS = ("local", "host")


def keep_multicast_off() -> None:
    """Leave NVLink multicast off (setdefault only: an explicit user value is kept)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


# ---------------------------------------------------------------- shared helpers (optional families)


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


# ---------------------------------------------------------------- symm-mem

# The ops this family calls; all must exist in this torch build.
_OPS_NEEDED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")


def _torch_minor() -> tuple[int, int]:
    try:
        major, minor = torch.__version__.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def _symm_mem_ops_missing() -> str | None:
    """None when the async-TP ops exist in this torch build, else the reason."""
    mod, why = probe_import("torch.distributed._symmetric_memory")
    if mod is None:
        return why
    missing = [name for name in _OPS_NEEDED if not hasattr(torch.ops.symm_mem, name)]
    if missing:
        return (f"this torch build ({torch.__version__}) has no torch.ops.symm_mem."
                f"{', torch.ops.symm_mem.'.join(missing)}")
    if not hasattr(mod, "get_symm_mem_workspace"):
        return f"this torch build ({torch.__version__}) has no _symmetric_memory.get_symm_mem_workspace"
    return None


def _enable_group(group_name: str) -> None:
    """Register the group for symmetric memory where this torch still needs it.

    torch >= 2.11 resolves the group by name inside the rendezvous and deprecates
    enable_symm_mem_for_group (calling it there wraps the store in a second prefix); older
    releases need the call before the first workspace is allocated.
    """
    import torch.distributed._symmetric_memory as symm

    if _torch_minor() >= (2, 11):
        return
    enable = getattr(symm, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group_name)


def workspace_bytes(point: Point) -> int:
    """Symmetric workspace the op needs on each rank, in bytes.

    ag-gemm: one A shard, (M/W x K) elements; gemm-rs: two partial-C chunks (double
    buffered), 2 x (M/W x N) elements.
    """
    e = ELEM_BYTES[point.dtype]
    rows = point.M // point.world
    if point.op == "ag-gemm":
        return rows * point.K * e
    return 2 * rows * point.N * e


def fused_call(op: str, A: torch.Tensor, B: torch.Tensor, group_name: str, out: torch.Tensor,
               ag_op=None, rs_op=None):
    """The one fused call of `op` on this rank's shards, writing `out` in place.

    A, B: this rank's shards (ag-gemm: A_r (M/W x K), B_r (K x N/W); gemm-rs: A_r (M x K/W),
    B_r (K/W x N)); out: (M x N/W) or (M/W x N). ag_op / rs_op default to the torch ops; the
    CPU tests pass torch's reference fallbacks (same signature) to check the argument mapping.
    """
    if op == "ag-gemm":
        fused = ag_op if ag_op is not None else torch.ops.symm_mem.fused_all_gather_matmul
        schema = getattr(getattr(fused, "default", None), "_schema", None)
        takes_return_a = schema is None or any(a.name == "return_A" for a in schema.arguments)
        kw = {"return_A": False} if takes_return_a else {}  # the gathered A is not needed

        def fn() -> None:
            _, (c,) = fused(A, [B], 0, group_name, **kw)  # gather_dim=0: rows of A
            out.copy_(c)
    elif op == "gemm-rs":
        fused_rs = rs_op if rs_op is not None else torch.ops.symm_mem.fused_matmul_reduce_scatter

        def fn() -> None:
            out.copy_(fused_rs(A, B, "sum", 0, group_name))  # scatter_dim=0: bands of rows
    else:
        raise ValueError(f"symm-mem does not implement {op}")
    return fn


class SymmMemImpl:
    name = "symm-mem"
    ops = ("ag-gemm", "gemm-rs")
    fabrics = MULTI_GPU_FABRICS
    module = "torch.distributed._symmetric_memory"

    def available(self, backend: str) -> tuple[bool, str]:
        try:
            ok, why = gpu_nccl_ready(self.name, backend)
            if not ok:
                return ok, why
            missing = _symm_mem_ops_missing()
            if missing:
                return False, f"{self.name}: {missing}"
            return True, ""
        except Exception as e:  # noqa: BLE001 -- available() never raises; the reason is reported
            return False, f"{self.name}: availability check failed: {type(e).__name__}: {e}"

    def version(self) -> str | None:
        return torch.__version__

    def unsupported(self, point: Point) -> str | None:
        return multi_gpu_unsupported(self, point)

    def prepare(self, point: Point, ctx: RankCtx, inputs) -> FnRunner:
        """Rendezvous the symmetric workspace and return a runner of one fused call.

        inputs.A[r], inputs.B[r]: rank r's shards in the point's dtype, on ctx.device
        (ag-gemm: A_r (M/W x K), B_r (K x N/W); gemm-rs: A_r (M x K/W), B_r (K/W x N)).
        runner.outputs[r]: (M x N/W) for ag-gemm, (M/W x N) for gemm-rs, the point's dtype.
        Collective: every rank of the group must call prepare (the workspace rendezvous).
        """
        if point.op not in self.ops:
            raise ValueError(f"{self.name} does not implement {point.op}")
        keep_multicast_off()
        set_device(ctx)
        missing = _symm_mem_ops_missing()
        if missing:
            raise RuntimeError(f"{self.name}: {missing}")
        import torch.distributed._symmetric_memory as symm

        group = resolve_group(ctx, self.name)
        group_name = group.group_name
        _enable_group(group_name)
        r = ctx.rank
        A, B = inputs.A[r], inputs.B[r]
        if not A.is_contiguous():
            A = A.contiguous()  # the ops copy a non-contiguous shard every call; do it once here
        op = get_op(point.op)
        out = torch.empty(op.out_shape(point), dtype=torch_dtype(point.dtype), device=ctx.device)
        # Allocate + rendezvous the workspace now (collective), not inside the first timed call.
        symm.get_symm_mem_workspace(group_name, min_size=workspace_bytes(point))

        fn = fused_call(point.op, A, B, group_name, out)
        info = {
            "extra_copy_bytes": out.numel() * out.element_size(),
            "impl_note": "torch async-TP op returns a new tensor; copy into the output buffer is timed",
            "multicast": "off",
        }
        return FnRunner(fn=fn, outputs={r: out}, info=info)


SYMM_MEM = SymmMemImpl()
IMPLS = [SYMM_MEM]


# ---------------------------------------------------------------- status for `list` / `doctor`


def optional_status(backend: str = "gpu") -> list[dict]:
    """One dict per optional baseline family, for `kosmos-bench list` / `doctor`.

    Keys: name (impl name), ops (list of op names), fabrics (list), module (what it imports),
    available (bool, for `backend`), why ('' when available, else the one-line reason),
    version (str or None: the installed library's version, torch's for symm-mem).
    Never raises.
    """
    from . import deepep, flux, te  # here, not at the top: those modules import this one

    rows = []
    for impl in (SYMM_MEM, *te.IMPLS, *flux.IMPLS, *deepep.IMPLS):
        ok, why = impl.available(backend)
        try:
            version = impl.version()
        except Exception:  # noqa: BLE001 -- a version lookup must not break `list`
            version = None
        rows.append({
            "name": impl.name,
            "ops": list(impl.ops),
            "fabrics": list(impl.fabrics),
            "module": impl.module,
            "available": bool(ok),
            "why": why,
            "version": version,
        })
    return rows
