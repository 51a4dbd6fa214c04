"""The host fabric's rank-0 view for the MoE backward (ops moe-bwd, moe-step): what the peers
would exchange with rank 0 in the backward, made once per point next to the forward's view
(ops/moe_host.py), in pinned host memory. The backward moves the forward's rows the other way:

* recv side (peer p's rows on rank 0's experts): `recv_gout[p]` the upstream gradient of rank 0's
  expert outputs of those rows (w_tj * dy_p[t], bf16, as p's combine backward makes it; H2D), and
  `recv_dx[p]` where rank 0 writes their input gradients back (D2H);
* send side (rank 0's rows on p's experts, reference routing): `send_gout[p]` where rank 0
  writes the upstream gradients of its rows (D2H), and `send_dx[p]` p's input gradients of them
  (bf16 torch, as an implementation computes them; H2D).

The weight gradients of rank 0's experts come from its own rows and the peers' (recv side);
the peers' experts' gradients are theirs and are not made.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import moe_grad as mg
from . import moe_math as mm
from .moe_host import MoeHostView, _pinned, _pinned_empty


@dataclass
class MoeHostGradView:
    recv_gout: dict = field(default_factory=dict)  # (n_p x H) bf16 pinned
    recv_dx: dict = field(default_factory=dict)  # (n_p x H) bf16 pinned, rank 0 writes
    send_gout: dict = field(default_factory=dict)  # (m_p x H) bf16 pinned, rank 0 writes
    send_dx: dict = field(default_factory=dict)  # (m_p x H) bf16 pinned


def expert_dgrad_bf16(x: torch.Tensor, g: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Input gradient of rows x through a bf16 SwiGLU expert for upstream g (rows x H, bf16), as
    a bf16 implementation computes it (fp32 accumulate; dh and [dg|du] rounded to bf16)."""
    F = w2.shape[1]
    gu = x @ w1.t()
    gf, uf = gu[:, :F].float(), gu[:, F:].float()
    dh = (g @ w2).float()
    return mg._swiglu_back(dh, gf, uf, torch.sigmoid(gf)).to(x.dtype) @ w1


def add_grad_view(view: MoeHostView, s: mm.MoeShape, x0, dy0, Wr, device, seed: int) -> MoeHostGradView:
    """view.grad: the backward's side of `view` for rank 0's tokens x0 and output gradient dy0."""
    gv = MoeHostGradView()
    w0 = mg.combine_weights(s, x0, Wr, view.routes0.to(device))
    for p in view.peers:
        dyp = mg.output_grad(s, p, device, seed)
        meta = view.recv_meta[p].long().to(device)
        g = view.recv_weight[p].to(device)[:, None] * dyp[meta[:, 1]].float()
        gv.recv_gout[p] = _pinned(g.to(x0.dtype))
        gv.recv_dx[p] = _pinned_empty(tuple(g.shape), x0.dtype)
        del dyp, g
        ch = view.send_meta[p].long().to(device)
        g0 = (w0[ch[:, 1], ch[:, 2], None] * dy0[ch[:, 1]].float()).to(x0.dtype)
        dx = torch.empty_like(g0)
        for e in torch.unique(ch[:, 0]).tolist():
            sel = (ch[:, 0] == e).nonzero(as_tuple=True)[0]
            w1, w2 = mm.expert(s, e, device, seed)
            dx[sel] = expert_dgrad_bf16(x0[ch[sel, 1]], g0[sel], w1, w2)
        gv.send_dx[p] = _pinned(dx)
        gv.send_gout[p] = _pinned_empty(tuple(dx.shape), x0.dtype)
    view.grad = gv
    return gv
