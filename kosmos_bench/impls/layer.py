"""The `layer` op's runner: one TP+SP layer step (ops/layer.py) built from one family's ops.

The step is the same sequence for every family: ten collective GEMMs as sub-op runners of the
family (``kosmos``: the KOSMOS kernels; ``nccl-seq`` / ``nccl-overlap``: those baselines),
torch for the rest (SDPA forward and backward, SwiGLU, residual adds, and the two row-parallel
wgrads that reuse the dgrad's gathered gradient). Sub-op inputs are persistent buffers the
step writes in place before each sub-op runs (the kernels hold their addresses).

The two ag-wgrad sub-ops (dW1, dWqkv) write straight into the packed weight gradient (kosmos:
its runner's ``out``); the row's ``layer_ops`` column says which family ran each op.

Fabrics. gloo / nvlink: one process per rank, real collectives. local: all W ranks in this
process (kosmos only). host (rank-0 view on one GPU): only rank 0 computes; the peers' side of
every collective (their shards for the all-gathers, their partial sums for band 0 of the
reduce-scatters) is what a bf16 emulation of all W ranks computed once in prepare, held in
pinned host memory and moved over PCIe as in the single ops: the peers' compute is not run,
and the step time is rank 0's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops import get_op
from ..ops.base import RankInputs
from ..ops.layer import WIRING, LayerShape, attention, shape_of, sub_point, swiglu, swiglu_grad, unpack
from ..point import Point
from .base import RankCtx

def unsupported(p: Point, impl=None) -> str | None:
    """Why a family's layer step cannot run this point (the family's op/fabric coverage, its
    sub-ops' reasons), else None."""
    from . import get_impl
    from .base import common_unsupported

    why = (common_unsupported(impl, p) if impl is not None else None) or get_op("layer").validate(p)
    if why:
        return why
    s = shape_of(p)
    for name in s.gemms():
        q = sub_point(p, name, s)
        if q.impl == "torch":
            continue
        why = get_impl(q.impl).unsupported(q)
        if why:
            return f"layer {name} ({q.op}, {q.impl}): {why}"
    return None


def _rank_buffers(A: dict, s: LayerShape, device, dt) -> dict:
    """A rank's step buffers: its inputs (X, dY, weights) and every intermediate a sub-op reads."""
    T, t = s.T, s.t
    b = dict(A)
    for name, shape in (("attn", (T, s.nq)), ("Y1", (t, s.H)), ("a", (T, s.f)), ("dU", (T, 2 * s.f)),
                        ("dY1", (t, s.H)), ("dQKV", (T, s.nqkv))):
        b[name] = torch.zeros(shape, dtype=dt, device=device)
    return b


def _operand(b: dict, name: str) -> torch.Tensor:
    return b[name[:-2]].t() if name.endswith(".t") else b[name]


class TorchSub:
    """A sub-op in plain torch over the ranks whose operands it holds. ``emulate``: the real op
    (all-gather = concatenation, reduce-scatter = sum over ranks in rank order, fp32); else
    'compute only': the same GEMM on local data (gathered operands = this rank's shard repeated),
    no communication: the step's compute floor."""

    def __init__(self, op: str, inputs: RankInputs, ranks: list[int], world: int, emulate: bool, out=None):
        self.op, self.inputs, self.ranks, self.W, self.emulate = get_op(op).base, inputs, ranks, world, emulate
        self.outputs, self.gathered, self.out = {}, {}, out or {}
        A = inputs.A
        if not emulate:  # the gathered operand, made once (its values do not matter)
            for r in ranks:
                if self.op in ("ag-gemm", "ag-wgrad"):
                    self.gathered[r] = A[r].repeat(world, 1)

    def _full(self, r):
        return self.gathered[r]

    def run(self) -> None:
        A, B, W = self.inputs.A, self.inputs.B, self.W
        if self.emulate and self.op in ("ag-gemm", "ag-wgrad"):
            full = torch.cat([A[p] for p in range(W)])
            self.gathered = {r: full for r in self.ranks}
        for r in self.ranks:
            if self.op == "ag-gemm":
                self.outputs[r] = self._full(r) @ B[r]
            elif self.op == "ag-wgrad":
                o = self.out.get(r)
                self.outputs[r] = torch.matmul(self._full(r).t(), B[r], out=o) if o is not None else \
                    self._full(r).t() @ B[r]
            else:  # gemm-rs: band r of sum_p A_p @ B_p
                m = A[r].shape[0] // W
                if self.emulate:
                    acc = sum((A[p][r * m:(r + 1) * m].float() @ B[p].float() for p in range(W)))
                    self.outputs[r] = acc.to(A[r].dtype)
                else:
                    self.outputs[r] = (A[r] @ B[r])[r * m:(r + 1) * m]

    def close(self) -> None:
        pass


@dataclass
class StepBuffers:
    bufs: dict  # rank -> buffers (_rank_buffers)
    outs: dict  # rank -> packed outputs (flat) ; views by unpack
    subs: dict  # sub-op name -> runner over the ranks here
    sub_inputs: dict  # sub-op name -> RankInputs
    sub_points: dict  # sub-op name -> Point


class LayerStep:
    """One step over `ranks` (the ranks this process computes). Runner interface: run, outputs, close."""

    def __init__(self, s: LayerShape, ranks: list[int], st: StepBuffers, deterministic_sdpa: bool):
        self.s, self.ranks, self.st = s, ranks, st
        self.outputs = st.outs
        self.views = {r: unpack(st.outs[r], s) for r in ranks}
        self.det = deterministic_sdpa
        self.info: dict = {}

    def _gathered(self, name: str, r: int, own: torch.Tensor) -> torch.Tensor:
        g = self.st.subs[name].gathered[r]
        m = own.shape[0]
        g[r * m:(r + 1) * m].copy_(own)  # kosmos reads its own band from A_r: not in its gathered buffer
        return g

    def run(self) -> None:
        s, S, R = self.s, self.st.subs, self.ranks
        b, o = self.st.bufs, self.views
        T, d = s.T, s.head_dim
        hq, hkv = s.nq // d, s.nkv // d
        S["qkv"].run()
        att = {}
        for r in R:
            att[r] = attention(S["qkv"].outputs[r], s)
            b[r]["attn"].view(T, hq, d).copy_(att[r][3].detach().squeeze(0).transpose(0, 1))
        S["out"].run()
        for r in R:
            torch.add(b[r]["X"], S["out"].outputs[r], out=b[r]["Y1"])
        S["fc1"].run()
        for r in R:
            b[r]["a"].copy_(swiglu(S["fc1"].outputs[r]))
        S["fc2"].run()
        for r in R:
            torch.add(b[r]["Y1"], S["fc2"].outputs[r], out=o[r]["Y"])
        # backward
        S["fc2.dgrad"].run()
        for r in R:
            torch.mm(b[r]["a"].t(), self._gathered("fc2.dgrad", r, b[r]["dY"]), out=o[r]["dW2"])
            swiglu_grad(S["fc1"].outputs[r], S["fc2.dgrad"].outputs[r], b[r]["dU"])
        S["fc1.dgrad"].run()
        S["fc1.wgrad"].run()  # -> dW1 (its out)
        for r in R:
            torch.add(b[r]["dY"], S["fc1.dgrad"].outputs[r], out=b[r]["dY1"])
        S["out.dgrad"].run()
        for r in R:
            torch.mm(b[r]["attn"].t(), self._gathered("out.dgrad", r, b[r]["dY1"]), out=o[r]["dWo"])
            q, k, v, out = att[r]
            do = S["out.dgrad"].outputs[r].view(T, hq, d).transpose(0, 1).unsqueeze(0)
            dq, dk, dv = _sdpa_grad(out, (q, k, v), do, self.det)
            g = b[r]["dQKV"]
            g[:, :s.nq].view(T, hq, d).copy_(dq.squeeze(0).transpose(0, 1))
            g[:, s.nq:s.nq + s.nkv].view(T, hkv, d).copy_(dk.squeeze(0).transpose(0, 1))
            g[:, s.nq + s.nkv:].view(T, hkv, d).copy_(dv.squeeze(0).transpose(0, 1))
        S["qkv.dgrad"].run()
        S["qkv.wgrad"].run()  # -> dWqkv (its out)
        for r in R:
            torch.add(b[r]["dY1"], S["qkv.dgrad"].outputs[r], out=o[r]["dX"])

    def check(self) -> None:
        for sub in self.st.subs.values():
            if hasattr(sub, "check"):
                sub.check()

    def close(self) -> None:
        for sub in self.st.subs.values():
            sub.close()
        self.st.subs.clear()


def _sdpa_grad(out, leaves, do, deterministic: bool):
    """SDPA's backward; on a GPU with the deterministic kernels (flash attention's backward
    accumulates dQ with atomics otherwise), so that the step is bitwise repeatable."""
    if not deterministic:
        return torch.autograd.grad(out, leaves, do)
    prev, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)  # warn_only would keep flash's atomic dQ (measured: not repeatable)
    try:
        return torch.autograd.grad(out, leaves, do)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=warn)


def _build(p: Point, ctx: RankCtx, s: LayerShape, ranks: list[int], bufs: dict, peer_bufs: dict | None,
           mode: str) -> StepBuffers:
    """Sub-op runners over `ranks` whose operands are bufs' (and peer_bufs' for the host fabric's
    peers). mode: 'real' (the family's ops), 'emulate' (torch, all ranks), 'compute' (torch, no comm)."""
    from . import get_impl
    from . import nccl as nccl_impls

    dt = next(iter(bufs.values()))["X"].dtype
    outs = {r: torch.empty(s.packed_size(), dtype=dt, device=ctx.device) for r in ranks}
    wgrad_out = {"fc1.wgrad": "dW1", "qkv.wgrad": "dWqkv"}
    subs, sub_inputs, points = {}, {}, {}
    for name, (a, bname) in WIRING.items():
        q = sub_point(p, name, s)
        src = {**(peer_bufs or {}), **bufs}
        inp = RankInputs({r: _operand(src[r], a) for r in src}, {r: _operand(src[r], bname) for r in src})
        out = {r: unpack(outs[r], s)[wgrad_out[name]] for r in ranks} if name in wgrad_out else None
        if mode != "real" or q.impl == "torch":
            subs[name] = TorchSub(q.op, inp, ranks, p.world, emulate=mode != "compute", out=out)
        elif q.op == "ag-wgrad" and q.impl == "kosmos":  # C_r is the packed gradient itself
            subs[name] = get_impl(q.impl).prepare(q, ctx, inp, out=out)
        elif q.op == "ag-wgrad":  # a baseline's, writing straight into the packed gradient
            subs[name] = nccl_impls._ag_wgrad(q, ctx, inp, q.impl == "nccl-overlap", out=out[ctx.rank])
        else:
            subs[name] = get_impl(q.impl).prepare(q, ctx, inp)
        sub_inputs[name], points[name] = inp, q
    return StepBuffers(bufs, outs, subs, sub_inputs, points)


def prepare(p: Point, ctx: RankCtx, inputs) -> LayerStep:
    """The family's layer step (p.impl) for the ranks this process computes."""
    s = shape_of(p)
    here = ctx.ranks_here
    dt = next(iter(inputs.A.values()))["X"].dtype
    peer_bufs = None
    if p.fabric == "host":  # the peers' side of every collective: a bf16 emulation of all ranks, once
        emu_bufs = {r: _rank_buffers(inputs.A[r], s, ctx.device, dt) for r in range(p.world)}
        emu = LayerStep(s, list(range(p.world)), _build(p, ctx, s, list(range(p.world)), emu_bufs, None, "emulate"),
                        deterministic_sdpa=ctx.device.type == "cuda")
        emu.run()
        peer_bufs = {r: emu_bufs[r] for r in range(1, p.world)}
    bufs = {r: _rank_buffers(inputs.A[r], s, ctx.device, dt) for r in here}
    st = _build(p, ctx, s, here, bufs, peer_bufs, "real")
    step = LayerStep(s, here, st, deterministic_sdpa=ctx.device.type == "cuda")
    if peer_bufs is not None:  # the sub-runners made their pinned copies; rank 0 keeps its own operands
        from . import nccl as nccl_impls

        for name, inp in st.sub_inputs.items():  # the pinned peers' data of each collective alone (comm_alone)
            nccl_impls.host_peers(st.sub_points[name], ctx, inp)
        for inp in st.sub_inputs.values():
            inp.A, inp.B = {r: inp.A[r] for r in here}, {r: inp.B[r] for r in here}
        del emu, emu_bufs, peer_bufs
    inputs.host["layer_step"] = st
    step.info = {"layer_ops": ";".join(f"{n}={q.impl}" for n, q in st.sub_points.items()),
                 "layer_host_view": "rank 0 computes; peers' shards / partials precomputed, moved over PCIe"
                 if p.fabric == "host" else None}
    return step


def gemm_alone(p: Point, ctx: RankCtx, inputs):
    """The same step with every collective removed (local GEMMs of the same sizes): the compute floor."""
    s = shape_of(p)
    here = ctx.ranks_here
    dt = next(iter(inputs.A.values()))["X"].dtype
    bufs = {r: _rank_buffers(inputs.A[r], s, ctx.device, dt) for r in here}
    step = LayerStep(s, here, _build(p, ctx, s, here, bufs, None, "compute"), deterministic_sdpa=ctx.device.type == "cuda")
    return step.run


def comm_alone(p: Point, ctx: RankCtx, inputs):
    """The step's ten collectives alone, one after another, on the family's fabric (None on local)."""
    from . import nccl as nccl_impls

    st = inputs.host.get("layer_step")
    if st is None or p.fabric == "local" or ctx.shared_gpu:
        return None
    fns = [nccl_impls.comm_alone(st.sub_points[n], ctx, st.sub_inputs[n]) for n in WIRING]
    if any(f is None for f in fns):
        return None

    def all_comm():
        for f in fns:
            f()
    return all_comm
