"""`deepep`: DeepEP expert-parallel dispatch/combine — detected, and skipped with the reason.

DeepEP is a baseline of op `moe` (dispatch all-to-all -> expert GEMMs -> combine):
``kosmos-bench list`` / ``doctor`` show whether ``deep_ep`` is installed and imports. Its
runner is not written: DeepEP's intranode kernels need NVLink peers (>= 2 GPUs, nvlink fabric)
and no such machine has run this suite yet, so every moe point is skipped with that reason.
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
    ops: tuple[str, ...] = ("moe", "moe-bwd", "moe-step")
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
        why = multi_gpu_unsupported(self, point)
        return why or (f"deepep is detected only: its {point.op} runner (dispatch -> torch grouped GEMMs -> "
                       "combine over deep_ep.Buffer) is not written yet")

    def prepare(self, point: Point, ctx: RankCtx, inputs):
        raise NotImplementedError("deepep: detection only; its moe runner is not written yet")


DEEPEP = DeepEpImpl()
IMPLS = [DEEPEP]
