"""AG+GEMM: all-gather A along M, then multiply by the local column block of B.

Rank r holds A_r (M/W x K) and B_r (K x N/W) and outputs C_r = [A_0; ...; A_{W-1}] @ B_r,
(M x N/W). This is the column-parallel linear (QKV, FC1) of a TP+SP layer.
"""
from __future__ import annotations

import torch

from ..point import Point
from .base import Op, divides


class AgGemm(Op):
    name = "ag-gemm"
    base = "ag-gemm"
    collective = "all_gather"

    def validate(self, p: Point) -> str | None:
        return divides("M", p.M, p.world) or divides("N", p.N, p.world)

    def comm_bytes(self, p: Point) -> float:
        from .base import ELEM_BYTES
        return float(p.M * p.K * ELEM_BYTES[p.dtype])  # gathered A, as nccl-tests counts it

    def shard(self, A, B, rank, world):
        m, n = A.shape[0] // world, B.shape[1] // world
        return A[rank * m:(rank + 1) * m], B[:, rank * n:(rank + 1) * n]

    def reference(self, A, B, rank, world):
        n = B.shape[1] // world
        return A.float() @ B[:, rank * n:(rank + 1) * n].float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M, p.N // p.world


OP = AgGemm()
