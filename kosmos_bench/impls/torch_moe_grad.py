"""The torch MoE pipelines' backward (ops moe-bwd, moe-step): autograd through the forward of
impls/torch_moe.py, the same code, eager / compiled / overlapped.

Leaves per rank: x_r, its own Wr and shared-expert leaves (the replicated weights' gradients are
per rank, ops/moe_bwd.py), W1_r, W2_r. Every step's backward is deterministic (no atomics):
the router GEMM and the fp32 softmax/sigmoid (the chosen scores picked by a one-hot product,
torch_moe.combine_weights, not a gather whose backward scatter-adds); the permute and the
regroup are torch_moe.GatherRows (a gather backward: the inverse permutation, then each token's
k rows summed in fixed order); the unpermute and the stores into slices (index_put / copy_
without accumulation: their backward gathers); torch._grouped_mm (its dgrad a grouped GEMM, its
wgrad a grouped GEMM over the rows, every rank's rows of an expert in rank order); the fold's
batched GEMM; all_to_all_single (torch.distributed.nn: the reverse exchange). A leaf used twice
(x: router, rows, shared expert) gets its gradients summed by autograd in graph order.

* moe-bwd: the forward runs once in prepare (routes written then); each call is
  autograd.grad(y, leaves, dy, retain_graph=True) into the gradient buffers.
* moe-step: each call runs the forward, writes y and routes, then the backward.

Host fabric (rank-0 view, ops/moe_host_bwd.py): rank 0's rows on the peers' experts go through
RemoteRows (forward: rows out, the peers' outputs in; backward: the upstream gradients out, the
peers' input gradients in); the peers' rows on rank 0's experts are leaves whose gradients go
back to the peers, and their outputs are extra roots whose gradients arrive from the peers.
"""
from __future__ import annotations

import dataclasses

import torch

from ..ops.moe import moe_shape
from ..ops.moe_bwd import grad_buffers
from ..point import Point
from .base import RankCtx
from . import torch_moe
from .torch_moe import MoeRunner, TorchMoe, gather_rows, regroup_perm


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


class RemoteRows(torch.autograd.Function):
    """Rank 0's rows on peer p's experts (host view): forward pushes the rows and pulls p's
    outputs; backward pushes the outputs' gradients and pulls p's input gradients of the rows."""

    @staticmethod
    def forward(ctx, rows, view, p: int):
        ctx.view, ctx.p = view, p
        view.send_rows[p].copy_(rows, non_blocking=True)
        return torch.empty_like(rows).copy_(view.send_out[p], non_blocking=True)

    @staticmethod
    def backward(ctx, g):
        gv = ctx.view.grad
        gv.send_gout[ctx.p].copy_(g, non_blocking=True)
        return torch.empty_like(g).copy_(gv.send_dx[ctx.p], non_blocking=True), None, None


class MoeGradRunner(MoeRunner):
    """grads[name][r] (ops/moe_bwd.GRADS) every call; routes[r] (and outputs[r], moe-step)."""

    def __init__(self, p: Point, ctx: RankCtx, inputs, mode: str):
        s, self.step, self.saved = moe_shape(p), p.op == "moe-step", None
        self.dy = inputs.dy
        self.wr = {r: _leaf(inputs.Wr) for r in inputs.x}
        self.sh = {r: None if inputs.shared is None else tuple(_leaf(t) for t in inputs.shared) for r in inputs.x}
        inputs = dataclasses.replace(inputs, x={r: _leaf(t) for r, t in inputs.x.items()},
                                     W1={r: _leaf(t) for r, t in inputs.W1.items()},
                                     W2={r: _leaf(t) for r, t in inputs.W2.items()})
        self.grads = grad_buffers(s, ctx.ranks_here, ctx.device)
        view = inputs.host.get("view")
        if view is not None:  # the peers' rows on rank 0's experts: leaves; their output gradients
            self.peer_rows = {q: torch.empty_like(view.recv_rows[q], device=ctx.device).requires_grad_(True)
                              for q in view.peers}
            self.peer_gout = {q: torch.empty_like(self.peer_rows[q]) for q in view.peers}
        super().__init__(p, ctx, inputs, mode)  # compiled: runs (and times) the first call
        if not self.step:
            self.outputs = {}
            if self.saved is None:
                self._forward()

    def _wr(self, r):
        return self.wr[r]

    def _sh(self, r):
        return self.sh[r]

    def _store(self, r, y, idx):
        self._outs[r] = y
        self.routes[r].copy_(idx)
        if self.step:
            self.outputs[r].copy_(y.detach())

    def _forward(self) -> dict:
        self._outs, self._roots = {}, []
        with torch.enable_grad(), self._retainable():
            MoeRunner.run(self)
        self.saved = (self._outs, self._roots)
        return self.saved

    def _retainable(self):
        """moe-bwd runs its backward again and again on one graph (retain_graph): compiled graphs
        must not donate the saved buffers to the backward."""
        import contextlib

        import torch._functorch.config as fconf

        return contextlib.nullcontext() if self.step else fconf.patch(donated_buffer=False)

    def run(self) -> None:
        outs, roots = self._forward() if self.step or self.saved is None else self.saved
        inp, ranks = self.inp, self.ranks
        leaves = []
        for r in ranks:
            leaves += [inp.x[r], self.wr[r], inp.W1[r], inp.W2[r], *(self.sh[r] or ())]
        ys, gs = [outs[r] for r in ranks], [self.dy[r] for r in ranks]
        view = self.view
        if roots:  # host: the peers' output gradients arrive
            for q, _ in roots:
                self.peer_gout[q].copy_(view.grad.recv_gout[q], non_blocking=True)
            ys += [y for _, y in roots]
            gs += [self.peer_gout[q] for q, _ in roots]
            leaves += [self.peer_rows[q] for q, _ in roots]
        with self._retainable():
            got = torch.autograd.grad(ys, leaves, gs, retain_graph=not self.step, allow_unused=True,
                                      materialize_grads=True)
        names = [n for n in ("dx", "dWr", "dW1", "dW2", "dWs1", "dWs2") if n in self.grads]
        for i, r in enumerate(ranks):
            for j, n in enumerate(names):
                self.grads[n][r].copy_(got[i * len(names) + j])
        for (q, _), g in zip(roots, got[len(ranks) * len(names):]):  # host: the peers' input gradients go back
            view.grad.recv_dx[q].copy_(g, non_blocking=True)

    def _host(self) -> None:
        """The forward's host pipeline (serial) with the exchange made differentiable."""
        s, inp, vw, El = self.s, self.inp, self.view, self.s.E_loc
        idx, w, order, xs, counts = self._front(inp.x[0], self._wr(0), inp.bias)
        seg = self._segments(counts.cpu())
        for q in vw.peers:
            if seg[q][1] - seg[q][0] != vw.send_rows[q].shape[0]:
                raise RuntimeError(f"rank 0's routing sends {seg[q][1] - seg[q][0]} rows to rank {q}, the host "
                                   f"view {vw.send_rows[q].shape[0]} (a near-tie decided the other way)")
        a0, b0 = seg[0]
        with torch.no_grad():
            for q in vw.peers:
                self.peer_rows[q].copy_(vw.recv_rows[q], non_blocking=True)
        pieces = [None] + [RemoteRows.apply(xs[seg[q][0]:seg[q][1]], vw, q) for q in vw.peers]
        recv = torch.cat([xs[a0:b0]] + [self.peer_rows[q] for q in vw.peers])
        perm, cnt = regroup_perm([counts[:El]] + [self.recv_cnt[q] for q in vw.peers], El, recv.device)
        yrecv = torch.empty_like(recv)
        yrecv[perm] = self._ffn(gather_rows(recv, perm), cnt, inp.W1[0], inp.W2[0])
        pieces[0] = yrecv[:b0 - a0]
        off = b0 - a0
        for q in vw.peers:  # combine: the peers' outputs back (and kept: their gradients are roots)
            n = vw.recv_out[q].shape[0]
            y = yrecv[off:off + n]
            vw.recv_out[q].copy_(y.detach(), non_blocking=True)
            self._roots.append((q, y))
            off += n
        self._store(0, self._fold(order, torch.cat(pieces), w, inp.x[0], self._sh(0)), idx)

    def _a2a(self, out, inp, out_splits, in_splits):
        """torch's functional all_to_all_single (autograd: its backward is the reverse exchange)."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        return all_to_all_single_autograd(inp.contiguous(), out_splits, in_splits, self.ctx.group)


class FnGradRunner:
    """A world-1 layer function layer(x, Wr, W1, W2, *shared) -> (y, idx) under autograd as a
    moe-bwd / moe-step runner (liger-moe's fused experts): same leaves, buffers and calls as
    MoeGradRunner. The first call (autotuning, compilation; moe-bwd: the saved forward) is made
    here, outside the timing."""

    def __init__(self, p: Point, ctx: RankCtx, inputs, layer, info: dict):
        s, r = moe_shape(p), ctx.rank
        self.step, self.r, self.layer, self.info, self.saved = p.op == "moe-step", r, layer, info, None
        sh = () if inputs.shared is None else inputs.shared
        self.leaves = [_leaf(t.contiguous()) for t in (inputs.x[r], inputs.Wr, inputs.W1[r], inputs.W2[r], *sh)]
        self.dy = inputs.dy[r]
        self.grads = grad_buffers(s, [r], ctx.device)
        self.routes = {r: torch.empty((s.T, s.topk), dtype=torch.int32, device=ctx.device)}
        self.outputs = {r: torch.empty((s.T, s.H), dtype=torch.bfloat16, device=ctx.device)} if self.step else {}
        self.run()

    def _forward(self):
        with torch.enable_grad():
            y, idx = self.layer(*self.leaves)
        self.routes[self.r].copy_(idx)
        if self.step:
            self.outputs[self.r].copy_(y.detach())
        return y

    def run(self) -> None:
        y = self._forward() if self.step or self.saved is None else self.saved
        if not self.step:
            self.saved = y
        got = torch.autograd.grad(y, self.leaves, self.dy, retain_graph=not self.step, allow_unused=True,
                                  materialize_grads=True)
        for name, g in zip(self.grads, got):
            self.grads[name][self.r].copy_(g)

    def close(self) -> None:
        self.saved = None


class TorchMoeFamily(TorchMoe):
    """The torch-moe family as registered (impls/__init__.py): op moe's runner, or the gradient one."""

    def prepare(self, p: Point, ctx: RankCtx, inputs):
        return MoeGradRunner(p, ctx, inputs, self.mode) if p.op != "moe" else super().prepare(p, ctx, inputs)


IMPLS = [TorchMoeFamily(i.name, i.mode) for i in torch_moe.IMPLS]
