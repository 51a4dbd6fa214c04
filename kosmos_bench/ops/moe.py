"""MoE expert layer forward (expert parallel): router -> dispatch -> expert FFNs -> combine -> fold.

The layer, its inputs, routing and fp32 reference are moe_math's; this module makes it an op of
the harness: the shape of a Point (`moe_shape`), validation, counts, inputs (with the host
fabric's rank-0 view, moe_host.py), the op-level check and the dense-GEMM compute bound.

Check (every implementation; outputs poisoned with NaN and routes with -1 before each call):
routing_mismatches(...) == 0 for each rank's routes, the output within bf16 RTOL of
moe_math.reference() run with the implementation's own routes, and outputs and routes bitwise
identical across two calls. `wrong` = mismatched tokens + elements outside the tolerance.

Counts: flops() is all ranks together (as the TP ops'), so TFLOP/s and tokens/s are the whole
layer's; `bound_flops` is what this GPU computes (W ranks on the local fabric, one otherwise),
timed against one dense cuBLAS GEMM of about those FLOPs in the same point (t_bound_us).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..point import Point
from . import moe_math as mm
from .base import Op, check_output

DEFAULT_PRESET = "deepseek-v3"
# The layer's tolerance (check_output's rtol: |out - ref| <= MOE_RTOL * (|ref| + rms(ref))). Wider
# than a GEMM's bf16 2e-2: bf16 implementations round gate/up and the hidden activation before
# a down projection of F = 1536-2048 terms that can cancel, so an element's error scales with
# its terms, not with its value. Measured on the H200 with torch-moe (torch._grouped_mm, bf16
# gate/up): up to 0.06 x rms on 1-7 of 33-58M elements per point (qwen3-235b-a22b, T 8192);
# a wrong expert, a missing choice or an unwritten row is off by O(rms) and still fails.
MOE_RTOL = 8e-2


def moe_shape(p: Point) -> mm.MoeShape:
    """The layer of a moe point: preset p.moe, T = p.M tokens per rank, p.experts per rank."""
    return mm.preset(p.moe or DEFAULT_PRESET, T=p.M, world=p.world, routing=p.routing or "uniform",
                     E_loc=p.experts)


def preset_point_dims(name: str, tokens: int) -> dict:
    """The Point fields M, N, K of a preset at `tokens` per rank (M = T, N = F, K = H)."""
    s = mm.preset(name, T=tokens)
    return {"M": tokens, "N": s.F, "K": s.H}


@dataclass
class MoeState:
    """What the check and the columns need besides the inputs."""

    seed: int
    columns: dict


def rank_stats(s: mm.MoeShape, routes: dict[int, torch.Tensor]) -> dict:
    """Columns from every rank's routing: tokens per expert (max/mean over the E experts, all
    ranks' tokens) and the bytes rank 0 moves per call (rows it sends to other ranks' experts
    plus rows it receives for its own; the combine moves the same rows back)."""
    counts = sum(mm.expert_counts(s, idx).cpu() for idx in routes.values())
    row = s.H * 2  # bf16
    idx0 = routes[0].long().cpu()
    sent = int((idx0 >= s.E_loc).sum())
    recv = sum(int((idx.long() < s.E_loc).sum()) for r, idx in routes.items() if r != 0)
    return {"tok_per_expert_max": int(counts.max()), "tok_per_expert_mean": float(counts.float().mean()),
            "dispatch_bytes": (sent + recv) * row, "combine_bytes": (sent + recv) * row}


class Moe(Op):
    name = "moe"
    collective = "all_to_all"

    def validate(self, p: Point) -> str | None:
        if p.moe is None:
            return f"op {self.name} needs a preset (Point.moe; sweep key moe: {{presets: [...]}})"
        try:
            s = moe_shape(p)
        except (KeyError, ValueError) as e:
            return str(e.args[0])
        if p.dtype != "bf16":
            return f"op {self.name} is bf16 only (dtype={p.dtype})"
        if (p.N, p.K) != (s.F, s.H):
            return f"moe preset {p.moe}: N, K must be its FFN width {s.F} and hidden size {s.H}, got {p.N}, {p.K}"
        return s.validate()

    def shape(self, p: Point) -> mm.MoeShape:
        return moe_shape(p)

    def flops(self, p: Point) -> float:
        return moe_shape(p).flops() * p.world

    def bound_flops(self, p: Point) -> float:
        """FLOPs this GPU computes: every rank's on the local fabric, rank 0's otherwise."""
        return moe_shape(p).flops() * (p.world if p.fabric == "local" else 1)

    def tokens(self, p: Point) -> int:
        return p.M * p.world

    def comm_bytes(self, p: Point) -> float:
        """nccl-tests' all-to-all size: one rank's dispatch buffer (T*k rows); busbw counts the
        (W-1)/W of it that leaves the rank (uniform routing). The measured bytes of a point are
        its dispatch_bytes / combine_bytes columns."""
        s = moe_shape(p)
        return float(s.T * s.topk * s.H * 2)

    # ------------------------------------------------------------------ harness hooks
    def setup(self, p: Point, ranks: list[int], device, seed: int):
        """(MoeInputs, MoeState). Host fabric: rank 0's share plus the rank-0 view."""
        s = moe_shape(p)
        if p.fabric == "host":
            ranks = [0]
        inputs = mm.make_inputs(s, ranks, device, seed)
        routes = {}
        for r in range(s.world):  # reference routing of every rank, for the columns
            x = inputs.x[r] if r in inputs.x else mm.tokens(s, r, device, seed)
            routes[r] = mm.route(s, x, inputs.Wr, inputs.bias)[0]
            del x
        cols = rank_stats(s, routes)
        if p.fabric == "host" and s.world > 1:
            from .moe_host import make_view

            view = inputs.host["view"] = make_view(s, inputs.x[0], inputs.Wr, inputs.bias, device, seed)
            b = view.bytes_moved()
            cols.update(dispatch_bytes=b["dispatch"], combine_bytes=b["combine"])
        return inputs, MoeState(seed, cols)

    def poison(self, runner) -> None:
        for out in runner.outputs.values():
            out.fill_(float("nan"))
        for idx in getattr(runner, "routes", {}).values():
            idx.fill_(-1)

    def snapshot(self, runner) -> dict:
        return {"out": {r: o.clone() for r, o in runner.outputs.items()},
                "routes": {r: i.clone() for r, i in getattr(runner, "routes", {}).items()}}

    def compare(self, p: Point, ranks: list[int], snap: dict, inputs, state: MoeState) -> dict:
        """wrong = tokens routed off the reference (beyond a tie) + output elements outside the
        tolerance of the reference run with the implementation's routes."""
        s = moe_shape(p)
        wrong, err, mism = 0, 0.0, 0
        for r in ranks:
            idx = snap["routes"].get(r)
            if idx is None:
                raise ValueError(f"moe implementation returned no routes for rank {r}")
            x = inputs.x[r]
            keys = mm.route(s, x, inputs.Wr, inputs.bias)[2]
            m = mm.routing_mismatches(s, idx, keys)
            idx = idx.long().clamp(0, s.E - 1)
            view = inputs.host.get("view") if r == 0 else None
            absent = view.absent(idx) if view is not None else None  # near-ties the view has no output for
            ref = mm.reference(s, r, x, idx, x.device, state.seed, Wr=inputs.Wr, absent=absent)
            w, e = check_output(snap["out"][r], ref, "bf16", rtol=MOE_RTOL)
            wrong, err, mism = wrong + w + m, max(err, e), mism + m
        return {"wrong": wrong, "max_rel_err": err, "route_mismatches": mism}

    def columns(self, p: Point, state: MoeState) -> dict:
        return dict(state.columns)

    def alone(self, p: Point, ctx, inputs) -> tuple[dict, dict]:
        """({'gemm': a dense cuBLAS GEMM of about bound_flops (the compute bound's rate),
        'comm': the host view's copies alone (host fabric) or None}, {'gemm_flops': its FLOPs})."""
        s = moe_shape(p)
        rows = s.T * (p.world if p.fabric == "local" else 1)
        n = max(256, round(self.bound_flops(p) / (2 * rows * s.H) / 256) * 256)
        A = torch.randn((rows, s.H), device=ctx.device).to(torch.bfloat16)
        B = torch.randn((s.H, n), device=ctx.device).to(torch.bfloat16)
        out = torch.empty((rows, n), dtype=torch.bfloat16, device=ctx.device)
        fns = {"gemm": lambda: torch.matmul(A, B, out=out), "comm": None}
        view = inputs.host.get("view")
        if view is not None and ctx.device.type == "cuda":
            fns["comm"] = host_copies(view, ctx.device)
        return fns, {"gemm_flops": 2.0 * rows * n * s.H}

    def derive(self, row: dict, p: Point) -> dict:
        t, tg, gf = row.get("t_median_us"), row.get("t_gemm_us"), row.get("gemm_flops")
        out = {}
        if t and t > 0:
            out["tokens_per_s"] = self.tokens(p) / (t * 1e-6)
            if tg and gf:
                out["t_bound_us"] = tg * self.bound_flops(p) / gf
                out["frac_bound"] = out["t_bound_us"] / t
        return out


def host_copies(view, device):
    """The host fabric's transfers alone (every direction the layer uses), on two streams:
    device->host pushes beside host->device pulls, as the copy engines run them."""
    rows = max([t.shape[0] for d in (view.recv_rows, view.send_out, view.send_rows, view.recv_out)
                for t in d.values()] + [1])
    src = torch.randn((rows, view.shape.H), device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    side = torch.cuda.Stream(device)

    def copies():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for p in view.peers:
                view.send_rows[p].copy_(src[:view.send_rows[p].shape[0]], non_blocking=True)
                view.recv_out[p].copy_(src[:view.recv_out[p].shape[0]], non_blocking=True)
        for p in view.peers:
            dst[:view.recv_rows[p].shape[0]].copy_(view.recv_rows[p], non_blocking=True)
            dst[:view.send_out[p].shape[0]].copy_(view.send_out[p], non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
    return copies


OP = Moe()
