"""`torch`: plain torch.matmul (cuBLAS / hipBLASLt) for the world-1 `gemm` op: the GEMM rate
every fused kernel's builder role is measured against."""
from __future__ import annotations

import torch

from ..point import Point
from .base import FnRunner, common_unsupported


class TorchGemm:
    name = "torch"
    ops = ("gemm",)
    fabrics = ("nvlink", "gloo", "host", "local")

    def available(self, backend: str) -> tuple[bool, str]:
        if backend == "gpu" and not torch.cuda.is_available():
            return False, "no CUDA device"
        return True, ""

    def unsupported(self, p: Point) -> str | None:
        return common_unsupported(self, p)

    def prepare(self, p: Point, ctx, inputs):
        A, B = inputs.A[ctx.rank], inputs.B[ctx.rank]
        out = torch.empty((p.M, p.N), dtype=A.dtype, device=ctx.device)
        return FnRunner(lambda: torch.matmul(A, B, out=out), {ctx.rank: out})


IMPLS = [TorchGemm()]
