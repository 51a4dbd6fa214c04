"""The host fabric's rank-0 view of the MoE layer (ops/moe_host.py), on tiny CPU shapes."""
import torch

from kosmos_bench.ops import moe_math as mm
from kosmos_bench.ops.base import check_output
from kosmos_bench.ops.moe_host import choices_for, expert_ffn_bf16, make_view


def _tiny(world=4, routing="zipf:1.2", **kw):
    base = dict(T=48, H=64, F=64, E=4 * world, topk=3, world=world, routing=routing)
    base.update(kw)
    return mm.MoeShape(**base)


def _view(s, seed=3):
    x0 = mm.tokens(s, 0, "cpu", seed)
    Wr, bias = mm.router(s, "cpu", seed)
    return x0, Wr, bias, make_view(s, x0, Wr, bias, "cpu", seed)


def test_recv_rows_are_the_peers_tokens_for_rank0s_experts_in_consumption_order():
    s = _tiny()
    _, Wr, bias, v = _view(s)
    assert v.peers == [1, 2, 3]
    for p in v.peers:
        xp = mm.tokens(s, p, "cpu", 3)
        idx, w, _ = mm.route(s, xp, Wr, bias)
        meta = v.recv_meta[p].long()
        want = {(int(e), t, j) for t in range(s.T) for j, e in enumerate(idx[t]) if int(e) < s.E_loc}
        assert {tuple(r) for r in meta.tolist()} == want and len(want) == meta.shape[0] > 0
        keys = (meta[:, 0] * s.T + meta[:, 1]) * s.topk + meta[:, 2]
        assert torch.all(keys[1:] > keys[:-1])  # sorted by (expert, token, j)
        assert torch.equal(v.recv_rows[p], xp[meta[:, 1]])
        assert torch.equal(v.recv_weight[p], w[meta[:, 1], meta[:, 2]])
        assert v.recv_counts[p].tolist() == [int((meta[:, 0] == e).sum()) for e in range(s.E_loc)]
        assert v.recv_out[p].shape == v.recv_rows[p].shape


def test_send_side_covers_every_remote_choice_of_rank0_once():
    s = _tiny()
    x0, _, _, v = _view(s)
    idx0 = v.routes0
    remote = idx0 >= s.E_loc
    assert torch.all((v.slot0 >= 0) == remote)
    for p in v.peers:
        meta = v.send_meta[p].long()
        assert torch.all(meta[:, 0] // s.E_loc == p)
        assert torch.equal(idx0[meta[:, 1], meta[:, 2]], meta[:, 0])
        assert torch.equal(v.slot0[meta[:, 1], meta[:, 2]].long(), torch.arange(meta.shape[0]))
        assert int(v.send_counts[p].sum()) == meta.shape[0]
        e = int(meta[0, 0])
        w1, w2 = mm.expert(s, e, "cpu", 3)
        rows = (meta[:, 0] == e).nonzero(as_tuple=True)[0]
        assert torch.equal(v.send_out[p][rows], expert_ffn_bf16(x0[meta[rows, 1]], w1, w2))
    assert sum(m.shape[0] for m in v.send_meta.values()) == int(remote.sum())


def test_rank0_output_from_the_view_matches_the_reference():
    """Own experts computed locally + the peers' precomputed outputs, folded in choice order,
    is the layer's output: the view holds everything rank 0 needs, for both scorings."""
    for kw in (dict(), dict(scoring="sigmoid", n_group=4, topk_group=2, scale=2.5, shared_F=64)):
        s = _tiny(**kw)
        assert s.validate() is None
        x0, Wr, bias, v = _view(s, seed=5)
        logits = x0.float() @ Wr.float().t()
        w = mm.weights_for(s, logits, v.routes0)
        W1, W2 = mm.local_experts(s, 0, "cpu", 5)
        y = torch.zeros(s.T, s.H)
        for j in range(s.topk):  # fold in choice order
            for t in range(s.T):
                e = int(v.routes0[t, j])
                if e < s.E_loc:
                    o = expert_ffn_bf16(x0[t:t + 1], W1[e], W2[e])[0]
                else:
                    o = v.send_out[s.owner(e)][int(v.slot0[t, j])]
                y[t] += w[t, j] * o.float()
        sh = mm.shared(s, "cpu", 5)
        if sh is not None:
            y += expert_ffn_bf16(x0, *sh).float()
        ref = mm.reference(s, 0, x0, v.routes0, "cpu", 5)
        wrong, _ = check_output(y.to(torch.bfloat16), ref, "bf16")
        assert wrong == 0


def test_a_near_tie_to_another_remote_expert_adds_nothing_and_is_not_an_error():
    """The view holds the peers' outputs for routes0 only: a routing that swaps one choice for
    another remote expert (a tie) finds no row, and absent() marks exactly that choice, which the
    reference then leaves out; a choice the view does hold stays in (dropping it is wrong)."""
    s = _tiny()
    x0, Wr, _, v = _view(s, seed=5)
    idx = v.routes0.clone()
    t, j = next((t, j) for t in range(s.T) for j in range(s.topk) if idx[t, j] >= s.E_loc)
    other = next(e for e in range(s.E_loc, s.E) if e not in idx[t].tolist())
    idx[t, j] = other
    absent = v.absent(idx)
    assert absent.sum() == 1 and absent[t, j]
    assert not v.absent(v.routes0).any()
    full = mm.reference(s, 0, x0, idx, "cpu", 5, Wr=Wr)
    left = mm.reference(s, 0, x0, idx, "cpu", 5, Wr=Wr, absent=absent)
    assert torch.equal(full[:t], left[:t]) and torch.equal(full[t + 1:], left[t + 1:])
    w = mm.weights_for(s, x0.float() @ Wr.float().t(), idx)[t, j]
    w1, w2 = mm.expert(s, other, "cpu", 5)
    torch.testing.assert_close(full[t] - left[t], w * mm.ffn(x0[t:t + 1], w1, w2)[0], rtol=1e-4, atol=1e-4)


def test_token_grads_of_an_absent_choice_are_those_of_a_zero_output():
    """moe_grad.token_grads(absent=): the gradients of the layer whose absent choices output 0
    (autograd through the fp32 layer with those outputs masked), the host view's near-tie."""
    from kosmos_bench.ops import moe_grad as mg

    s = _tiny(scoring="sigmoid", n_group=4, topk_group=2, scale=2.5)
    x0, Wr, _, v = _view(s, seed=5)
    idx = v.routes0.clone()
    t, j = next((t, j) for t in range(s.T) for j in range(s.topk) if idx[t, j] >= s.E_loc)
    idx[t, j] = next(e for e in range(s.E_loc, s.E) if e not in idx[t].tolist())
    absent = v.absent(idx)
    dy = torch.randn(s.T, s.H)
    got = mg.token_grads(s, x0, idx, dy, "cpu", 5, Wr, absent=absent)
    xf = x0.float().requires_grad_(True)
    Wf = Wr.float().requires_grad_(True)
    w = mm.weights_for(s, xf @ Wf.t(), idx) * (~absent).float()
    y = torch.zeros(s.T, s.H)
    for e in torch.unique(idx).tolist():
        tok, jj = (idx == e).nonzero(as_tuple=True)
        w1, w2 = mm.expert(s, e, "cpu", 5)
        y = y.index_add(0, tok, mm.ffn(xf[tok], w1, w2) * w[tok, jj, None])
    gx, gW = torch.autograd.grad(y, [xf, Wf], dy)
    torch.testing.assert_close(got["x"], gx, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got["Wr"], gW, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(mg.token_grads(s, x0, idx, dy, "cpu", 5, Wr)["x"][t], gx[t], rtol=1e-4, atol=1e-4)


def test_bytes_moved_count_rows_both_ways():
    s = _tiny(world=2, routing="uniform")
    _, _, _, v = _view(s)
    b = v.bytes_moved()
    row = s.H * 2
    assert b["dispatch_h2d"] == v.recv_meta[1].shape[0] * row == b["combine_d2h"]
    assert b["dispatch_d2h"] == v.send_meta[1].shape[0] * row == b["combine_h2d"]
    assert b["total"] == b["dispatch"] + b["combine"] > 0


def test_world_one_has_an_empty_view():
    s = _tiny(world=1)
    _, _, _, v = _view(s)
    assert v.peers == [] and v.bytes_moved()["total"] == 0 and torch.all(v.slot0 == -1)


def test_choices_for_is_sorted_and_owned():
    s = _tiny(world=2)
    idx = torch.tensor([[5, 0, 7], [1, 6, 0]])
    assert choices_for(s, idx, 1).tolist() == [[5, 0, 0], [6, 1, 1], [7, 0, 2]]
    assert choices_for(s, idx, 0).tolist() == [[0, 0, 1], [0, 1, 2], [1, 1, 0]]
