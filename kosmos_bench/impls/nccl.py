"""Baselines users would write themselves: `nccl-seq` (collective, then GEMM) and
`nccl-overlap` (the decomposition into W chunks on two streams, the way torch's
micro-pipeline TP and TE's split pipeline overlap a ring of transfers with per-chunk GEMMs).

Fabrics:
* nvlink / gloo — real ranks through torch.distributed (NCCL on GPU, gloo on CPU).
* host — rank-0 view on one GPU: peers' shards (ag-gemm) and peers' partial contributions to
  band 0 (gemm-rs) sit in pinned host memory; the "collective" is the copy engine moving
  them over PCIe (H2D, and D2H for rank 0's partials bound for peers). This is the fair
  single-GPU counterpart of what the KOSMOS movers do on that fabric.

The same module provides the GEMM-alone and collective-alone measurements stored with every
point (`gemm_alone`, `comm_alone`), so overlap efficiency has one definition everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import sharing
from ..ops import get_op
from ..point import Point
from .base import FnRunner, RankCtx, common_unsupported

FABRICS = ("nvlink", "gloo", "host")


def _streams(ctx: RankCtx):
    if ctx.device.type == "cuda":
        return torch.cuda.current_stream(ctx.device), torch.cuda.Stream(ctx.device)
    return None, None


class _Sync:
    """Stream handoff that degrades to no-ops on CPU (gloo), where ops are synchronous."""

    def __init__(self, ctx: RankCtx):
        self.main, self.side = _streams(ctx)

    def side_ctx(self):
        return torch.cuda.stream(self.side) if self.side is not None else _Null()

    def side_waits_main(self):
        if self.side is not None:
            self.side.wait_stream(self.main)

    def main_waits_side(self):
        if self.side is not None:
            self.main.wait_stream(self.side)

    def event(self):
        if self.side is None:
            return None
        e = torch.cuda.Event()
        e.record(torch.cuda.current_stream())
        return e

    def wait(self, e):
        if e is not None:
            torch.cuda.current_stream().wait_event(e)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---------------------------------------------------------------------------------------
# Collective primitives per fabric
# ---------------------------------------------------------------------------------------
def _all_gather(out: torch.Tensor, shard: torch.Tensor, group) -> None:
    dist.all_gather_into_tensor(out, shard, group=group)


def _reduce_scatter(out: torch.Tensor, full: torch.Tensor, group) -> None:
    if dist.get_backend(group) == "gloo":  # gloo has no reduce-scatter: all-reduce, keep own band
        tmp = full.clone()
        dist.all_reduce(tmp, group=group)
        r, m = dist.get_rank(group), out.shape[0]
        out.copy_(tmp[r * m:(r + 1) * m])
    else:
        dist.reduce_scatter_tensor(out, full, group=group)


def _ring_exchange(send: torch.Tensor, recv: torch.Tensor, ctx: RankCtx) -> list:
    """Send to rank+1, receive from rank-1 (ring); returns the pending requests."""
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    ops = [dist.P2POp(dist.isend, send, nxt, group=ctx.group), dist.P2POp(dist.irecv, recv, prv, group=ctx.group)]
    return dist.batch_isend_irecv(ops)


def _ring_exchange_rev(send: torch.Tensor, recv: torch.Tensor, ctx: RankCtx) -> list:
    """Send to rank-1, receive from rank+1."""
    nxt, prv = (ctx.rank - 1) % ctx.world, (ctx.rank + 1) % ctx.world
    ops = [dist.P2POp(dist.isend, send, nxt, group=ctx.group), dist.P2POp(dist.irecv, recv, prv, group=ctx.group)]
    return dist.batch_isend_irecv(ops)


@dataclass
class _HostPeers:
    """Host fabric state: peers' data in pinned host memory, rank 0's receive buffers on GPU."""

    shards: list[torch.Tensor | None]  # ag-gemm: pinned A_p (m x K) for p != 0
    contrib: list[torch.Tensor | None]  # gemm-rs: pinned A_p[band 0] @ B_p (m x N) for p != 0
    outbox: list[torch.Tensor | None]  # gemm-rs: pinned slots for rank 0's partial of band p


def host_peers(p: Point, ctx: RankCtx, inputs) -> _HostPeers:
    """The point's pinned host state, made on first use and shared (``inputs.host``)."""
    cached = inputs.host.get("peers")
    if cached is None:
        cached = inputs.host["peers"] = _make_host_peers(p, inputs)
    return cached


def _base(p: Point) -> str:
    """The forward op a point runs as (ag-gemm, gemm-rs), or ag-wgrad (ops/backward.py)."""
    return get_op(p.op).base


def _gathered_shape(p: Point) -> tuple[int, int]:
    """The all-gathered tensor: A (M x K) for ag-gemm, At (K x M, tokens x features) for ag-wgrad."""
    return (p.K, p.M) if _base(p) == "ag-wgrad" else (p.M, p.K)


def _make_host_peers(p: Point, inputs) -> _HostPeers:
    W = p.world
    shards, contrib, outbox = [None] * W, [None] * W, [None] * W
    m = p.M // W
    for q in range(1, W):
        if _base(p) in ("ag-gemm", "ag-wgrad"):
            shards[q] = inputs.A[q].cpu().pin_memory()
        else:
            contrib[q] = (inputs.A[q][:m] @ inputs.B[q]).cpu().pin_memory()
            outbox[q] = torch.empty((m, p.N), dtype=inputs.A[0].dtype).pin_memory()
    return _HostPeers(shards, contrib, outbox)


def _gather(gathered: torch.Tensor, A_r: torch.Tensor, ctx: RankCtx, host) -> None:
    """All-gather the row shards A_r (rows = A_r's rows) into gathered: NCCL/gloo, or the host
    fabric's copies of the peers' pinned shards."""
    if host is None:
        _all_gather(gathered, A_r, ctx.group)
        return
    rows = A_r.shape[0]
    gathered[:rows].copy_(A_r)
    for q in range(1, ctx.world):
        gathered[q * rows:(q + 1) * rows].copy_(host.shards[q], non_blocking=True)


def _ring(gathered: torch.Tensor, A_r: torch.Tensor, ctx: RankCtx, sync: "_Sync", host, step) -> None:
    """The stream-overlapped all-gather: step(s, src, band) computes with rank src's row shard
    (src = r - s) on the main stream while shard r - s - 1 is in flight on the side stream."""
    r, W, rows = ctx.rank, ctx.world, A_r.shape[0]
    bufs = [gathered[q * rows:(q + 1) * rows] for q in range(W)]
    bufs[r].copy_(A_r)
    pending, ev = [], None
    for s in range(W):
        src = (r - s) % W
        if s + 1 < W:
            nxt = (r - s - 1) % W
            if s == 0:  # later sends forward what the side stream itself received
                sync.side_waits_main()
            with sync.side_ctx():
                if host is None:
                    pending = _ring_exchange(bufs[src], bufs[nxt], ctx)
                else:
                    bufs[nxt].copy_(host.shards[nxt], non_blocking=True)
                for req in pending:
                    req.wait()
                ev = sync.event()
        step(s, src, bufs[src])
        if s + 1 < W:
            sync.wait(ev)
    sync.main_waits_side()


# ---------------------------------------------------------------------------------------
# ag-gemm
# ---------------------------------------------------------------------------------------
def _ag_gemm(p: Point, ctx: RankCtx, inputs, overlap: bool):
    r, W = ctx.rank, ctx.world
    A_r, B_r = inputs.A[r], inputs.B[r]
    m = A_r.shape[0]
    gathered = torch.empty((p.M, p.K), dtype=A_r.dtype, device=ctx.device)
    out = torch.empty((p.M, B_r.shape[1]), dtype=A_r.dtype, device=ctx.device)
    sync = _Sync(ctx)
    host = host_peers(p, ctx, inputs) if p.fabric == "host" else None

    def seq():
        _gather(gathered, A_r, ctx, host)
        torch.matmul(gathered, B_r, out=out)

    def ring():
        _ring(gathered, A_r, ctx, sync, host,
              lambda s, src, band: torch.matmul(band, B_r, out=out[src * m:(src + 1) * m]))

    if W == 1:
        return FnRunner(lambda: torch.matmul(A_r, B_r, out=out), {r: out})
    runner = FnRunner(ring if overlap else seq, {r: out}, info={"collective": _collective_name(p)})
    runner.gathered = {r: gathered}  # the layer step's wgrad reuses the gathered A
    return runner


# ---------------------------------------------------------------------------------------
# ag-wgrad: all-gather along the GEMM's K (tokens); C_r = At^T @ B_r
# ---------------------------------------------------------------------------------------
def _ag_wgrad(p: Point, ctx: RankCtx, inputs, overlap: bool, out: torch.Tensor | None = None):
    """out: where C_r goes (the layer step's packed weight gradient), else a new tensor."""
    r, W = ctx.rank, ctx.world
    A_r, B_r = inputs.A[r], inputs.B[r]  # At_r (K/W x M), B_r (K x N/W)
    k = A_r.shape[0]
    gathered = torch.empty((p.K, p.M), dtype=A_r.dtype, device=ctx.device)
    if out is None:
        out = torch.empty((p.M, B_r.shape[1]), dtype=A_r.dtype, device=ctx.device)
    sync = _Sync(ctx)
    host = host_peers(p, ctx, inputs) if p.fabric == "host" else None

    def seq():
        _gather(gathered, A_r, ctx, host)
        torch.matmul(gathered.t(), B_r, out=out)

    def add_band(s, src, band):
        # Every rank sums its bands in one fixed order (own first): bitwise the same each call.
        # Each band's partial rounded once to bf16, summed in fp32 (bf16 addmm_ chains W
        # roundings of the running sum: measured outside the bf16 tolerance at W=8).
        torch.matmul(band.t(), B_r[src * k:(src + 1) * k], out=part)
        if s == 0:
            acc.copy_(part)
        else:
            acc.add_(part)

    def ring():
        _ring(gathered, A_r, ctx, sync, host, add_band)
        out.copy_(acc)

    if overlap and W > 1:
        part = torch.empty_like(out)
        acc = torch.empty(out.shape, dtype=torch.float32, device=ctx.device)
    if W == 1:
        return FnRunner(lambda: torch.matmul(A_r.t(), B_r, out=out), {r: out})
    return FnRunner(ring if overlap else seq, {r: out}, info={"collective": _collective_name(p)})


# ---------------------------------------------------------------------------------------
# gemm-rs
# ---------------------------------------------------------------------------------------
def _gemm_rs(p: Point, ctx: RankCtx, inputs, overlap: bool):
    r, W = ctx.rank, ctx.world
    A_r, B_r = inputs.A[r], inputs.B[r]
    m = p.M // W
    out = torch.empty((m, p.N), dtype=A_r.dtype, device=ctx.device)
    partial = torch.empty((p.M, p.N), dtype=A_r.dtype, device=ctx.device)
    sync = _Sync(ctx)
    host = host_peers(p, ctx, inputs) if p.fabric == "host" else None
    recv = [torch.empty((m, p.N), dtype=A_r.dtype, device=ctx.device) for _ in range(2 if host is None else W)]
    pull = torch.cuda.Stream(ctx.device) if host is not None else None

    def host_reduce():
        # Contributions summed in rank order 0..W-1 (fp32 accumulate), like the KOSMOS owner.
        acc = partial[:m].float()
        for q in range(1, W):
            acc += recv[q].float()
        out.copy_(acc)

    def seq():
        torch.matmul(A_r, B_r, out=partial)
        if host is None:
            _reduce_scatter(out, partial, ctx.group)
            return
        for q in range(1, W):
            host.outbox[q].copy_(partial[q * m:(q + 1) * m], non_blocking=True)
            recv[q].copy_(host.contrib[q], non_blocking=True)
        host_reduce()

    def ring():
        if host is not None:
            # Peers' contributions are pulled (H2D) on one stream while rank 0's partials for
            # peers are computed first and pushed (D2H) on another; own band last.
            pull.wait_stream(sync.main)
            with torch.cuda.stream(pull):
                for q in range(1, W):
                    recv[q].copy_(host.contrib[q], non_blocking=True)
            for q in list(range(1, W)) + [0]:
                torch.matmul(A_r[q * m:(q + 1) * m], B_r, out=partial[q * m:(q + 1) * m])
                if q:
                    sync.side_waits_main()
                    with sync.side_ctx():
                        host.outbox[q].copy_(partial[q * m:(q + 1) * m], non_blocking=True)
            sync.main_waits_side()
            sync.main.wait_stream(pull)
            host_reduce()
            return
        # Ring reduce-scatter: at step s rank r owns band b = (r + s + 1) % W, adds its partial
        # to the accumulator received from rank r+1 and passes it to rank r-1; the last step's
        # band is r's own. The next band's GEMM overlaps the transfer.
        acc = None
        for s in range(W):
            b = (r + s + 1) % W
            part = partial[b * m:(b + 1) * m]
            torch.matmul(A_r[b * m:(b + 1) * m], B_r, out=part)
            if s > 0:
                sync.wait(ev)
                part.add_(recv[s % 2])
            if s + 1 < W:
                sync.side_waits_main()
                with sync.side_ctx():
                    reqs = _ring_exchange_rev(part, recv[(s + 1) % 2], ctx)
                    for req in reqs:
                        req.wait()
                    ev = sync.event()
            acc = part
        out.copy_(acc)
        sync.main_waits_side()

    if W == 1:
        return FnRunner(lambda: torch.matmul(A_r, B_r, out=out), {r: out})
    return FnRunner(ring if overlap else seq, {r: out}, info={"collective": _collective_name(p)})


def _collective_name(p: Point) -> str:
    return {"nvlink": "nccl", "gloo": "gloo", "host": "copy-engine (PCIe, pinned host)"}[p.fabric]


# ---------------------------------------------------------------------------------------
# GEMM-alone and collective-alone, stored with every point
# ---------------------------------------------------------------------------------------
def gemm_alone(p: Point, ctx: RankCtx, inputs):
    """The rank's whole GEMM with no communication: the compute floor of the fused op."""
    r = ctx.rank
    A_r, B_r = inputs.A[r], inputs.B[r]
    if _base(p) == "ag-wgrad":
        At = A_r.repeat(p.world, 1)[: p.K].contiguous()
        out = torch.empty((p.M, B_r.shape[1]), dtype=A_r.dtype, device=ctx.device)
        return lambda: torch.matmul(At.t(), B_r, out=out)
    if _base(p) == "ag-gemm":
        A = torch.empty((p.M, p.K), dtype=A_r.dtype, device=ctx.device)
        A.copy_(A_r.repeat(p.world, 1)[: p.M])
        out = torch.empty((p.M, B_r.shape[1]), dtype=A_r.dtype, device=ctx.device)
        return lambda: torch.matmul(A, B_r, out=out)
    out = torch.empty((p.M, p.N), dtype=A_r.dtype, device=ctx.device)
    return lambda: torch.matmul(A_r, B_r, out=out)


def concurrent_alone(gemm, comm, device):
    """The GEMM alone and the collective alone issued together on two streams, with no data
    dependency between them: the overlap the chip itself allows (the two share SMs, HBM and,
    at a power limit, the energy budget). A fused op also has the dependency, so this is the
    reference its overlap is judged against when max(GEMM alone, collective alone) is out of
    reach for any schedule (e.g. a GEMM that runs at the power limit)."""
    side = torch.cuda.Stream(device)

    def both():
        main = torch.cuda.current_stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            comm()
        gemm()
        main.wait_stream(side)
    return both


def comm_alone(p: Point, ctx: RankCtx, inputs):
    """The collective alone, on the same fabric the baselines use (None when world == 1)."""
    if p.world == 1 or ctx.shared_gpu:  # shared-GPU mode: a gloo group, no NCCL collective to time
        return None
    r, W, m = ctx.rank, p.world, p.M // p.world
    dt = inputs.A[r].dtype
    gathered = _base(p) in ("ag-gemm", "ag-wgrad")
    if gathered:
        m = _gathered_shape(p)[0] // W
    if p.fabric == "host":
        host = host_peers(p, ctx, inputs)
        if gathered:
            dst = torch.empty(_gathered_shape(p), dtype=dt, device=ctx.device)
            return lambda: [dst[q * m:(q + 1) * m].copy_(host.shards[q], non_blocking=True) for q in range(1, W)]
        src = torch.randn((p.M, p.N), device=ctx.device).to(dt)
        dst = torch.empty((p.M, p.N), dtype=dt, device=ctx.device)
        side = torch.cuda.Stream(ctx.device)

        def rs_copies():  # D2H pushes and H2D pulls run on separate copy engines
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for q in range(1, W):
                    host.outbox[q].copy_(src[q * m:(q + 1) * m], non_blocking=True)
            for q in range(1, W):
                dst[q * m:(q + 1) * m].copy_(host.contrib[q], non_blocking=True)
            torch.cuda.current_stream().wait_stream(side)
        return rs_copies
    if gathered:
        dst = torch.empty(_gathered_shape(p), dtype=dt, device=ctx.device)
        return lambda: _all_gather(dst, inputs.A[r], ctx.group)
    full = torch.randn((p.M, p.N), device=ctx.device).to(dt)
    dst = torch.empty((m, p.N), dtype=dt, device=ctx.device)
    return lambda: _reduce_scatter(dst, full, ctx.group)


class NcclBaseline:
    ops = ("ag-gemm", "gemm-rs", "ag-gemm-dgrad", "gemm-rs-dgrad", "ag-wgrad", "layer")
    fabrics = FABRICS

    def __init__(self, name: str, overlap: bool):
        self.name, self.overlap = name, overlap

    def available(self, backend: str) -> tuple[bool, str]:
        if not dist.is_available():
            return False, "torch.distributed is not available in this torch build"
        if backend == "gpu" and not torch.cuda.is_available():
            return False, "no CUDA device"
        return True, ""

    def unsupported(self, p: Point) -> str | None:
        why = common_unsupported(self, p)
        if why:
            return why
        if p.fabric == "host" and p.backend != "gpu":
            return "the host fabric needs a GPU (peers' data crosses PCIe)"
        if p.backend == "gpu" and sharing.is_shared(p):
            return sharing.needs_nccl_reason(self.name)
        return get_op(p.op).validate(p)

    def prepare(self, p: Point, ctx: RankCtx, inputs):
        fn = {"ag-gemm": _ag_gemm, "gemm-rs": _gemm_rs, "ag-wgrad": _ag_wgrad}[_base(p)]
        return fn(p, ctx, inputs, self.overlap)


IMPLS = [NcclBaseline("nccl-seq", overlap=False), NcclBaseline("nccl-overlap", overlap=True)]
