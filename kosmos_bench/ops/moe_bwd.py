"""The MoE expert layer's backward (op `moe-bwd`) and training step (op `moe-step`).

Same layer, points, fabrics, inputs and columns as op `moe` (ops/moe.py; a subclass of it), plus
each rank's output gradient dy_r (moe_grad.output_grad, seeded like the inputs):

* ``moe-bwd``: the backward alone. The implementation runs the forward once while preparing
  (its saved state, routes included, made outside the timing) and each call computes, from
  dy_r, every gradient of its ranks: dx_r (T x H), dWr_r (E x H: rank r's tokens' share of the
  replicated router's gradient), dW1_r / dW2_r (E_loc x 2F x H / E_loc x H x F: rank r's experts,
  every rank's rows routed to them summed in rank order: the owner's gradient, as expert
  parallelism leaves it) and the shared expert's dWs1_r / dWs2_r (rank r's share).
* ``moe-step``: forward + backward per call (the output y_r and routes too): a training step's
  MoE layer, optimizer excluded.

Check (outputs NaN, routes -1 before each checked call; moe-bwd's routes are the forward's,
written once): routes against the reference routing (routing_mismatches), y (moe-step) as op moe,
and every gradient within GRAD_RTOL of moe_grad's fp32 reference run with the implementation's
routes (the peers' reference routing for ranks that are not here: host view, one process per
rank), each tensor (each expert's) against its own rms; bitwise equal over two calls.
`wrong` = mismatched tokens + elements outside the tolerance.

Counts (the convention): the backward's FLOPs are 2x the forward's GEMM FLOPs (a dgrad and a
wgrad per forward GEMM, router and shared expert included; nothing recomputed counted), so
moe-bwd = 2x and moe-step = 3x op moe's; the compute bound is a dense cuBLAS GEMM of that many
FLOPs (ops/moe.py's alone / derive). The backward moves the same rows as the forward (the
output gradients out to the experts' owners, the input gradients back): dispatch_bytes /
combine_bytes are per pass, times the passes of the op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..point import Point
from . import moe_grad as mg
from . import moe_math as mm
from .base import check_output
from .moe import MOE_RTOL, Moe, moe_shape

# Gradient tolerance (check_output's rtol, per tensor): the forward's MOE_RTOL. The backward's
# bf16 chain is the forward's mirrored: the upstream rows w*dy and dh rounded to bf16 ahead of
# the down projection's dgrad (H terms), [dg|du] rounded ahead of the gate/up dgrad (2F terms,
# cancelling like the forward's down projection) and the wgrads (sums over the expert's rows);
# dx adds k such rows per token in bf16. A wrong expert, a missing row or a dropped choice is off
# by O(rms) and still fails. Measured on the cpu backend (tiny presets): within 2e-2;
# tests/test_moe_bwd_gpu.py records max_rel_err on the presets.
GRAD_RTOL = MOE_RTOL
GRADS = ("dx", "dWr", "dW1", "dW2", "dWs1", "dWs2")


@dataclass
class MoeGradInputs(mm.MoeInputs):
    """MoeInputs plus dy[r] (T x H bf16) for this process's ranks."""

    dy: dict = field(default_factory=dict)


def grad_buffers(s: mm.MoeShape, ranks: list[int], device) -> dict:
    """{name: {rank: empty tensor}} of GRADS (the shared expert's only when there is one)."""
    shapes = {"dx": (s.T, s.H), "dWr": (s.E, s.H), "dW1": (s.E_loc, 2 * s.F, s.H), "dW2": (s.E_loc, s.H, s.F)}
    if s.shared_F:
        shapes.update(dWs1=(2 * s.shared_F, s.H), dWs2=(s.H, s.shared_F))
    return {n: {r: torch.empty(sh, dtype=torch.bfloat16, device=device) for r in ranks} for n, sh in shapes.items()}


class MoeBwd(Moe):
    name = "moe-bwd"
    fwd = 0  # forward passes per call (moe-step: 1)

    def flops(self, p: Point) -> float:
        return (self.fwd + 2) * super().flops(p)

    def bound_flops(self, p: Point) -> float:
        return (self.fwd + 2) * super().bound_flops(p)

    def comm_bytes(self, p: Point) -> float:
        return (self.fwd + 1) * super().comm_bytes(p)

    def setup(self, p: Point, ranks: list[int], device, seed: int):
        inputs, state = super().setup(p, ranks, device, seed)
        s = moe_shape(p)
        dy = {r: mg.output_grad(s, r, device, seed) for r in inputs.x}
        inputs = MoeGradInputs(**vars(inputs), dy=dy)
        for k in ("dispatch_bytes", "combine_bytes"):
            state.columns[k] *= self.fwd + 1
        if p.fabric == "host" and s.world > 1:
            from .moe_host_bwd import add_grad_view

            add_grad_view(inputs.host["view"], s, inputs.x[0], dy[0], inputs.Wr, device, seed)
        return inputs, state

    def poison(self, runner) -> None:
        for bufs in runner.grads.values():
            for t in bufs.values():
                t.fill_(float("nan"))
        if self.fwd:
            super().poison(runner)

    def snapshot(self, runner) -> dict:
        snap = {n: {r: t.clone() for r, t in bufs.items()} for n, bufs in runner.grads.items()}
        snap["routes"] = {r: i.clone() for r, i in runner.routes.items()}
        if self.fwd:
            snap["out"] = {r: o.clone() for r, o in runner.outputs.items()}
        return snap

    def compare(self, p: Point, ranks: list[int], snap: dict, inputs, state) -> dict:
        s = moe_shape(p)
        if self.fwd:  # y and the routes, as op moe
            res = super().compare(p, ranks, snap, inputs, state)
        else:
            res = {"wrong": 0, "max_rel_err": 0.0, "route_mismatches": 0}
            for r in ranks:
                keys = mm.route(s, inputs.x[r], inputs.Wr, inputs.bias)[2]
                m = mm.routing_mismatches(s, snap["routes"][r], keys)
                res["wrong"] += m
                res["route_mismatches"] += m
        errs = dict.fromkeys(("dx", "dWr", "dW", "dWs"), 0.0)

        def check(got, ref, kind):
            w, e = check_output(got, ref, "bf16", rtol=GRAD_RTOL)
            res["wrong"] += w
            errs[kind] = max(errs[kind], e)

        parts = rank_parts(s, ranks, snap["routes"], inputs, state.seed)
        dev = inputs.Wr.device
        for r in ranks:
            x, idx, _, dy = parts[r]
            view = inputs.host.get("view") if r == 0 else None  # near-ties: moe_host.MoeHostView.absent
            ref = mg.token_grads(s, x, idx, dy, dev, state.seed, inputs.Wr,
                                 absent=view.absent(idx) if view is not None else None)
            check(snap["dx"][r], ref["x"], "dx")
            check(snap["dWr"][r], ref["Wr"], "dWr")
            if ref["shared"] is not None:
                check(snap["dWs1"][r], ref["shared"][0], "dWs")
                check(snap["dWs2"][r], ref["shared"][1], "dWs")
            del ref
            for le in range(s.E_loc):
                d1, d2 = mg.expert_grads(s, r * s.E_loc + le, parts, dev, state.seed)
                check(snap["dW1"][r][le], d1, "dW")
                check(snap["dW2"][r][le], d2, "dW")
        res["max_rel_err"] = max(res["max_rel_err"], *errs.values())
        res.update({f"max_rel_err_{k}": v for k, v in errs.items()})
        return res


class MoeStep(MoeBwd):
    name = "moe-step"
    fwd = 1


def rank_parts(s: mm.MoeShape, ranks: list[int], routes: dict, inputs, seed: int) -> list:
    """[(x, idx, combine weights, dy) of rank r for r in 0..W-1]: the ranks here with the
    implementation's routes, the others (host view peers, other processes) made from the seed
    with the reference routing, as the peers' data is."""
    dev = inputs.Wr.device
    parts = []
    for r in range(s.world):
        if r in ranks:
            x, dy = inputs.x[r], inputs.dy[r]
            idx = routes.get(r)
            if idx is None:
                raise ValueError(f"moe implementation returned no routes for rank {r}")
            idx = idx.long().clamp(0, s.E - 1)
        else:
            x, dy = mm.tokens(s, r, dev, seed), mg.output_grad(s, r, dev, seed)
            idx = mm.route(s, x, inputs.Wr, inputs.bias)[0]
        parts.append((x, idx, mg.combine_weights(s, x, inputs.Wr, idx), dy))
    return parts


MOE_BWD, MOE_STEP = MoeBwd(), MoeStep()
