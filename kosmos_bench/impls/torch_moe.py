"""Plain-torch MoE layers (op `moe`): the pipeline a user writes, eager, compiled and overlapped.

Per rank: router GEMM (fp32 logits, as moe_math.route) and top-k -> argsort permute (rows
grouped by global expert, so by destination rank) -> dispatch (the rows for other ranks' experts
move; rank 0's own stay) -> regroup the received rows by local expert -> torch._grouped_mm
gate/up, SiLU*up in fp32 rounded to bf16, torch._grouped_mm down -> combine (the outputs move
back) -> unpermute -> the weighted fold over the k choices (a batched GEMM per token, fixed
order, fp32 accumulate; + the shared expert). No atomics anywhere: every step is bitwise
deterministic.

* ``torch-moe``          the steps back to back on one stream.
* ``torch-moe-compiled`` the same under torch.compile (world 1: the whole layer as one graph;
                         else router+permute, expert FFN (dynamic rows) and fold); the first
                         call (compile) is excluded from timing and reported as compile_s.
* ``torch-moe-overlap``  dispatch copies and expert GEMMs pipelined per source rank on two
                         streams (host and local fabrics): the FFN of rank q's rows runs while
                         the next rank's rows are moving, and each chunk's outputs move back
                         while the next chunk computes.

Fabrics: world 1 (no exchange); ``local`` (W ranks on one GPU, the exchange as device copies);
``host`` (rank 0 with the peers in pinned host memory, ops/moe_host.py: the same rows cross
PCIe as the kernel moves); ``nvlink`` / ``gloo`` (torch.distributed all_to_all_single, the
split sizes exchanged first: one host synchronisation per direction, as in every EP pipeline
built on it).
"""
from __future__ import annotations

import functools
import time

import torch
import torch._dynamo
import torch.nn.functional as Fn

from ..ops import moe_math as mm
from ..ops.moe import moe_shape
from ..point import Point
from .base import RankCtx, common_unsupported

# ----------------------------------------------------------------------------- the steps


class GatherRows(torch.autograd.Function):
    """rows[i] = x[order[i] // k] for a permutation `order` of the T*k (token, choice) rows: the
    forward is a gather; so is the backward (the inverse permutation, then a sum over each
    token's k rows in fixed order), where autograd's own would scatter-add (atomics on CUDA)."""

    @staticmethod
    def forward(ctx, x, order, k: int):
        ctx.save_for_backward(order)
        ctx.k = k
        return x.index_select(0, order // k if k > 1 else order)

    @staticmethod
    def backward(ctx, g):
        (order,) = ctx.saved_tensors
        gx = g.index_select(0, torch.argsort(order))
        if ctx.k > 1:
            gx = gx.view(-1, ctx.k, g.shape[1]).sum(1, dtype=torch.float32).to(g.dtype)
        return gx, None, None


def gather_rows(x, order, k: int = 1):
    return GatherRows.apply(x, order, k)


def combine_weights(s: mm.MoeShape, logits, idx):
    """mm.weights_for's weights; under autograd the chosen scores are picked by a one-hot
    product (its backward is a sum with one nonzero term: exact, no scatter), not by a gather."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return mm.weights_for(s, logits, idx)
    lg = logits.float()
    probs = torch.softmax(lg, dim=-1) if s.scoring == "softmax" else torch.sigmoid(lg)
    w = (Fn.one_hot(idx, s.E).to(probs.dtype) * probs.unsqueeze(1)).sum(-1)
    w = w / w.sum(-1, keepdim=True)
    return w if s.scoring == "softmax" else w * s.scale


def route(s: mm.MoeShape, x, Wr, bias):
    """(idx T x k, w T x k fp32): moe_math.route's selection and weights."""
    logits = x.float() @ Wr.float().t()
    idx = mm.selection_keys(s, logits.detach(), bias).topk(s.topk, dim=-1).indices
    return idx, combine_weights(s, logits, idx)


def permute(s: mm.MoeShape, x, idx):
    """(order, rows, counts): the T*k (token, choice) rows sorted by global expert (stable, so
    by (expert, token, j)), order[i] = the flat choice t*k+j of row i; counts (E,) per expert."""
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)
    return order, gather_rows(x, order, s.topk), torch.bincount(flat, minlength=s.E)


def ffn(rows, counts, W1, W2):
    """Grouped SwiGLU of rows grouped by local expert (counts (E_loc,) rows each)."""
    offs = torch.cumsum(counts, 0).to(torch.int32)
    F = W2.shape[2]
    gu = torch._grouped_mm(rows, W1.transpose(1, 2), offs=offs)
    h = (Fn.silu(gu[:, :F].float()) * gu[:, F:].float()).to(rows.dtype)
    return torch._grouped_mm(h, W2.transpose(1, 2), offs=offs)


def shared_ffn(x, shared):
    w1, w2 = shared
    F = w2.shape[1]
    gu = x @ w1.t()
    return (Fn.silu(gu[:, :F].float()) * gu[:, F:].float()).to(x.dtype) @ w2.t()


def fold(s: mm.MoeShape, order, ys, w, x, shared):
    """Unpermute the rows' outputs to (T, k) and sum w_tj * y_tj over j (+ the shared expert).

    One bf16 batched GEMM per token reads the k outputs once; the fp32 weights enter as a bf16
    pair (hi + lo, so the sum does not inherit bf16 rounding of the weights, whose error would
    scale with the terms rather than with their sum), summed in fp32 with the shared expert
    and rounded once."""
    T, k = w.shape
    out = torch.empty_like(ys)
    out[order] = ys  # a permutation: no duplicate indices
    hi = w.to(ys.dtype)
    z = torch.bmm(torch.stack([hi, (w - hi.float()).to(ys.dtype)], 1), out.view(T, k, -1))
    y = z[:, 0].float() + z[:, 1].float()
    if shared is not None:
        y += shared_ffn(x, shared).float()
    return y.to(ys.dtype)


def layer_world1(s: mm.MoeShape, x, Wr, bias, W1, W2, shared):
    idx, w = route(s, x, Wr, bias)
    order, xs, counts = permute(s, x, idx)
    return fold(s, order, ffn(xs, counts, W1, W2), w, x, shared), idx


def regroup_perm(chunk_counts: list, E_loc: int, device):
    """Rows received as chunks (one per source, each grouped by local expert; chunk_counts[c]
    (E_loc,) device tensors) -> (perm, counts): rows[perm] is grouped by local expert, sources
    in order within an expert."""
    ar = torch.arange(E_loc, device=device)
    eids = torch.cat([torch.repeat_interleave(ar, c) for c in chunk_counts])
    return torch.argsort(eids, stable=True), sum(chunk_counts)


# ----------------------------------------------------------------------------- the runner


class MoeRunner:
    """outputs[r] (T x H bf16) and routes[r] (T x k int32) written every call."""

    def __init__(self, p: Point, ctx: RankCtx, inputs, mode: str):
        self.s, self.ctx, self.inp, self.mode = moe_shape(p), ctx, inputs, mode
        s, dev = self.s, ctx.device
        self.ranks = ctx.ranks_here
        self.outputs = {r: torch.empty((s.T, s.H), dtype=torch.bfloat16, device=dev) for r in self.ranks}
        self.routes = {r: torch.empty((s.T, s.topk), dtype=torch.int32, device=dev) for r in self.ranks}
        self.info = {"collective": {"host": "copy-engine (PCIe, pinned host)", "local": "device copies",
                                    "nvlink": "nccl all_to_all_single", "gloo": "gloo all_to_all_single"}
                     .get(p.fabric) if s.world > 1 else None}
        self.view = inputs.host.get("view")
        self.streams = None
        if mode == "overlap" and dev.type == "cuda":
            self.streams = (torch.cuda.Stream(dev), torch.cuda.Stream(dev))
        self._front = functools.partial(_front, s)
        self._ffn, self._fold = ffn, functools.partial(fold, s)
        self._w1 = functools.partial(layer_world1, s)
        if mode == "compiled":
            torch._dynamo.reset()  # a fresh compile per point (its time is compile_s)
            self._front = torch.compile(self._front)
            self._ffn = torch.compile(ffn, dynamic=True)
            self._fold = torch.compile(self._fold)
            self._w1 = torch.compile(self._w1)
        if self.view is not None:
            vw = self.view
            self.recv_dev = {p_: torch.empty_like(vw.recv_rows[p_], device=dev) for p_ in vw.peers}
            self.recv_cnt = {p_: vw.recv_counts[p_].to(dev) for p_ in vw.peers}
            self.ys = torch.empty((s.T * s.topk, s.H), dtype=torch.bfloat16, device=dev)
        if mode == "compiled":
            t0 = time.perf_counter()
            self.run()
            ctx.sync()
            self.info["compile_s"] = time.perf_counter() - t0

    # one call ------------------------------------------------------------------------
    def run(self) -> None:
        s, inp = self.s, self.inp
        if s.world == 1:
            r = self.ranks[0]
            y, idx = self._w1(inp.x[r], self._wr(r), inp.bias, inp.W1[r], inp.W2[r], self._sh(r))
            self._store(r, y, idx)
        elif self.ctx.fabric == "local":
            self._local()
        elif self.ctx.fabric == "host":
            self._host()
        else:
            self._dist()

    def _store(self, r, y, idx):
        self.outputs[r].copy_(y)
        self.routes[r].copy_(idx)

    def _wr(self, r):
        """Rank r's router weights (the same tensor for every rank; the gradient runner gives each
        rank its own leaf, impls/torch_moe_grad.py); _sh(r): likewise the shared expert."""
        return self.inp.Wr

    def _sh(self, r):
        return self.inp.shared

    def _segments(self, counts_cpu):
        """Per destination rank q: (start, end) of its rows in a rank's permuted buffer."""
        n = counts_cpu.view(self.s.world, self.s.E_loc).sum(1).tolist()
        starts = [0]
        for v in n:
            starts.append(starts[-1] + v)
        return [(starts[q], starts[q + 1]) for q in range(self.s.world)]

    def _local(self) -> None:
        s, inp, W, El = self.s, self.inp, self.s.world, self.s.E_loc
        front = {r: self._front(inp.x[r], self._wr(r), inp.bias) for r in range(W)}  # idx, w, order, xs, counts
        counts = torch.stack([front[r][4] for r in range(W)]).cpu()  # one host sync: the split sizes
        seg = {r: self._segments(counts[r]) for r in range(W)}
        ccnt = {r: front[r][4].view(W, El) for r in range(W)}
        ys = {r: torch.empty_like(front[r][3]) for r in range(W)}
        if self.streams is None:
            for q in range(W):
                recv = torch.cat([front[r][3][seg[r][q][0]:seg[r][q][1]] for r in range(W)])  # dispatch
                perm, cnt = regroup_perm([ccnt[r][q] for r in range(W)], El, recv.device)
                yrecv = torch.empty_like(recv)
                yrecv[perm] = self._ffn(gather_rows(recv, perm), cnt, inp.W1[q], inp.W2[q])
                off = 0
                for r in range(W):  # combine
                    a, b = seg[r][q]
                    ys[r][a:b].copy_(yrecv[off:off + b - a])
                    off += b - a
        else:
            self._local_overlap(front, seg, ccnt, ys)
        for r in range(W):
            idx, w, order, _, _ = front[r]
            self._store(r, self._fold(order, ys[r], w, inp.x[r], self._sh(r)), idx)

    def _local_overlap(self, front, seg, ccnt, ys) -> None:
        """Chunk (source r, expert rank q): its rows copied on the copy stream while the
        previous chunk's FFN runs; its outputs copied back on the same stream."""
        s, inp, W = self.s, self.inp, self.s.world
        main, cs = torch.cuda.current_stream(), self.streams[0]
        cs.wait_stream(main)
        bufs, evs = {}, {}
        with torch.cuda.stream(cs):
            for q in range(W):
                for r in range(W):
                    a, b = seg[r][q]
                    bufs[q, r] = front[r][3][a:b].clone()  # the dispatch copy
                    evs[q, r] = torch.cuda.Event()
                    evs[q, r].record(cs)
        for q in range(W):
            for r in range(W):
                main.wait_event(evs[q, r])
                y = self._ffn(bufs[q, r], ccnt[r][q], inp.W1[q], inp.W2[q])
                a, b = seg[r][q]
                cs.wait_stream(main)
                with torch.cuda.stream(cs):
                    ys[r][a:b].copy_(y)  # the combine copy
                y.record_stream(cs)
                bufs[q, r].record_stream(main)
        main.wait_stream(cs)

    def _host(self) -> None:
        s, inp, vw, El = self.s, self.inp, self.view, self.s.E_loc
        idx, w, order, xs, counts = self._front(inp.x[0], self._wr(0), inp.bias)
        seg = self._segments(counts.cpu())  # the split sizes: one host sync
        for p_ in vw.peers:
            if seg[p_][1] - seg[p_][0] != vw.send_rows[p_].shape[0]:
                raise RuntimeError(f"rank 0's routing sends {seg[p_][1] - seg[p_][0]} rows to rank {p_}, the host "
                                   f"view {vw.send_rows[p_].shape[0]} (a near-tie decided the other way)")
        own = counts[:El]
        a0, b0 = seg[0]
        if self.streams is None:
            for p_ in vw.peers:  # dispatch: rank 0's rows out, the peers' rows in
                vw.send_rows[p_].copy_(xs[seg[p_][0]:seg[p_][1]], non_blocking=True)
                self.recv_dev[p_].copy_(vw.recv_rows[p_], non_blocking=True)
            recv = torch.cat([xs[a0:b0]] + [self.recv_dev[p_] for p_ in vw.peers])
            perm, cnt = regroup_perm([own] + [self.recv_cnt[p_] for p_ in vw.peers], El, recv.device)
            yrecv = torch.empty_like(recv)
            yrecv[perm] = self._ffn(gather_rows(recv, perm), cnt, inp.W1[0], inp.W2[0])
            self.ys[a0:b0].copy_(yrecv[:b0 - a0])
            off = b0 - a0
            for p_ in vw.peers:  # combine: the peers' outputs back, rank 0's from the peers in
                n = vw.recv_out[p_].shape[0]
                vw.recv_out[p_].copy_(yrecv[off:off + n], non_blocking=True)
                off += n
                self.ys[seg[p_][0]:seg[p_][1]].copy_(vw.send_out[p_], non_blocking=True)
        else:
            self._host_overlap(xs, seg, own)
        self._store(0, self._fold(order, self.ys, w, inp.x[0], self._sh(0)), idx)

    def _host_overlap(self, xs, seg, own) -> None:
        """H2D pulls (peers' rows, then the peers' outputs) on one copy stream, D2H pushes on
        another; the FFN of rank 0's own rows first, then each peer's as its rows land."""
        inp, vw = self.inp, self.view
        main = torch.cuda.current_stream()
        pull, push = self.streams
        pull.wait_stream(main)
        push.wait_stream(main)
        arrived = {}
        with torch.cuda.stream(pull):
            for p_ in vw.peers:
                self.recv_dev[p_].copy_(vw.recv_rows[p_], non_blocking=True)
                arrived[p_] = torch.cuda.Event()
                arrived[p_].record(pull)
            for p_ in vw.peers:
                self.ys[seg[p_][0]:seg[p_][1]].copy_(vw.send_out[p_], non_blocking=True)
        with torch.cuda.stream(push):
            for p_ in vw.peers:
                vw.send_rows[p_].copy_(xs[seg[p_][0]:seg[p_][1]], non_blocking=True)
        xs.record_stream(push)
        a0, b0 = seg[0]
        self.ys[a0:b0].copy_(self._ffn(xs[a0:b0], own, inp.W1[0], inp.W2[0]))
        for p_ in vw.peers:
            main.wait_event(arrived[p_])
            y = self._ffn(self.recv_dev[p_], self.recv_cnt[p_], inp.W1[0], inp.W2[0])
            push.wait_stream(main)
            with torch.cuda.stream(push):
                vw.recv_out[p_].copy_(y, non_blocking=True)
            y.record_stream(push)
        main.wait_stream(pull)
        main.wait_stream(push)

    def _dist(self) -> None:
        import torch.distributed as dist

        s, inp, r, W, El = self.s, self.inp, self.ctx.rank, self.s.world, self.s.E_loc
        g = self.ctx.group
        idx, w, order, xs, counts = self._front(inp.x[r], self._wr(r), inp.bias)
        send_c = counts.view(W, El).contiguous()
        recv_c = torch.empty_like(send_c)
        dist.all_to_all_single(recv_c, send_c, group=g)
        both = torch.stack([send_c.sum(1), recv_c.sum(1)]).cpu().tolist()  # the split sizes: one host sync
        recv = self._a2a(xs.new_empty((sum(both[1]), s.H)), xs, both[1], both[0])
        perm, cnt = regroup_perm(list(recv_c), El, recv.device)
        yrecv = torch.empty_like(recv)
        yrecv[perm] = self._ffn(gather_rows(recv, perm), cnt, inp.W1[r], inp.W2[r])
        ys = self._a2a(torch.empty_like(xs), yrecv, both[0], both[1])
        self._store(r, self._fold(order, ys, w, inp.x[r], self._sh(r)), idx)

    def _a2a(self, out, inp, out_splits, in_splits):
        """all_to_all_single of rows (the gradient runner's is differentiable)."""
        import torch.distributed as dist

        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.ctx.group)
        return out

    def close(self) -> None:
        pass


def _front(s, x, Wr, bias):
    idx, w = route(s, x, Wr, bias)
    order, xs, counts = permute(s, x, idx)
    return idx, w, order, xs, counts


# ----------------------------------------------------------------------------- the family


class TorchMoe:
    ops = ("moe", "moe-bwd", "moe-step")  # the backward ops: impls/torch_moe_grad.py registers the family
    fabrics = ("local", "host", "nvlink", "gloo")

    def __init__(self, name: str, mode: str):
        self.name, self.mode = name, mode

    def available(self, backend: str) -> tuple[bool, str]:
        if backend == "gpu" and not torch.cuda.is_available():
            return False, "no CUDA device"
        if not hasattr(torch, "_grouped_mm"):
            return False, f"torch {torch.__version__} has no torch._grouped_mm"
        return True, ""

    def unsupported(self, p: Point) -> str | None:
        why = common_unsupported(self, p)
        if why:
            return why
        if self.mode == "overlap":
            if p.world == 1:
                return "torch-moe-overlap: nothing to overlap at world 1 (no dispatch; it is torch-moe)"
            if p.fabric not in ("host", "local"):
                return f"torch-moe-overlap pipelines device/host copies: host and local fabrics (fabric={p.fabric})"
            if p.backend != "gpu":
                return "torch-moe-overlap needs CUDA streams (backend gpu)"
            if p.op != "moe" and p.fabric == "host":
                return (f"torch-moe-overlap {p.op} on the host fabric: its pipelined pinned copies have no autograd "
                        "path (torch-moe's serial host exchange has one)")
        if p.fabric == "nvlink" and p.backend == "gpu" and p.world > 1:
            from .. import sharing

            if sharing.is_shared(p):
                return sharing.needs_nccl_reason(self.name)
        return None

    def prepare(self, p: Point, ctx: RankCtx, inputs) -> MoeRunner:
        return MoeRunner(p, ctx, inputs, self.mode)


IMPLS = [TorchMoe("torch-moe", "eager"), TorchMoe("torch-moe-compiled", "compiled"),
         TorchMoe("torch-moe-overlap", "overlap")]
