"""The MoE expert layer's definition: shape, inputs, routing and the fp32 reference.

This module is the contract every `moe` implementation (KOSMOS kernel, torch pipelines,
fused-MoE libraries) and the checks share. Torch only; no harness types.

Layer, per rank r of W (expert parallel, experts e in [r*E_loc, (r+1)*E_loc) live on rank r):

    logits = x @ Wr^T                      (T x E, fp32 accumulate; Wr replicated)
    keys   = logits + bias                 selection only (bias: zero for `uniform` routing,
                                           -s*ln(1+rank_e) for `zipf:s`, ranks a fixed
                                           permutation of the experts)
    [group-limited: experts in n_group groups; a group's score = sum of its top-2 keys;
     keep the topk_group best groups, mask the others]
    idx    = top-k of keys                 (T x k, ties: lower expert id first, as torch.topk)
    w      = softmax(logits)[idx] renormalised over the k choices      (scoring softmax)
           | sigmoid(logits)[idx] / sum(sigmoid(logits)[idx]) * scale    (scoring sigmoid)
    y_t    = sum_{j=0..k-1} w_tj * FFN_{idx_tj}(x_t)   [+ FFN_shared(x_t)]
    FFN_e(x) = (silu(x @ W1g_e^T) * (x @ W1u_e^T)) @ W2_e^T
               W1_e = [W1g_e; W1u_e] is (2F x H): gate rows first, then up rows; W2_e is (H x F)

Implementations keep the hidden activation h = silu(g)*u in bf16 (as every bf16 MoE kernel
does); the reference keeps it in fp32, so the tolerance is the op's bf16 RTOL.
Inputs are seeded per tensor (tokens per rank, weights per expert), so any process can make
any rank's share, and the reference of one rank never materialises all experts at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Presets: one EP=8 rank's share of the real layer (experts per rank), scaled by world.
PRESETS = {
    # DeepSeek-V3: 256 routed experts over EP=8, top-8, sigmoid scores with the
    # group-limited top-k (8 groups, 4 kept), weights normalised and scaled by 2.5, 1 shared.
    "deepseek-v3": dict(H=7168, F=2048, E_loc=32, topk=8, scoring="sigmoid", n_group=8,
                        topk_group=4, scale=2.5, shared_F=2048),
    # Qwen3-235B-A22B: 128 experts over EP=8, top-8, softmax renormalised, no shared expert.
    "qwen3-235b-a22b": dict(H=4096, F=1536, E_loc=16, topk=8, scoring="softmax", n_group=1,
                            topk_group=1, scale=1.0, shared_F=0),
    # Tiny layers of the same two kinds, for the cpu backend and the tests.
    "tiny": dict(H=256, F=256, E_loc=4, topk=2, scoring="softmax", n_group=1, topk_group=1, scale=1.0,
                 shared_F=0),
    "tiny-grouped": dict(H=256, F=256, E_loc=4, topk=3, scoring="sigmoid", n_group=4, topk_group=3,
                         scale=2.5, shared_F=64),
}
SCORINGS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoeShape:
    T: int  # tokens per rank
    H: int  # hidden size
    F: int  # expert FFN width (per gate/up)
    E: int  # routed experts over all ranks
    topk: int
    world: int = 1
    scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0
    shared_F: int = 0  # shared expert FFN width, 0 = none
    routing: str = "uniform"  # uniform | zipf:<s>

    @property
    def E_loc(self) -> int:
        return self.E // self.world

    def owner(self, e: int) -> int:
        return e // self.E_loc

    def validate(self) -> str | None:
        if self.E % self.world:
            return f"experts={self.E} is not divisible by world={self.world}"
        if not 1 <= self.topk <= self.E:
            return f"topk={self.topk} must be in [1, experts={self.E}]"
        if self.scoring not in SCORINGS:
            return f"scoring {self.scoring!r} is not one of {', '.join(SCORINGS)}"
        if self.E % self.n_group or not 1 <= self.topk_group <= self.n_group:
            return f"groups {self.n_group}/{self.topk_group} do not fit experts={self.E}"
        if self.n_group > 1 and self.topk > self.topk_group * (self.E // self.n_group):
            return f"topk={self.topk} exceeds the experts of {self.topk_group} groups"
        if self.H % 64 or self.F % 64 or self.shared_F % 64:
            return "hidden and FFN widths must be multiples of 64"
        try:
            zipf_s(self.routing)
        except ValueError as e:
            return str(e)
        return None

    def flops(self) -> float:
        """FLOPs of one rank's forward: router GEMM + k expert FFNs per token + shared."""
        per_tok = 2 * self.H * self.E + 6 * self.H * self.F * self.topk + 6 * self.H * self.shared_F
        return float(self.T * per_tok)


def preset(name: str, T: int, world: int = 1, routing: str = "uniform", E_loc: int | None = None) -> MoeShape:
    try:
        p = dict(PRESETS[name])
    except KeyError:
        raise KeyError(f"unknown MoE preset {name!r}; known: {', '.join(PRESETS)}") from None
    e_loc = E_loc or p.pop("E_loc")
    p.pop("E_loc", None)
    return MoeShape(T=T, E=e_loc * world, world=world, routing=routing, **p)


def zipf_s(routing: str) -> float:
    """0 for 'uniform', s for 'zipf:s'; ValueError (one line) otherwise."""
    if routing == "uniform":
        return 0.0
    head, _, s = routing.partition(":")
    try:
        if head == "zipf" and float(s) >= 0:
            return float(s)
    except ValueError:
        pass
    raise ValueError(f"routing {routing!r} is not 'uniform' or 'zipf:<s>' with s >= 0")


def _gen(device, seed: int) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def _randn(shape, device, seed, scale=1.0) -> torch.Tensor:
    t = torch.randn(shape, generator=_gen(device, seed), device=device, dtype=torch.float32)
    return (t * scale).to(torch.bfloat16)


# A token whose routing is decided by a margin below this (relative to the keys, as
# routing_mismatches' tie_eps) is redrawn. fp32 router logits summed in another order (a kernel's
# wgmma tile, H = 7168 bf16 products) differ by ~5e-6; 2^-12 is 50x that, so every
# implementation's routing of these tokens is the reference's, and so are the peers' routings
# that a rank-0 view (moe_host) or another process precomputes. Redrawn: 0.1-1% of the rows.
UNTIE_EPS = 2 ** -12


def near_ties(s: MoeShape, raw: torch.Tensor, eps: float = UNTIE_EPS) -> torch.Tensor:
    """(T,) bool: rows of raw keys (route's third value) whose chosen set, or kept groups, hang
    on a margin below eps: the k-th and next key, or the last kept and next group's score."""
    def close(v, n):  # the n-th and (n+1)-th of the descending v within eps of the n-th
        if v.shape[-1] <= n:
            return torch.zeros(v.shape[0], dtype=torch.bool, device=v.device)
        top = v.topk(n + 1, dim=-1).values
        return (top[:, n - 1] - top[:, n]) < eps * top[:, n - 1].abs().clamp_min(1.0)

    tie = close(limit_groups(s, raw), s.topk)
    if s.n_group > 1:
        tie |= close(group_scores(s, raw), s.topk_group)
    return tie


def tokens(s: MoeShape, rank: int, device, seed: int) -> torch.Tensor:
    """x_r: (T x H) bf16, N(0, 1), with no near-tie routing (near_ties' rows redrawn, each from
    its own row of a further stream, so the result does not depend on which rows tie)."""
    base = seed * 1_000_003 + 17 + rank
    x = _randn((s.T, s.H), device, base)
    Wr, bias = router(s, device, seed)
    rows = torch.arange(s.T, device=x.device)  # the rows to check: all, then the redrawn ones
    for attempt in range(1, 17):
        rows = rows[near_ties(s, x[rows].float() @ Wr.float().t() + bias)]
        if rows.numel() == 0:
            return x
        x[rows] = _randn((s.T, s.H), device, base + 200_000 + 1_000 * attempt)[rows]
    raise RuntimeError(f"moe tokens: rank {rank}'s routing still ties after 16 redraws")


def router(s: MoeShape, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Wr: E x H bf16, logits ~ N(0, 1); bias: E fp32, the routing skew)."""
    Wr = _randn((s.E, s.H), device, seed * 1_000_003 + 7, s.H ** -0.5)
    z = zipf_s(s.routing)
    perm = torch.randperm(s.E, generator=_gen("cpu", seed * 1_000_003 + 11))
    bias = (-z * torch.log1p(perm.float())).to(device)
    return Wr, bias


def expert(s: MoeShape, e: int, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W1_e: 2F x H bf16, gate rows then up rows; W2_e: H x F bf16) of global expert e."""
    base = seed * 1_000_003 + 100_000 + 2 * e
    return (_randn((2 * s.F, s.H), device, base, s.H ** -0.5),
            _randn((s.H, s.F), device, base + 1, s.F ** -0.5))


def local_experts(s: MoeShape, rank: int, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's experts stacked: (W1: E_loc x 2F x H, W2: E_loc x H x F), bf16."""
    ws = [expert(s, e, device, seed) for e in range(rank * s.E_loc, (rank + 1) * s.E_loc)]
    return torch.stack([w[0] for w in ws]), torch.stack([w[1] for w in ws])


def shared(s: MoeShape, device, seed: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The shared expert (same weights on every rank), or None."""
    if not s.shared_F:
        return None
    base = seed * 1_000_003 + 50_000
    return (_randn((2 * s.shared_F, s.H), device, base, s.H ** -0.5),
            _randn((s.H, s.shared_F), device, base + 1, s.shared_F ** -0.5))


def group_scores(s: MoeShape, keys: torch.Tensor) -> torch.Tensor:
    """(T x n_group) scores of the group-limited top-k: the sum of each group's two best keys."""
    g = keys.view(keys.shape[0], s.n_group, -1)
    return g.topk(min(2, g.shape[-1]), dim=-1).values.sum(-1)


def limit_groups(s: MoeShape, keys: torch.Tensor, tie: float = 0.0) -> torch.Tensor:
    """keys (T x E) with the experts outside the kept groups at -inf (group-limited top-k: a
    group scores the sum of its two best keys, the topk_group best groups are kept). tie > 0
    also keeps the groups within tie (relative, as routing_mismatches) of the last kept one."""
    if s.n_group <= 1:
        return keys
    g = keys.view(keys.shape[0], s.n_group, -1)
    gscore = group_scores(s, keys)
    if tie:
        last = gscore.topk(s.topk_group, dim=-1).values[:, -1:]
        drop = gscore < last - tie * last.abs().clamp_min(1.0)
    else:
        keep = gscore.topk(s.topk_group, dim=-1).indices
        drop = torch.ones_like(gscore, dtype=torch.bool).scatter_(1, keep, False)
    return g.masked_fill(drop[..., None], float("-inf")).view_as(keys)


def selection_keys(s: MoeShape, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """fp32 keys that top-k ranks (group-limited experts outside the kept groups: -inf)."""
    return limit_groups(s, logits.float() + bias)


def route(s: MoeShape, x: torch.Tensor, Wr: torch.Tensor, bias: torch.Tensor):
    """fp32 reference routing: (idx T x k int64, weights T x k fp32, raw keys T x E fp32 =
    logits + bias before the group limit: what routing_mismatches judges a routing by)."""
    logits = x.float() @ Wr.float().t()
    raw = logits.float() + bias
    idx = limit_groups(s, raw).topk(s.topk, dim=-1).indices
    return idx, weights_for(s, logits, idx), raw


def routing_mismatches(s: MoeShape, idx: torch.Tensor, keys: torch.Tensor, tie_eps: float = 2 ** -7) -> int:
    """Tokens whose chosen set differs from the reference's beyond a tie.

    keys: the raw keys (route's third value). A choice is accepted when its key is within
    tie_eps (bf16 precision, relative to the k-th key's magnitude) of the reference k-th key,
    its group counted as kept when the group's score ties the last kept group's the same way
    (a kernel's bf16 logits may keep the other group of a near-tie); duplicate or
    out-of-range choices are always mismatches."""
    idx = idx.long()
    T, E = keys.shape
    bad = (idx < 0) | (idx >= E)
    dup = torch.zeros(T, dtype=torch.bool, device=idx.device)
    srt = idx.sort(dim=-1).values
    if s.topk > 1:
        dup = (srt[:, 1:] == srt[:, :-1]).any(-1)
    kth = limit_groups(s, keys).topk(s.topk, dim=-1).values[:, -1:]
    got = limit_groups(s, keys, tie_eps).gather(1, idx.clamp(0, E - 1))
    tol = tie_eps * kth.abs().clamp_min(1.0)
    low = got < kth - tol
    return int((bad.any(-1) | dup | low.any(-1)).sum().item())


def weights_for(s: MoeShape, logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """fp32 combine weights (T x k) of the chosen experts idx."""
    lg = logits.float()
    if s.scoring == "softmax":
        w = torch.softmax(lg, dim=-1).gather(1, idx.long())
        return w / w.sum(-1, keepdim=True)
    w = torch.sigmoid(lg).gather(1, idx.long())
    return w / w.sum(-1, keepdim=True) * s.scale


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """fp32 SwiGLU FFN of rows x with W1 (2F x H, gate then up) and W2 (H x F)."""
    F = w2.shape[1]
    gu = x.float() @ w1.float().t()
    return (torch.nn.functional.silu(gu[:, :F]) * gu[:, F:]) @ w2.float().t()


def reference(s: MoeShape, rank: int, x: torch.Tensor, idx: torch.Tensor, device, seed: int,
              Wr: torch.Tensor | None = None, absent: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 output (T x H) of rank `rank` for its tokens x and the given routing decisions idx
    (the implementation's, already checked by `routing_mismatches`); weights recomputed in fp32
    from the router. absent (T x k bool): choices with no expert output (the host view's,
    moe_host.MoeHostView.absent), which add 0. Experts are made one at a time (see `expert`)."""
    if Wr is None:
        Wr, _ = router(s, device, seed)
    logits = x.float() @ Wr.float().t()
    w = weights_for(s, logits, idx)
    if absent is not None:
        w = w.masked_fill(absent.to(w.device), 0.0)
    y = torch.zeros(x.shape[0], s.H, device=device, dtype=torch.float32)
    idx = idx.long()
    for e in torch.unique(idx).tolist():
        tok, j = (idx == e).nonzero(as_tuple=True)
        w1, w2 = expert(s, e, device, seed)
        y.index_add_(0, tok, ffn(x[tok], w1, w2) * w[tok, j, None])
    sh = shared(s, device, seed)
    if sh is not None:
        y += ffn(x, *sh)
    return y


def expert_counts(s: MoeShape, idx: torch.Tensor) -> torch.Tensor:
    """Tokens per global expert for one rank's decisions (E,) int64."""
    return torch.bincount(idx.long().flatten(), minlength=s.E)


def tile_rows(counts: torch.Tensor, bm: int) -> int:
    """Rows of an expert-sorted buffer whose segments are padded to bm rows."""
    return int(sum(math.ceil(int(c) / bm) * bm for c in counts.tolist()))


@dataclass
class MoeInputs:
    """One process's share of a point, on its device (the ranks it computes, see RankCtx):

    x[r] (T x H), W1[r] (E_loc x 2F x H), W2[r] (E_loc x H x F) for r in `ranks`; Wr, bias
    and the shared expert (or None) are the same on every rank. On the host fabric the peers'
    tokens (and whatever an implementation precomputes of the peers) live in `host`, pinned,
    made once per point by whoever needs them."""

    shape: MoeShape
    x: dict
    W1: dict
    W2: dict
    Wr: torch.Tensor
    bias: torch.Tensor
    shared: tuple | None
    host: dict


def make_inputs(s: MoeShape, ranks: list[int], device, seed: int) -> MoeInputs:
    x, W1, W2 = {}, {}, {}
    for r in ranks:
        x[r] = tokens(s, r, device, seed)
        W1[r], W2[r] = local_experts(s, r, device, seed)
    Wr, bias = router(s, device, seed)
    return MoeInputs(s, x, W1, W2, Wr, bias, shared(s, device, seed), {})


def reference_backward(s: MoeShape, rank: int, x: torch.Tensor, idx: torch.Tensor, dy: torch.Tensor,
                       device, seed: int) -> dict:
    """fp32 gradients of rank `rank`'s share for output gradient dy (T x H), routing fixed to idx
    (an implementation's decisions; the top-k selection itself has no gradient, the combine
    weights do): {'x': T x H, 'Wr': E x H, 'W1': {e: 2F x H}, 'W2': {e: H x F}, 'shared': (..)|None}
    for every expert e that idx uses. Weight gradients are this rank's tokens' contributions only;
    an expert's full gradient sums them over ranks (in rank order)."""
    Wr, _ = router(s, device, seed)
    xf = x.float().requires_grad_(True)
    Wrf = Wr.float().requires_grad_(True)
    w = weights_for(s, xf @ Wrf.t(), idx)
    y = torch.zeros(x.shape[0], s.H, device=device, dtype=torch.float32)
    idx = idx.long()
    W1, W2 = {}, {}
    for e in torch.unique(idx).tolist():
        tok, j = (idx == e).nonzero(as_tuple=True)
        w1, w2 = (t.float().requires_grad_(True) for t in expert(s, e, device, seed))
        W1[e], W2[e] = w1, w2
        y = y.index_add(0, tok, ffn(xf[tok], w1, w2) * w[tok, j, None])
    sh = shared(s, device, seed)
    shf = None
    if sh is not None:
        shf = tuple(t.float().requires_grad_(True) for t in sh)
        y = y + ffn(xf, *shf)
    y.backward(dy.float())
    return {"x": xf.grad, "Wr": Wrf.grad, "W1": {e: t.grad for e, t in W1.items()},
            "W2": {e: t.grad for e, t in W2.items()},
            "shared": None if shf is None else tuple(t.grad for t in shf)}
