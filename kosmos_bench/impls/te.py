"""`te-ub`: TransformerEngine userbuffers comm+GEMM overlap (te.pytorch.Linear, forward).

Available only where ``transformer_engine`` is installed and imports. The layer is the one a
Megatron user runs with ``--tp-comm-overlap``: a sequence-parallel ``te.pytorch.Linear``
whose forward overlaps its collective with the GEMM through userbuffers:

* ag-gemm: column-parallel, ``ub_overlap_ag=True``, ``ub_name='qkv'`` (ring-exchange AG).
  Weight (N/W x K) = B_r^T; input A_r (M/W x K); output C_r = A_full @ B_r (M x N/W).
  Userbuffer shape [M, K] (the gathered input).
* gemm-rs: row-parallel, ``ub_overlap_rs=True``, ``ub_name='proj'`` (pipelined RS).
  Weight (N x K/W) = B_r^T; input A_r (M x K/W); output band r (M/W x N).
  Userbuffer shape [M, N] (the partial output).

``initialize_ub`` is global in TE (one set of communicators per process), so each prepare()
creates it for its point and close() destroys it. TE's userbuffers want
``CUDA_DEVICE_MAX_CONNECTIONS=1`` set before the CUDA context exists (the launcher's job) and
multicast off (``UB_SKIPMC=1``, set here when unset). Forward only, under ``torch.no_grad()``;
the module returns a new tensor, copied into the output buffer (timed, stated in the row).

Written against TE's documented API and its examples/pytorch/comm_gemm_overlap; it has not
run on our machines (no TE there), so the first multi-GPU run is its test.
"""
from __future__ import annotations

import inspect
import os

import torch

from ..ops import get_op
from ..ops.base import torch_dtype
from ..point import Point
from .base import FnRunner, RankCtx
from .optional import (
    MULTI_GPU_FABRICS,
    dist_version,
    half_precision_unsupported,
    optional_available,
    probe_import,
    resolve_group,
    start_prepare,
)

_MODULE = "transformer_engine"
_TORCH_API = "transformer_engine.pytorch"


class TeUbImpl:
    name = "te-ub"
    ops = ("ag-gemm", "gemm-rs")
    fabrics = MULTI_GPU_FABRICS
    module = _MODULE

    def available(self, backend: str) -> tuple[bool, str]:
        def api(_mod):
            base, why = probe_import(_TORCH_API + ".module.base")
            if base is None or not hasattr(base, "initialize_ub"):
                return f"this TransformerEngine has no module.base.initialize_ub {why}".rstrip()
            return None

        return optional_available(self.name, backend, _MODULE,
                                  "TransformerEngine is not installed (no module 'transformer_engine'; install "
                                  "TransformerEngine with its PyTorch extension)", api=_TORCH_API, check=api)

    def version(self) -> str | None:
        return dist_version("transformer_engine", "transformer-engine", "transformer_engine_torch", module=_MODULE)

    def unsupported(self, point: Point) -> str | None:
        return half_precision_unsupported(self, point, "te-ub userbuffers overlap runs bf16/fp16 GEMMs")

    def prepare(self, point: Point, ctx: RankCtx, inputs) -> FnRunner:
        """Build the TE layer with userbuffers and return a runner of one forward.

        inputs.A[r], inputs.B[r]: rank r's shards (layouts in ``Point``), point's dtype.
        runner.outputs[r]: (M x N/W) for ag-gemm, (M/W x N) for gemm-rs.
        Collective: every rank must call prepare (userbuffers bootstrap).
        """
        os.environ.setdefault("UB_SKIPMC", "1")  # userbuffers without multicast
        start_prepare(self, point, ctx)
        te_mod, why = probe_import(_TORCH_API)
        base, why_base = probe_import(_TORCH_API + ".module.base")
        if te_mod is None or base is None:
            raise RuntimeError(f"te-ub: {why or why_base}")
        group = resolve_group(ctx, self.name)
        W, r = ctx.world, ctx.rank
        dt = torch_dtype(point.dtype)
        A, B = inputs.A[r], inputs.B[r]

        if point.op == "ag-gemm":
            ub_shape, mode, ub_name = [point.M, point.K], "column", "qkv"
            overlap = {"ub_overlap_ag": True}
        else:
            ub_shape, mode, ub_name = [point.M, point.N], "row", "proj"
            overlap = {"ub_overlap_rs": True}

        _initialize_ub(base, ub_shape, W, dt, group)
        try:
            layer = te_mod.Linear(
                point.K, point.N, bias=False, params_dtype=dt, device="cuda",
                tp_group=group, tp_size=W, sequence_parallel=True, parallel_mode=mode,
                ub_name=ub_name, **overlap,
            )
            with torch.no_grad():
                layer.weight.copy_(B.t())  # (out_local x in_local) = B_r^T in both modes
        except Exception:
            _destroy_ub(base)
            raise

        out = torch.empty(get_op(point.op).out_shape(point), dtype=dt, device=ctx.device)
        x = A.contiguous()

        def fn() -> None:
            with torch.no_grad():
                y = layer(x)
            out.copy_(y.view(out.shape))

        info = {
            "extra_copy_bytes": out.numel() * out.element_size(),
            "impl_note": f"te.pytorch.Linear({mode}, ub_name={ub_name}) forward; copy into the output buffer is timed",
            "multicast": "off",
        }
        return FnRunner(fn=fn, outputs={r: out}, on_close=lambda: _destroy_ub(base), info=info)


def _initialize_ub(base, shape: list[int], tp_size: int, dtype: torch.dtype, group) -> None:
    """Call TE's initialize_ub with the arguments this TE version takes (they changed over time)."""
    init = base.initialize_ub
    params = inspect.signature(init).parameters
    kwargs = {}
    if "use_fp8" in params:
        kwargs["use_fp8"] = False
    if "dtype" in params:
        kwargs["dtype"] = dtype
    if "bootstrap_backend" in params:
        kwargs["bootstrap_backend"] = "nccl"
    second = group if "tp_group" in params else tp_size  # an old release took the group
    _destroy_ub(base)  # a previous point's communicators (close() not reached) would assert
    init(shape, second, **kwargs)


def _destroy_ub(base) -> None:
    destroy = getattr(base, "destroy_ub", None)
    if destroy is not None:
        destroy()


TE_UB = TeUbImpl()
IMPLS = [TE_UB]
