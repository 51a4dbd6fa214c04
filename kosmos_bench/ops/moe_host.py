"""The host fabric's rank-0 view of an expert-parallel MoE layer (see moe_math for the layer).

Rank 0 runs; peers p = 1..W-1 do not execute. What they would exchange with rank 0 is static,
so it is made once per point (`make_view`) and kept in pinned host memory, which rank 0 reaches
over PCIe, as the TP ops' host fabric does:

* recv (dispatch, host -> device): peer p's tokens routed (reference routing of x_p) to rank
  0's experts, as rows in the order rank 0 consumes them, sorted by (local expert, source token,
  choice j), with their metadata; rank 0 sends its expert outputs of these rows back
  (combine, device -> host) into `recv_out[p]`.
* send: rank 0's tokens routed to peer p's experts. Rank 0 pushes those rows to `send_rows[p]`
  (dispatch, device -> host); the peers' expert outputs of them, computed here with torch in
  bf16 as an implementation would, lie in `send_out[p]` for the combine (host -> device).

Every implementation (the KOSMOS kernel and the torch baselines) moves exactly these bytes
(`bytes_moved`); rows are per (token, choice), not deduplicated per destination rank.

The send side is laid out for rank 0's *reference* routing `routes0` (the peers' outputs can
only be precomputed for a known routing): `slot0[t, j]` is the row of choice (t, j) in
`send_out[owner]` (-1 for a choice of one of rank 0's own experts). The tokens have no near-tie
routing (moe_math.tokens redraws those rows), so every implementation's routing is routes0. Before
that, a kernel's fp32 logits once picked the other expert of a tie (one deepseek-v3 token of 8192
at W 8, results/device-h100-20261206c), found no output for it and added 0, and the peers' input
gradients of that token's other choices (made with routes0's combine weights) were off. In case an
implementation routes otherwise anyway, the check's reference leaves such choices out
(`MoeHostView.absent`), as a peer that never received the row would.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import moe_math as mm

META_COLS = ("expert", "token", "choice")  # int32 metadata columns: global expert, source token, j


@dataclass
class MoeHostView:
    shape: mm.MoeShape
    routes0: torch.Tensor  # (T x k) int64, CPU: reference routing of rank 0's tokens
    slot0: torch.Tensor  # (T x k) int32, CPU: row in send_out[owner(routes0[t, j])], -1 when local
    # recv side, per peer p = 1..W-1
    recv_rows: dict = field(default_factory=dict)  # (n_p x H) bf16 pinned: peer p's rows for rank 0's experts
    recv_meta: dict = field(default_factory=dict)  # (n_p x 3) int32 CPU: META_COLS of those rows
    recv_weight: dict = field(default_factory=dict)  # (n_p,) fp32 CPU: their combine weights (applied by p)
    recv_counts: dict = field(default_factory=dict)  # (E_loc,) int64 CPU: rows per rank-0 expert
    recv_out: dict = field(default_factory=dict)  # (n_p x H) bf16 pinned: rank 0 writes its outputs here
    # send side, per peer p = 1..W-1
    send_meta: dict = field(default_factory=dict)  # (m_p x 3) int32 CPU, sorted by (expert, token, j)
    send_counts: dict = field(default_factory=dict)  # (E_loc,) int64 CPU: rows per expert of peer p
    send_rows: dict = field(default_factory=dict)  # (m_p x H) bf16 pinned: rank 0 writes its rows here
    send_out: dict = field(default_factory=dict)  # (m_p x H) bf16 pinned: peer p's expert outputs

    @property
    def peers(self) -> list[int]:
        return list(range(1, self.shape.world))

    def bytes_moved(self) -> dict[str, int]:
        """Bytes over PCIe per forward call, by step and direction (every implementation's)."""
        nb = lambda d: sum(t.numel() * t.element_size() for t in d.values())  # noqa: E731
        b = {"dispatch_h2d": nb(self.recv_rows), "dispatch_d2h": nb(self.send_rows),
             "combine_d2h": nb(self.recv_out), "combine_h2d": nb(self.send_out)}
        b["dispatch"] = b["dispatch_h2d"] + b["dispatch_d2h"]
        b["combine"] = b["combine_d2h"] + b["combine_h2d"]
        b["total"] = b["dispatch"] + b["combine"]
        return b

    def absent(self, idx: torch.Tensor) -> torch.Tensor:
        """(T x k) bool: the choices of rank 0's routing idx that have no peer output here:
        a remote expert that routes0 does not choose for that token (a near-tie)."""
        idx = idx.long().cpu()
        remote = torch.div(idx, self.shape.E_loc, rounding_mode="floor") != 0
        made = (idx[:, :, None] == self.routes0[:, None, :]).any(-1)
        return remote & ~made

    def recv_tokens_per_expert(self) -> torch.Tensor:
        """(E_loc,) rows each of rank 0's experts receives from the peers (own rows excluded)."""
        tot = torch.zeros(self.shape.E_loc, dtype=torch.int64)
        for c in self.recv_counts.values():
            tot += c
        return tot


def _pinned(t: torch.Tensor) -> torch.Tensor:
    t = t.to("cpu").contiguous()
    return t.pin_memory() if torch.cuda.is_available() else t


def _pinned_empty(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=torch.cuda.is_available())


def choices_for(s: mm.MoeShape, idx: torch.Tensor, rank: int) -> torch.Tensor:
    """(n x 3) int64 [expert, token, j] of the choices in idx owned by `rank`, sorted by
    (expert, token, j): the order the owner's grouped GEMM consumes them. Keys are unique,
    so the order is deterministic on every device."""
    idx = idx.long()
    T, k = idx.shape
    tok, j = (torch.div(idx, s.E_loc, rounding_mode="floor") == rank).nonzero(as_tuple=True)
    e = idx[tok, j]
    order = torch.argsort((e * T + tok) * k + j)
    return torch.stack([e[order], tok[order], j[order]], dim=1)


def expert_ffn_bf16(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """bf16 SwiGLU of rows x as a bf16 MoE implementation computes it (fp32 accumulate, the
    hidden activation rounded to bf16)."""
    F = w2.shape[1]
    gu = x @ w1.t()
    h = (torch.nn.functional.silu(gu[:, :F].float()) * gu[:, F:].float()).to(x.dtype)
    return h @ w2.t()


def make_view(s: mm.MoeShape, x0: torch.Tensor, Wr: torch.Tensor, bias: torch.Tensor, device, seed: int) -> MoeHostView:
    """The rank-0 view of point (s, seed): x0, Wr, bias as in moe_math.make_inputs on `device`,
    where the peers' routing and expert outputs are computed (one expert at a time)."""
    idx0, _, _ = mm.route(s, x0, Wr, bias)
    T, k = idx0.shape
    view = MoeHostView(s, routes0=idx0.cpu(), slot0=torch.full((T, k), -1, dtype=torch.int32))
    for p in range(1, s.world):
        # recv: peer p's tokens that chose rank 0's experts
        xp = mm.tokens(s, p, device, seed)
        idx_p, w_p, _ = mm.route(s, xp, Wr, bias)
        ch = choices_for(s, idx_p, 0)
        view.recv_rows[p] = _pinned(xp[ch[:, 1]])
        view.recv_meta[p] = ch.to(torch.int32).cpu()
        view.recv_weight[p] = w_p[ch[:, 1], ch[:, 2]].float().cpu()
        view.recv_counts[p] = torch.bincount(ch[:, 0].cpu(), minlength=s.E)[:s.E_loc]
        view.recv_out[p] = _pinned_empty((ch.shape[0], s.H), x0.dtype)
        del xp
        # send: rank 0's tokens that chose peer p's experts, and p's outputs of them
        ch = choices_for(s, idx0, p)
        out = torch.empty((ch.shape[0], s.H), dtype=x0.dtype, device=x0.device)
        for e in torch.unique(ch[:, 0]).tolist():
            sel = (ch[:, 0] == e).nonzero(as_tuple=True)[0]
            w1, w2 = mm.expert(s, e, device, seed)
            out[sel] = expert_ffn_bf16(x0[ch[sel, 1]], w1, w2)
        chc = ch.cpu()
        view.send_meta[p] = chc.to(torch.int32)
        view.send_counts[p] = torch.bincount(chc[:, 0] - p * s.E_loc, minlength=s.E_loc)
        view.send_rows[p] = _pinned_empty((ch.shape[0], s.H), x0.dtype)
        view.send_out[p] = _pinned(out)
        view.slot0[chc[:, 1], chc[:, 2]] = torch.arange(chc.shape[0], dtype=torch.int32)
    return view
