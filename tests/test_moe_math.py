"""The MoE layer's contract (ops/moe_math.py): routing, the tie-tolerant check, the fp32
reference against an independent per-token loop, and the backward against finite differences."""
import dataclasses

import pytest
import torch

from kosmos_bench.ops import moe_math as m


def tiny(**kw):
    base = dict(T=24, H=64, F=64, E=8, topk=2, world=2)
    base.update(kw)
    return m.MoeShape(**base)


def test_presets_validate_and_scale_with_world():
    for name in m.PRESETS:
        s = m.preset(name, T=128, world=4)
        assert s.validate() is None and s.E == s.E_loc * 4
    assert "unknown MoE preset" in str(pytest.raises(KeyError, m.preset, "gpt5", 8).value)


@pytest.mark.parametrize("bad, why", [
    (dict(E=7), "divisible"), (dict(topk=9), "topk"), (dict(scoring="relu"), "scoring"),
    (dict(routing="zipf:x"), "routing"), (dict(H=65), "multiples"),
])
def test_validate_says_why(bad, why):
    assert why in tiny(**bad).validate()


def test_near_ties_finds_expert_and_group_ties_and_tokens_have_none():
    s = tiny(E=8, topk=2, n_group=4, topk_group=2, scoring="sigmoid")
    keys = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2],  # clear: groups 0, 1; experts 0, 1
                         [4.0, 3.0, 3.0, 1.0, 0.5, 0.4, 0.3, 0.2],  # the 2nd and 3rd expert tie
                         [4.0, 3.5, 2.0, 1.0, 2.5, 0.5, 0.3, 0.2]])  # groups 1 and 2 both score 3.0
    assert m.near_ties(s, keys).tolist() == [False, True, True]
    assert not m.near_ties(s, keys + torch.tensor([0, 0, 1e-3, 0, 0, 0, 0, 0])).tolist()[0]
    for sh in (tiny(E=8, topk=3), tiny(E=16, topk=4, n_group=4, topk_group=2, scoring="sigmoid", scale=2.5)):
        sh = dataclasses.replace(sh, T=4096, routing="zipf:1.2")
        Wr, bias = m.router(sh, "cpu", 2)
        x = m.tokens(sh, 1, "cpu", 2)
        assert not m.near_ties(sh, x.float() @ Wr.float().t() + bias).any()
        fresh = m._randn((sh.T, sh.H), "cpu", 2 * 1_000_003 + 17 + 1)  # the first draw: some rows redrawn
        changed = int((x != fresh).any(-1).sum())
        assert 0 < changed < sh.T // 50
        assert torch.equal(x, m.tokens(sh, 1, "cpu", 2))


def test_group_limited_topk_only_picks_kept_groups():
    s = tiny(E=16, topk=4, n_group=4, topk_group=2, scoring="sigmoid", scale=2.5)
    x = m.tokens(s, 0, "cpu", 1)
    Wr, bias = m.router(s, "cpu", 1)
    idx, w, keys = m.route(s, x, Wr, bias)
    groups = (idx // 4).tolist()
    assert all(len(set(g)) <= 2 for g in groups)
    assert torch.allclose(w.sum(-1), torch.full((s.T,), 2.5))


def test_zipf_skews_counts_and_uniform_does_not():
    s = tiny(T=512, E=16, topk=2, world=1)
    x = m.tokens(s, 0, "cpu", 2)
    counts = {}
    for routing in ("uniform", "zipf:2"):
        t = dataclasses.replace(s, routing=routing)
        Wr, bias = m.router(t, "cpu", 2)
        idx, _, _ = m.route(t, x, Wr, bias)
        c = m.expert_counts(t, idx).float()
        counts[routing] = float(c.max() / c.mean())
    assert counts["zipf:2"] > 2 * counts["uniform"]


def test_routing_mismatches_accepts_ties_and_rejects_wrong_sets():
    s = tiny()
    x = m.tokens(s, 0, "cpu", 3)
    Wr, bias = m.router(s, "cpu", 3)
    idx, _, keys = m.route(s, x, Wr, bias)
    assert m.routing_mismatches(s, idx, keys) == 0
    worst = keys.topk(s.E, dim=-1).indices[:, -1:]
    bad = idx.clone()
    bad[:5, -1:] = worst[:5]
    assert m.routing_mismatches(s, bad, keys) == 5
    dup = idx.clone()
    dup[0, 1] = dup[0, 0]
    assert m.routing_mismatches(s, dup, keys) == 1
    tied = keys.clone()  # make the k-th and (k+1)-th keys of token 0 equal: either is accepted
    order = keys[0].argsort(descending=True)
    tied[0, order[s.topk]] = tied[0, order[s.topk - 1]]
    swap = idx.clone()
    swap[0, (idx[0] == order[s.topk - 1]).nonzero()[0]] = order[s.topk]
    assert m.routing_mismatches(s, swap, tied) == 0


@pytest.mark.parametrize("scoring, shared_F", [("softmax", 0), ("sigmoid", 64)])
def test_reference_matches_a_per_token_loop(scoring, shared_F):
    s = tiny(scoring=scoring, shared_F=shared_F, scale=2.5 if scoring == "sigmoid" else 1.0)
    x = m.tokens(s, 1, "cpu", 4)
    Wr, bias = m.router(s, "cpu", 4)
    idx, w, _ = m.route(s, x, Wr, bias)
    y = m.reference(s, 1, x, idx, "cpu", 4)
    sh = m.shared(s, "cpu", 4)
    for t in range(0, s.T, 7):
        want = sum(w[t, j] * m.ffn(x[t:t + 1], *m.expert(s, int(idx[t, j]), "cpu", 4))[0] for j in range(s.topk))
        if sh is not None:
            want = want + m.ffn(x[t:t + 1], *sh)[0]
        assert torch.allclose(y[t], want, rtol=1e-5, atol=1e-5)
    W1, W2 = m.local_experts(s, 1, "cpu", 4)
    assert torch.equal(W1[0], m.expert(s, s.E_loc, "cpu", 4)[0])


def test_backward_matches_finite_differences():
    s = tiny(T=8, E=4, scoring="sigmoid", scale=2.5, shared_F=64, world=1)
    x = m.tokens(s, 0, "cpu", 5)
    Wr, bias = m.router(s, "cpu", 5)
    idx, _, _ = m.route(s, x, Wr, bias)
    dy = torch.randn(s.T, s.H, generator=torch.Generator().manual_seed(0))
    g = m.reference_backward(s, 0, x, idx, dy, "cpu", 5)
    e = int(idx[0, 0])
    orig = m.expert

    def loss(eps):
        def bumped(s_, e_, dev, seed):
            w1, w2 = orig(s_, e_, dev, seed)
            if e_ == e:
                w1 = w1.float()
                w1[2, 3] += eps
            return w1, w2
        m.expert = bumped
        try:
            return float((m.reference(s, 0, x, idx, "cpu", 5) * dy).sum())
        finally:
            m.expert = orig
    fd = (loss(1e-2) - loss(-1e-2)) / 2e-2
    assert abs(fd - float(g["W1"][e][2, 3])) < 1e-3 * max(1.0, abs(fd))
    assert g["x"].shape == x.shape and g["Wr"].shape == Wr.shape and g["shared"] is not None


def test_routing_mismatches_accepts_a_group_tie_only():
    """Group-limited top-k: when the last kept group and a dropped one tie within bf16
    precision, experts of either are accepted; experts of a clearly dropped group are not."""
    s = tiny(E=8, topk=2, n_group=4, topk_group=1)  # groups of 2 experts, one group kept
    raw = torch.tensor([[4.0, 3.0, 3.99, 3.0, 1.0, 0.5, 0.2, 0.1]])  # group 0 scores 7.0, group 1 6.99
    assert m.routing_mismatches(s, torch.tensor([[0, 1]]), raw) == 0  # the reference's choice
    assert m.routing_mismatches(s, torch.tensor([[2, 3]]), raw) == 0  # the tied group's
    assert m.routing_mismatches(s, torch.tensor([[4, 5]]), raw) == 1  # group 2 (score 1.5): wrong
    raw[0, 2] = 3.5  # group 1 at 6.5: no longer a tie
    assert m.routing_mismatches(s, torch.tensor([[2, 3]]), raw) == 1
