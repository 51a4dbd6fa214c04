"""fp32 reference gradients of the MoE layer (moe_math), streamed one expert at a time.

moe_math.reference_backward gives every gradient of one rank's share by autograd, holding every
used expert's fp32 weights and gradients at once (256 experts of deepseek-v3 at world 8: ~90 GB).
The backward ops' checks use this instead: the same math written out per expert, so that only
one expert is in fp32 at a time, and split the way expert parallelism splits the gradients:

* `token_grads(rank's x, idx, dy)`: what stays on the rank: dx (T x H), dWr (E x H: this rank's
  tokens' share; the replicated router's gradient is summed over ranks by data parallelism,
  outside the layer) and the shared expert's (same).
* `expert_grads(e, parts)`: dW1_e, dW2_e of the expert's owner: the sum over every rank's rows
  routed to e, ranks in order (parts[r] = rank r's x, idx, combine weights, dy).

Routing is fixed (the implementation's decisions: top-k has no gradient, the combine weights do).
tests/test_moe_bwd.py checks these against moe_math.reference_backward.
"""
from __future__ import annotations

import torch

from . import moe_math as mm


def output_grad(s: mm.MoeShape, rank: int, device, seed: int) -> torch.Tensor:
    """dy_r: the output gradient of rank r (T x H bf16, N(0, 1)), seeded like the inputs."""
    return mm._randn((s.T, s.H), device, seed * 1_000_003 + 40_000 + rank)


def combine_weights(s: mm.MoeShape, x: torch.Tensor, Wr: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """fp32 combine weights (T x k) of the chosen experts idx, from the fp32 router."""
    return mm.weights_for(s, x.float() @ Wr.float().t(), idx.long())


def _rows(x, idx, w, dy, e):
    """(x rows fp32, upstream gradient of the expert's output rows w_tj * dy_t fp32, tok, j) of e."""
    tok, j = (idx == e).nonzero(as_tuple=True)
    return x[tok].float(), w[tok, j, None] * dy[tok].float(), tok, j


def _swiglu_terms(xe, w1, F):
    gu = xe @ w1.t()
    g, u = gu[:, :F], gu[:, F:]
    sg = torch.sigmoid(g)
    return g, u, sg, g * sg * u


def _swiglu_back(da, g, u, sg):
    """[dg | du] of a = silu(g) u: silu'(g) = sig(g) (1 + g (1 - sig(g)))."""
    return torch.cat([da * u * sg * (1 + g * (1 - sg)), da * g * sg], 1)


def token_grads(s: mm.MoeShape, x, idx, dy, device, seed: int, Wr, absent=None) -> dict:
    """{'x': T x H, 'Wr': E x H, 'shared': (dW1s, dW2s) | None} fp32 of one rank's share.
    absent (T x k bool): choices with no expert output (moe_math.reference), whose output,
    and so its dx and combine-weight gradient, is 0."""
    idx = idx.long()
    # the experts' rows: an absent choice gets expert id E, which no expert has (skipped below)
    rows = idx if absent is None else idx.masked_fill(absent.to(idx.device), s.E)
    xf, dyf = x.float(), dy.float()
    with torch.enable_grad():
        logits = (xf @ Wr.float().t()).requires_grad_(True)
        w = mm.weights_for(s, logits, idx)
    wd = w.detach()
    dw = torch.zeros_like(wd)
    dx = torch.zeros_like(xf)
    for e in torch.unique(rows).tolist():
        if e == s.E:
            continue
        xe, dye, tok, j = _rows(x, rows, wd, dy, e)
        w1, w2 = (t.float() for t in mm.expert(s, e, device, seed))
        g, u, sg, a = _swiglu_terms(xe, w1, s.F)
        dw[tok, j] = (dyf[tok] * (a @ w2.t())).sum(-1)
        dx.index_add_(0, tok, _swiglu_back(dye @ w2, g, u, sg) @ w1)
    (dlogits,) = torch.autograd.grad(w, logits, dw)
    dx += dlogits @ Wr.float()
    out = {"x": dx, "Wr": dlogits.t() @ xf, "shared": None}
    sh = mm.shared(s, device, seed)
    if sh is not None:
        with torch.enable_grad():
            xl = xf.clone().requires_grad_(True)
            shf = [t.float().requires_grad_(True) for t in sh]
            gx, g1, g2 = torch.autograd.grad(mm.ffn(xl, *shf), [xl, *shf], dyf)
        out["x"] += gx
        out["shared"] = (g1, g2)
    return out


def expert_grads(s: mm.MoeShape, e: int, parts: list, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (dW1_e: 2F x H, dW2_e: H x F) summed over parts = [(x, idx, w, dy) of rank 0, 1, ...]
    in that order (w: combine_weights of the rank)."""
    w1, w2 = (t.float() for t in mm.expert(s, e, device, seed))
    d1, d2 = torch.zeros_like(w1), torch.zeros_like(w2)
    for x, idx, w, dy in parts:
        xe, dye, _, _ = _rows(x, idx.long(), w, dy, e)
        if xe.shape[0] == 0:
            continue
        g, u, sg, a = _swiglu_terms(xe, w1, s.F)
        d2 += dye.t() @ a
        d1 += _swiglu_back(dye @ w2, g, u, sg).t() @ xe
    return d1, d2

