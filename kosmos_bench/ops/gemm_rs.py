"""GEMM+RS: multiply the local K-slices, then reduce-scatter the partial C along M.

Rank r holds A_r (M x K/W) and B_r (K/W x N); it outputs band r (M/W x N) of
sum_p A_p @ B_p. This is the row-parallel linear (attention out-proj, FC2) of a TP+SP layer.
"""
from __future__ import annotations

import torch

from ..point import Point
from .base import ELEM_BYTES, Op, divides


class GemmRs(Op):
    name = "gemm-rs"
    base = "gemm-rs"
    collective = "reduce_scatter"

    def validate(self, p: Point) -> str | None:
        return divides("M", p.M, p.world) or divides("K", p.K, p.world)

    def comm_bytes(self, p: Point) -> float:
        return float(p.M * p.N * ELEM_BYTES[p.dtype])  # the full partial C each rank reduces

    def shard(self, A, B, rank, world):
        k = A.shape[1] // world
        return A[:, rank * k:(rank + 1) * k], B[rank * k:(rank + 1) * k]

    def reference(self, A, B, rank, world):
        m = A.shape[0] // world
        return A[rank * m:(rank + 1) * m].float() @ B.float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M // p.world, p.N


OP = GemmRs()
