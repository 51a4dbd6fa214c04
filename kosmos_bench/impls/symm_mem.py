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

The helpers the multi-GPU families share (this one, ``te.py``, ``flux.py``, ``deepep.py``) are in
``optional.py``; ``optional_status()`` for ``kosmos-bench list`` / ``doctor`` is in ``impls/__init__.py``.
"""
from __future__ import annotations

import os
import warnings

import torch

from ..ops import get_op
from ..ops.base import ELEM_BYTES, torch_dtype
from ..point import Point
from .base import FnRunner, RankCtx, SkipPoint
from .optional import (
    MULTI_GPU_FABRICS,
    gpu_nccl_ready,
    multi_gpu_unsupported,
    probe_import,
    resolve_group,
    start_prepare,
)

# Multicast stays off on the lent machines (the NVLS paths are broken there); this only fills
# the variables in when unset and never turns multicast on. TORCH_SYMM_MEM_DISABLE_MULTICAST
# is read when symmetric memory is allocated, so setting it at import is early enough and
# touches nothing but SymmetricMemory; NCCL_NVLS_ENABLE is set again right before any
# rendezvous in prepare().
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

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
    if get_op(point.op).base == "ag-gemm":
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
    # the dgrad ops are the same fused ops with B_r a transposed view (ops/backward.py): torch's
    # matmul reads it in place; torch has no fused all-gather along K (ag-wgrad)
    ops = ("ag-gemm", "gemm-rs", "ag-gemm-dgrad", "gemm-rs-dgrad")
    fabrics = MULTI_GPU_FABRICS
    module = "torch.distributed._symmetric_memory"
    # shared-GPU mode (sharing.py): the workspace rendezvous runs over the gloo group with
    # TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1; the ops sync through signal pads, not NCCL
    runs_shared_gpu = True

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
        start_prepare(self, point, ctx)
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
        if ctx.shared_gpu:  # a torch refusal here is a limit of torch on one GPU, not a failure
            try:
                symm.get_symm_mem_workspace(group_name, min_size=workspace_bytes(point))
            except Exception as e:  # noqa: BLE001
                raise SkipPoint(f"{self.name}: torch symmetric memory refused the shared-GPU rendezvous "
                                f"(several ranks on one GPU, gloo group): {type(e).__name__}: "
                                f"{' '.join(str(e).split())[:300]}") from e
        else:
            symm.get_symm_mem_workspace(group_name, min_size=workspace_bytes(point))

        fn = fused_call(op.base, A, B, group_name, out)
        info = {
            "extra_copy_bytes": out.numel() * out.element_size(),
            "impl_note": "torch async-TP op returns a new tensor; copy into the output buffer is timed",
            "multicast": "off",
        }
        return FnRunner(fn=fn, outputs={r: out}, info=info)


SYMM_MEM = SymmMemImpl()
IMPLS = [SYMM_MEM]
