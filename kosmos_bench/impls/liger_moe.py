"""`liger-moe`: Liger-Kernel's fused MoE experts (Triton) as a fused-MoE library baseline of op moe.

liger_kernel.ops.fused_moe.LigerFusedMoEFunction takes the routing (top-k ids and weights) and
the stacked expert weights in moe_math's layout (gate_up_proj E x 2F x H, gate rows first;
down_proj E x H x F) and runs routing metadata -> gather + gate/up GEMM + SwiGLU (from fp32
accumulators) -> down GEMM -> weighted token aggregation. Around it: the same router as
torch-moe (fp32 logits, moe_math's selection) and the shared expert. It computes local experts
only (no dispatch), so it runs at world 1. Wheel: liger-kernel (pure Python + Triton, ~1 MB).
Ops moe-bwd / moe-step: the Function's own backward through autograd (impls/torch_moe_grad.py's
FnGradRunner), where the installed version has one; else skipped with the reason.
"""
from __future__ import annotations

import torch

from ..ops.moe import moe_shape
from ..point import Point
from .base import FnRunner, common_unsupported
from .optional import dist_version, module_present, probe_import

_MODULE = "liger_kernel.ops.fused_moe"


class LigerMoe:
    name = "liger-moe"
    ops = ("moe", "moe-bwd", "moe-step")
    fabrics = ("nvlink", "local", "host")
    module = _MODULE

    def available(self, backend: str) -> tuple[bool, str]:
        if not module_present("liger_kernel"):
            return False, "liger-moe: liger-kernel is not installed (pip install liger-kernel, or carry its wheel)"
        if backend != "gpu" or not torch.cuda.is_available():
            return False, f"liger-moe runs Triton kernels on a CUDA GPU (backend {backend})"
        mod, why = probe_import(_MODULE)
        if mod is None:
            return False, f"liger-moe: {why}"
        if not hasattr(mod, "LigerFusedMoEFunction"):
            return False, f"liger-moe: {_MODULE} has no LigerFusedMoEFunction (liger-kernel {self.version()})"
        return True, ""

    def version(self) -> str | None:
        return dist_version("liger-kernel", "liger_kernel", module="liger_kernel")

    def unsupported(self, p: Point) -> str | None:
        why = common_unsupported(self, p)
        if why:
            return why
        if p.world != 1:
            return f"liger-moe computes local experts only (no dispatch): world 1, not {p.world}"
        if p.op != "moe":
            mod, why = probe_import(_MODULE)
            fn = getattr(mod, "LigerFusedMoEFunction", None)
            if fn is None or "backward" not in vars(fn):
                return f"liger-moe {p.op}: LigerFusedMoEFunction has no backward (liger-kernel {self.version()})"
        return None

    def prepare(self, p: Point, ctx, inputs):
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

        from .torch_moe import route, shared_ffn

        s, r = moe_shape(p), ctx.rank
        x, W1, W2 = inputs.x[r], inputs.W1[r].contiguous(), inputs.W2[r].contiguous()
        out = torch.empty((s.T, s.H), dtype=torch.bfloat16, device=ctx.device)
        routes = torch.empty((s.T, s.topk), dtype=torch.int32, device=ctx.device)

        def run():
            with torch.no_grad():
                idx, w = route(s, x, inputs.Wr, inputs.bias)
                y = LigerFusedMoEFunction.apply(x, W1, W2, idx.to(torch.int32), w)
                if inputs.shared is not None:
                    y = (y.float() + shared_ffn(x, inputs.shared).float()).to(y.dtype)
                out.copy_(y)
                routes.copy_(idx)

        info = {"library": f"liger-kernel {self.version()}"}
        if p.op != "moe":
            from .torch_moe_grad import FnGradRunner

            def layer(x, Wr, W1, W2, *sh):  # the router's combine weights carry the gradient to Wr
                idx, w = route(s, x, Wr, inputs.bias)
                y = LigerFusedMoEFunction.apply(x, W1, W2, idx.to(torch.int32), w)
                if sh:
                    y = (y.float() + shared_ffn(x, sh).float()).to(y.dtype)
                return y, idx

            return FnGradRunner(p, ctx, inputs, layer, info)
        runner = FnRunner(run, {r: out}, info=info)
        runner.routes = {r: routes}
        run()  # Triton autotuning and compilation happen here, outside the timing
        return runner


IMPLS = [LigerMoe()]
