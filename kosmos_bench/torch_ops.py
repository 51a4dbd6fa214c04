"""torch custom ops over the kosmos kernels, for use inside models (nvlink fabric).

    import kosmos_bench.torch_ops  # registers the ops
    c = torch.ops.kosmos.ag_gemm(a_shard, b_shard, group_name, "self")   # C_r = [A_0..A_{W-1}] @ B_r
    c = torch.ops.kosmos.gemm_rs(a_shard, b_shard, group_name, "self")   # band r of sum_p A_p @ B_p

a_shard / b_shard are this rank's bf16 shards (layouts of kosmos_bench.point.Point); every
rank of the process group calls the op together. One runner (symmetric buffers, schedule)
is cached per (op, shapes, group, policy); each call copies A into the symmetric buffer
(ag-gemm) and writes a fresh output. Importing this module registers the ops; it builds
nothing (the kernels build on the first call).
"""
from __future__ import annotations

import torch

_RUNNERS: dict = {}


def _runner(op: str, a: torch.Tensor, b: torch.Tensor, group_name: str, policy: str):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    from .impls.base import RankCtx
    from .impls.kosmos import KosmosRunner
    from .ops.base import RankInputs
    from .point import Point

    key = (op, tuple(a.shape), tuple(b.shape), a.device, group_name, policy)
    if key in _RUNNERS:
        return _RUNNERS[key]
    group = _resolve_process_group(group_name)
    W, rank = dist.get_world_size(group), dist.get_rank(group)
    if op == "ag-gemm":
        M, K, N = a.shape[0] * W, a.shape[1], b.shape[1] * W
    else:
        M, K, N = a.shape[0], a.shape[1] * W, b.shape[1]
    p = Point(op=op, impl="kosmos", M=M, N=N, K=K, world=W, fabric="nvlink", policy=policy)
    ctx = RankCtx(rank=rank, world=W, procs=W, device=a.device, fabric="nvlink", backend="gpu", group=group)
    r = KosmosRunner(p, ctx, RankInputs({rank: a.contiguous()}, {rank: b.contiguous()}))
    _RUNNERS[key] = r
    return r


def _call(op: str, a, b, group_name, policy, out_shape):
    r = _runner(op, a, b, group_name, policy)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=a.device)
    r.rebind(a.contiguous(), b.contiguous(), out)
    r.run()
    return out


@torch.library.custom_op("kosmos::ag_gemm", mutates_args=())
def ag_gemm(a: torch.Tensor, b: torch.Tensor, group_name: str, policy: str = "self") -> torch.Tensor:
    """a: (M/W, K) bf16, b: (K, N/W) bf16 -> (M, N/W) bf16."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    W = dist.get_world_size(_resolve_process_group(group_name))
    return _call("ag-gemm", a, b, group_name, policy, (a.shape[0] * W, b.shape[1]))


@ag_gemm.register_fake
def _(a, b, group_name, policy="self"):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    W = dist.get_world_size(_resolve_process_group(group_name))
    return a.new_empty((a.shape[0] * W, b.shape[1]))


@torch.library.custom_op("kosmos::gemm_rs", mutates_args=())
def gemm_rs(a: torch.Tensor, b: torch.Tensor, group_name: str, policy: str = "self") -> torch.Tensor:
    """a: (M, K/W) bf16, b: (K/W, N) bf16 -> (M/W, N) bf16."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    W = dist.get_world_size(_resolve_process_group(group_name))
    return _call("gemm-rs", a, b, group_name, policy, (a.shape[0] // W, b.shape[1]))


@gemm_rs.register_fake
def _(a, b, group_name, policy="self"):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    W = dist.get_world_size(_resolve_process_group(group_name))
    return a.new_empty((a.shape[0] // W, b.shape[1]))
