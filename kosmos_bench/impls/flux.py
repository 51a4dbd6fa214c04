"""`flux`: ByteDance Flux fused kernels (``flux.AGKernel``, ``flux.GemmRS``), when installed.

Flux fuses the collective into the GEMM's epilogue/prologue (CUTLASS kernels that wait on
per-tile flags or write partial tiles to peers); it is the strongest published fixed-role
baseline. Weights are passed in Flux's default (N x K) layout (``transpose_weight=False``):

* ag-gemm: ``AGKernel(group, nnodes=1, M, N/W, K, dtype, output_dtype=dtype)``;
  ``forward(A_r (M/W x K), B_r^T (N/W x K), output=C_r)`` writes C_r = A_full @ B_r
  (M x N/W) straight into the output buffer (no extra copy).
* gemm-rs: ``GemmRS(group, nnodes=1, max_m=M, N, dtype, dtype)``;
  ``forward(A_r (M x K/W), B_r^T (N x K/W))`` returns band r (M/W x N), copied into the
  output buffer (timed, stated in the row).

Single node only (nnodes=1). Written against Flux's own tests (test/python/ag_gemm,
test/python/gemm_rs); it has not run on our machines (no Flux there), so the first multi-GPU
run is its test.
"""
from __future__ import annotations

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

_MODULE = "flux"
_NEEDED = ("AGKernel", "GemmRS")
# Process groups whose Flux shared memory is initialized (init_flux_shm runs once per group).
_SHM_READY: set[str] = set()


class FluxImpl:
    name = "flux"
    ops = ("ag-gemm", "gemm-rs")
    fabrics = MULTI_GPU_FABRICS
    module = _MODULE

    def available(self, backend: str) -> tuple[bool, str]:
        def api(mod):
            missing = [n for n in _NEEDED if not hasattr(mod, n)]
            return (f"module 'flux' ({getattr(mod, '__file__', None) or '?'}) is not ByteDance Flux "
                    f"(no flux.{', flux.'.join(missing)})") if missing else None

        return optional_available(self.name, backend, _MODULE,
                                  "ByteDance Flux is not installed (no module 'flux'; pip install byte-flux)", check=api)

    def version(self) -> str | None:
        return dist_version("byte-flux", "byte_flux", module=_MODULE)

    def unsupported(self, point: Point) -> str | None:
        return half_precision_unsupported(self, point, "flux's fused kernels run bf16/fp16 (and fp8/int8) GEMMs")

    def prepare(self, point: Point, ctx: RankCtx, inputs) -> FnRunner:
        """Build the Flux op for this shape and return a runner of one fused call.

        inputs.A[r], inputs.B[r]: rank r's shards (layouts in ``Point``), point's dtype.
        runner.outputs[r]: (M x N/W) for ag-gemm, (M/W x N) for gemm-rs.
        Collective: every rank must call prepare (Flux allocates symmetric buffers).
        """
        start_prepare(self, point, ctx)
        flux, why = probe_import(_MODULE)
        if flux is None:
            raise RuntimeError(f"flux: {why}")
        group = resolve_group(ctx, self.name)
        if group.group_name not in _SHM_READY and hasattr(flux, "init_flux_shm"):
            flux.init_flux_shm(group)
            _SHM_READY.add(group.group_name)
        W, r = ctx.world, ctx.rank
        dt = torch_dtype(point.dtype)
        A = inputs.A[r].contiguous()
        w = inputs.B[r].t().contiguous()  # Flux's (N x K) weight layout
        out = torch.empty(get_op(point.op).out_shape(point), dtype=dt, device=ctx.device)

        if point.op == "ag-gemm":
            kernel = flux.AGKernel(group, 1, point.M, point.N // W, point.K, dt, output_dtype=dt)

            def fn() -> None:
                kernel.forward(A, w, output=out, transpose_weight=False)

            info = {"extra_copy_bytes": 0, "impl_note": "flux.AGKernel writes the output buffer directly"}
        else:
            kernel = flux.GemmRS(group, 1, point.M, point.N, dt, dt,
                                 transpose_weight=False, fuse_reduction=False, ring_reduction=False)

            def fn() -> None:
                out.copy_(kernel.forward(A, w).view(out.shape))

            info = {"extra_copy_bytes": out.numel() * out.element_size(),
                    "impl_note": "flux.GemmRS returns a new tensor; copy into the output buffer is timed"}
        info["multicast"] = "off"
        return FnRunner(fn=fn, outputs={r: out}, info=info)


FLUX = FluxImpl()
IMPLS = [FLUX]
