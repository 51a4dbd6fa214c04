"""`deepep`: DeepEP expert-parallel dispatch/combine — detection only, for now.

DeepEP is the baseline of the MoE op (dispatch all-to-all -> expert GEMMs -> combine); that
op is not in the suite yet, so this family implements no op: ``kosmos-bench list`` /
``doctor`` show whether ``deep_ep`` is installed and imports, and every point is skipped with
that reason. The MoE issue fills in ``ops`` and ``prepare``.
"""
from __future__ import annotations

from ..point import Point
from .base import RankCtx
from .optional import (
    MULTI_GPU_FABRICS,
    dist_version,
    multi_gpu_unsupported,
    optional_available,
)

_MODULE = "deep_ep"


class DeepEpImpl:
    name = "deepep"
    ops: tuple[str, ...] = ()  # the MoE op comes later
    fabrics = MULTI_GPU_FABRICS
    module = _MODULE

    def available(self, backend: str) -> tuple[bool, str]:
        return optional_available(
            self.name, backend, _MODULE,
            "DeepEP is not installed (no module 'deep_ep'; build it from github.com/deepseek-ai/DeepEP)",
            check=lambda mod: None if hasattr(mod, "Buffer") else
            f"module 'deep_ep' ({getattr(mod, '__file__', '?')}) has no deep_ep.Buffer")

    def version(self) -> str | None:
        return dist_version("deep_ep", "deep-ep", module=_MODULE)

    def unsupported(self, point: Point) -> str | None:
        if not self.ops:
            return f"deepep is detected only; it implements no op yet (asked for {point.op}; the MoE op comes later)"
        return multi_gpu_unsupported(self, point)

    def prepare(self, point: Point, ctx: RankCtx, inputs):
        raise NotImplementedError("deepep: detection only; the MoE op and its DeepEP runner come later")


DEEPEP = DeepEpImpl()
IMPLS = [DEEPEP]
