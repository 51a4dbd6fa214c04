"""GEMM alone (world 1): C = A @ B with A (M x K) and B (K x N).

The builder micro-sweep (sweeps/builder.yaml) measures the KOSMOS kernel's builder role
with no communication against cuBLAS on the TP+SP layer GEMMs.
"""
from __future__ import annotations

from ..point import Point
from .base import Op


class Gemm(Op):
    name = "gemm"
    base = "gemm"
    collective = ""

    def validate(self, p: Point) -> str | None:
        return None if p.world == 1 else f"op gemm has no communication: world must be 1, got {p.world}"

    def comm_bytes(self, p: Point) -> float:
        return 0.0

    def shard(self, A, B, rank, world):
        return A, B

    def reference(self, A, B, rank, world):
        return A.float() @ B.float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M, p.N


OP = Gemm()
