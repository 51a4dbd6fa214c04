"""The backward collectives of a Megatron TP+SP layer: the forward kernels with other operand layouts.

Shapes are the GEMM's own (M x K) @ (K x N), global, like the forward ops (see `Point`):

* ``ag-gemm-dgrad`` (row-parallel out-proj / FC2 dgrad, dX_r = AG(dY) @ W_r^T): ag-gemm whose
  B_r (K x N/W) is the row-parallel weight W_r (N/W x K, row-major, as the forward stores it)
  read transposed. A (M x K) = dY gathered along M; C_r (M x N/W) = dX_r.
* ``gemm-rs-dgrad`` (column-parallel QKV / FC1 dgrad, dX = RS(dY_r @ W_r^T)): gemm-rs whose
  B_r (K/W x N) is the column-parallel weight W_r (N x K/W, row-major) read transposed.
  A_r (M x K/W) = dY_r; C_r = band r (M/W x N) of sum_p A_p @ B_p.
* ``ag-wgrad`` (column-parallel wgrad, dW_r = AG(X)^T @ dY_r; the row-parallel wgrad is the
  same op transposed, dW_r^T = AG(dY)^T @ X_r): all-gather along the GEMM's K (tokens). The
  gathered operand is A^T: rank r holds A_r = rows r*K/W.. of At (K x M, row-major: tokens x
  features) and B_r (K x N/W); C_r = At^T @ B_r (M x N/W). Every rank sums K in a fixed order.
"""
from __future__ import annotations

import torch

from ..point import Point
from .base import ELEM_BYTES, Op, divides, generator, randn, torch_dtype


def transposed_storage(b: torch.Tensor) -> torch.Tensor:
    """b (K x N) as a view of a contiguous N x K tensor (b.t() contiguous): W_r as stored."""
    return b.t().contiguous().t()


class AgGemmDgrad(Op):
    name = "ag-gemm-dgrad"
    base = "ag-gemm"
    collective = "all_gather"

    def validate(self, p: Point) -> str | None:
        return divides("M", p.M, p.world) or divides("N", p.N, p.world)

    def comm_bytes(self, p: Point) -> float:
        return float(p.M * p.K * ELEM_BYTES[p.dtype])

    def shard(self, A, B, rank, world):
        m, n = A.shape[0] // world, B.shape[1] // world
        return A[rank * m:(rank + 1) * m], B[:, rank * n:(rank + 1) * n]

    def own(self, t, which):
        return transposed_storage(t) if which == "B" else t.contiguous()

    def reference(self, A, B, rank, world):
        n = B.shape[1] // world
        return A.float() @ B[:, rank * n:(rank + 1) * n].float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M, p.N // p.world


class GemmRsDgrad(Op):
    name = "gemm-rs-dgrad"
    base = "gemm-rs"
    collective = "reduce_scatter"

    def validate(self, p: Point) -> str | None:
        return divides("M", p.M, p.world) or divides("K", p.K, p.world)

    def comm_bytes(self, p: Point) -> float:
        return float(p.M * p.N * ELEM_BYTES[p.dtype])

    def shard(self, A, B, rank, world):
        k = A.shape[1] // world
        return A[:, rank * k:(rank + 1) * k], B[rank * k:(rank + 1) * k]

    def own(self, t, which):
        return transposed_storage(t) if which == "B" else t.contiguous()

    def reference(self, A, B, rank, world):
        m = A.shape[0] // world
        return A[rank * m:(rank + 1) * m].float() @ B.float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M // p.world, p.N


class AgWgrad(Op):
    name = "ag-wgrad"
    base = "ag-wgrad"
    collective = "all_gather"

    def validate(self, p: Point) -> str | None:
        return divides("K", p.K, p.world) or divides("N", p.N, p.world)

    def comm_bytes(self, p: Point) -> float:
        return float(p.K * p.M * ELEM_BYTES[p.dtype])  # the gathered At (tokens x features)

    def make_global(self, p: Point, device, seed: int):
        """At (K x M: tokens x features) and B (K x N), B scaled so C is O(1)."""
        g = generator(torch.device(device), seed)
        dt = torch_dtype(p.dtype)
        At = randn((p.K, p.M), dt, device, g)
        B = randn((p.K, p.N), dt, device, g, scale=p.K ** -0.5)
        return At, B

    def shard(self, At, B, rank, world):
        k, n = At.shape[0] // world, B.shape[1] // world
        return At[rank * k:(rank + 1) * k], B[:, rank * n:(rank + 1) * n]

    def reference(self, At, B, rank, world):
        n = B.shape[1] // world
        return At.float().t() @ B[:, rank * n:(rank + 1) * n].float()

    def out_shape(self, p: Point) -> tuple[int, int]:
        return p.M, p.N // p.world


AG_GEMM_DGRAD, GEMM_RS_DGRAD, AG_WGRAD = AgGemmDgrad(), GemmRsDgrad(), AgWgrad()
