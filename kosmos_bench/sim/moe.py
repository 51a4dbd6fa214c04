"""Closed-form model of the MoE expert layer forward (op `moe`) on a hardware profile.

Not the discrete-event engine: a step-by-step account of one call, each step priced from the
profile (every row says so in `sim_model`):

* routing loads: moe_math's own router run on the CPU over a sample of rank 0's tokens
  (ROUTE_SAMPLE), scaled to T; every rank is assumed to route alike (same router, same skew),
  so each expert receives W times rank 0's expected rows;
* router GEMM (T x E x H) at the cuBLAS model's rate (sim.baselines.cublas_us);
* expert GEMMs: per expert, ceil(rows / BM) x ceil(N / BN) tiles (the per-expert tile
  quantisation that makes skew and small experts cost), gate/up (N = 2F, depth H) and down
  (N = H, depth F), spread over the SMs as one persistent grouped GEMM;
* dispatch / combine: the rows that cross ranks (rank 0's sent + received, each way) over the
  fabric: host -> PCIe (the torch pipelines' copy engine, one direction after the other on
  their one stream, both at once in torch-moe-overlap; the kernel, with copy-engine or SM
  movers, at the measured rate of both directions together, link.moe_duplex_GBps), nvlink -> the NCCL point-to-point rate,
  local -> device copies at HBM speed;
* memory passes (permute, activation, unpermute, fold) at HBM speed x MEM_EFFICIENCY, bytes
  counted per step (eager torch materialises fp32 activations; compiled fuses them; kosmos
  reads each output row once in its fold);
* which ranks: local -> all W on one GPU; host -> rank 0 (the peers are static, as measured);
  nvlink / gloo -> the most loaded rank, which the layer waits for;
* composition: torch-moe serialises the steps; torch-moe-compiled likewise with fewer bytes
  and no launch gaps; torch-moe-overlap pipelines the transfers with the expert GEMMs per
  source rank (the first chunk's transfer exposed); kosmos runs one launch where movers
  overlap builders (policy self: movers take the WGs the link needs while data moves;
  fixed:k keeps k WGs movers for the whole call). Queue order is not modelled here, nor the
  math warpgroups' schedule (math_wgs: both builds priced at the joint build's measured tile rate,
  the profile's moe kernel_efficiency, until the ping-pong one is measured).
* ops moe-bwd / moe-step (the torch pipelines through autograd): the backward is the forward's
  account with every GEMM twice (dgrad + wgrad: router, expert grouped GEMMs, shared expert),
  BWD_MEM times its memory passes and launches, and the same transfers (the output gradients
  out, the input gradients back); moe-step = forward + backward. kosmos (its backward kernel, one
  launch; world 1, local and host, else skipped with the kernel's reason): every GEMM twice in the
  launch, the transfers overlapped as in its forward, plus the gather (dy read per choice, the
  expert output rows read, the upstream rows written) and the fold of dx at HBM speed; without
  peer rows the movers gather tile by tile beside the dgrad tiles and fold beside the wgrad ones.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ..ops import moe_math as mm
from ..point import Point
from . import baselines
from .model import Unsupported

IMPLS = ("kosmos", "torch-moe", "torch-moe-compiled", "torch-moe-overlap")
ROUTE_SAMPLE = 1024  # tokens of rank 0 routed on the CPU to estimate the expert loads
MEM_EFFICIENCY = 0.7  # elementwise / gather passes reach ~70% of peak HBM bandwidth
EAGER_KERNELS = 30  # kernel launches of the eager pipeline per rank (router .. fold)
BWD_MEM = 2.0  # autograd's elementwise backward reads the saved activations and the gradient, writes one
MODEL = ("moe closed-form (sim/moe.py): per-expert tiles, fabric bytes, HBM passes; queue order and math_wgs "
         "not modelled")


@dataclasses.dataclass
class Loads:
    rows: list[list[float]]  # rows[q][e]: expected rows expert e of rank q computes (all ranks' tokens)
    sent: float  # rows rank 0 sends to other ranks' experts
    recv: float  # rows rank 0 receives for its experts
    per_expert: list[float]  # expected tokens per global expert (all ranks)


def loads(s: mm.MoeShape, seed: int) -> Loads:
    n = min(s.T, ROUTE_SAMPLE)
    small = dataclasses.replace(s, T=n)
    x = mm.tokens(small, 0, "cpu", seed)  # the first n tokens of rank 0 (same generator stream)
    Wr, bias = mm.router(s, "cpu", seed)
    idx = mm.route(s, x, Wr, bias)[0]
    c = (mm.expert_counts(s, idx).double() * (s.T / n)).tolist()  # rank 0's rows per expert
    per_expert = [v * s.world for v in c]
    rows = [per_expert[q * s.E_loc:(q + 1) * s.E_loc] for q in range(s.world)]
    own = sum(c[:s.E_loc])
    return Loads(rows, sent=s.T * s.topk - own, recv=own * (s.world - 1), per_expert=per_expert)


def grouped_us(prof: dict, s: mm.MoeShape, rows: list[float], *, builder: bool = False, sms: int | None = None) -> float:
    """Gate/up then down over experts with `rows` each: per-expert tiles, as one persistent grouped
    GEMM, at the profile's measured rate of such GEMMs relative to its dense one (profile `moe`:
    `kernel_efficiency` for the KOSMOS MoE kernels' expert tiles, builder True;
    `grouped_mm_efficiency` for torch._grouped_mm; 1 where the profile has none)."""
    moe = prof.get("moe") or {}
    if builder and prof.get("builder_sm90"):
        b = prof["builder_sm90"]
        prof = {**prof, "tile_m": b["tile_m"], "tile_n": b["tile_n"], "builder_efficiency": b["efficiency"]}
    if builder and "kernel_efficiency" in moe:
        prof = {**prof, "builder_efficiency": moe["kernel_efficiency"]}
    eff = 1.0 if builder else moe.get("grouped_mm_efficiency", 1.0)
    g = sms or prof["num_sms"]
    t = 0.0
    for n_out, depth in ((2 * s.F, s.H), (s.H, s.F)):
        tiles = sum(baselines.tiles(prof, math.ceil(r), n_out, builder) for r in rows if r >= 0.5)
        t += tiles / g * baselines.tile_us(prof, "bf16", depth, builder) / eff
    return t


def _mem_us(prof: dict, nbytes: float) -> float:
    return nbytes / (prof["hbm_GBps"] * MEM_EFFICIENCY * 1e3)


def _shared_us(prof: dict, s: mm.MoeShape) -> float:
    if not s.shared_F:
        return 0.0
    return (baselines.cublas_us(prof, "bf16", s.T, 2 * s.shared_F, s.H, launch=False)
            + baselines.cublas_us(prof, "bf16", s.T, s.H, s.shared_F, launch=False))


def _transfer_us(p: Point, prof: dict, s: mm.MoeShape, ld: Loads, *, movers: bool) -> tuple[float, float]:
    """(one direction-pair of the dispatch, the same for the combine) in us, as the fabric moves
    them: rank 0's rows out and the peers' rows in. Host: the kernel (copy-engine or SM movers:
    both measured at the same rate) moves both directions together at the profile's
    ``moe_duplex_GBps`` (~80 GB/s, H100, results/device-h100-20261206c; else the link's duplex); the
    overlapped pipeline copies D2H beside H2D on two streams; the sequential pipelines
    (torch-moe, torch-moe-compiled) copy on their one stream, one direction after the other."""
    if s.world == 1:
        return 0.0, 0.0
    row = s.H * 2
    out_b, in_b = ld.sent * row, ld.recv * row
    link = prof["link"]
    if p.fabric == "host":
        if movers:
            h2d, d2h = link["h2d_GBps"], link["d2h_GBps"]
            duplex = link.get("moe_duplex_GBps", link.get("duplex_GBps", h2d + d2h))
            one = max(out_b / d2h, in_b / h2d, (out_b + in_b) / duplex) / 1e3
        elif p.impl == "torch-moe-overlap":
            one = max(baselines._copy_us(prof, out_b, "d2h"), baselines._copy_us(prof, in_b, "h2d"))
        else:
            one = baselines._copy_us(prof, out_b, "d2h") + baselines._copy_us(prof, in_b, "h2d")
        return one, one
    if p.fabric == "local":
        one = _mem_us(prof, 2 * (out_b + in_b) * s.world)  # every rank's rows copied on one GPU
        return one, one
    bw = prof["nccl"].get("p2p_GBps") or link.get("bw_GBps")
    one = prof["nccl"].get("latency_us", 0.0) + max(out_b, in_b) / (bw * 1e3)
    return one, one


def simulate(p: Point, prof: dict) -> dict:
    if p.impl not in IMPLS:
        raise Unsupported(f"the simulator models op {p.op} for {', '.join(IMPLS)}, not {p.impl}")
    if p.impl == "kosmos" and p.op != "moe" and p.world > 1 and p.fabric not in ("local", "host"):
        raise Unsupported(f"kosmos {p.op}: the backward kernel runs world 1, local and host "
                          f"(fabric {p.fabric} not implemented yet)")
    if p.impl == "torch-moe-overlap" and p.op != "moe" and p.fabric == "host":
        raise Unsupported(f"torch-moe-overlap {p.op} on the host fabric: its pipelined copies have no autograd path")
    if p.impl == "torch-moe-overlap" and (p.world == 1 or p.fabric not in ("host", "local")):
        raise Unsupported("torch-moe-overlap runs on the host and local fabrics at world > 1")
    from ..ops.moe import moe_shape

    s = moe_shape(p)
    ld = loads(s, p.seed)
    # local: one GPU computes every rank; host: rank 0 (the peers are static); nvlink/gloo:
    # the layer takes as long as its most loaded rank
    ranks = list(range(s.world)) if p.fabric == "local" else [0] if p.fabric == "host" else \
        [max(range(s.world), key=lambda q: sum(ld.rows[q]))]
    n_rows = s.T * s.topk * len(ranks)
    launch = prof["launch_overhead_us"]
    router = len(ranks) * baselines.cublas_us(prof, "bf16", s.T, s.E, s.H, launch=False)
    shared = len(ranks) * _shared_us(prof, s)
    from ..kosmos.builder import mover_choice  # noqa: PLC0415
    from ..kosmos.config import KosmosConfig  # noqa: PLC0415

    ce = p.impl == "kosmos" and p.op == "moe" and \
        mover_choice(KosmosConfig.from_point(p).mover, "moe", p.fabric, "sm90", "self", s.world) == "ce"
    disp, comb = _transfer_us(p, prof, s, ld, movers=p.impl == "kosmos")
    H, F = s.H, s.F
    if p.impl == "kosmos":
        kind, k = _policy(p.policy)
        movers = 0
        if s.world > 1 and p.fabric == "host" and not ce:  # copy-engine movers take no WGs
            link = prof["link"]
            movers = k if kind == "fixed" else math.ceil(max(link["h2d_GBps"], link["d2h_GBps"]) / link["wg_GBps"])
        if kind == "fixed":  # k WGs are movers for the whole call
            compute = sum(grouped_us(prof, s, ld.rows[q], builder=True, sms=max(1, prof["num_sms"] - movers))
                          for q in ranks)
        else:  # self / predicted: movers hold WGs only while data moves, then build
            compute = sum(grouped_us(prof, s, ld.rows[q], builder=True) for q in ranks) + \
                (disp + comb) * movers / prof["num_sms"]
        fold = _mem_us(prof, 2 * n_rows * H + 2 * len(ranks) * s.T * H)  # each output row read once
        # without peer rows (world 1, local) DOWN runs in column groups and the movers fold each
        # group beside the next one's DOWNs: only the last group's fold is left after them
        from ..kernels.moe_sm90 import FOLD_GROUPS  # noqa: PLC0415
        grouped = s.world == 1 or p.fabric == "local"
        fwd_t = launch + router + shared + max(compute, disp + comb) + (fold / FOLD_GROUPS if grouped else fold)
        gather = _mem_us(prof, 3 * 2 * n_rows * H)  # dy per choice, the output rows, the upstream rows written
        # without peer rows the movers gather tile by tile beside the math warps' dgrad tiles (DH
        # starts on its own tile's rows), then fold beside the wgrad tiles (a FOLD needs its DX
        # tiles); with peers the gather runs before the tiles and the fold after them
        if grouped:
            bwd_t = launch + 2 * (router + shared) + max(compute, gather) + max(compute, fold)
        else:
            bwd_t = launch + 2 * (router + shared) + max(2 * compute, disp + comb) + gather + fold
        t = (fwd_t if p.op in ("moe", "moe-step") else 0.0) + (bwd_t if p.op in ("moe-bwd", "moe-step") else 0.0)
        return _fields(p, prof, s, ld, t, {"sim_movers": movers})
    fwd = {"router": router, "shared": shared, "disp": disp + comb}
    t = 0.0
    if p.op in ("moe", "moe-step"):
        t += _torch_us(p, prof, s, ld, ranks, fwd, gemm=1, mem=1.0)
    if p.op in ("moe-bwd", "moe-step"):
        t += _torch_us(p, prof, s, ld, ranks, fwd, gemm=2, mem=BWD_MEM)
    return _fields(p, prof, s, ld, t, {})


def _torch_us(p: Point, prof: dict, s: mm.MoeShape, ld: Loads, ranks: list, fwd: dict, *, gemm: int, mem: float) -> float:
    """One pass of a torch pipeline: the forward's (gemm 1, mem 1) or the backward's (every GEMM
    `gemm` times, the memory passes and launches `mem` times; the same transfers)."""
    n_rows, H, F = s.T * s.topk * len(ranks), s.H, s.F
    compiled = p.impl == "torch-moe-compiled"
    act = (6 if compiled else 40) * n_rows * F  # fp32 activation temporaries unless fused
    mem_t = mem * _mem_us(prof, 4 * n_rows * H + act + 6 * n_rows * H + (8 if compiled else 16) * len(ranks) * s.T * H)
    launches = mem * (0.2 if compiled else 1.0) * EAGER_KERNELS * len(ranks) * prof["launch_overhead_us"]
    base = gemm * (fwd["router"] + fwd["shared"]) + mem_t + launches
    if p.impl == "torch-moe-overlap":
        chunks = [[r / s.world for r in ld.rows[q]] for q in ranks for _ in range(s.world)]
        compute = gemm * sum(grouped_us(prof, s, c) for c in chunks)
        return base + fwd["disp"] / s.world + max(compute, fwd["disp"])
    return base + gemm * sum(grouped_us(prof, s, ld.rows[q]) for q in ranks) + fwd["disp"]


def _policy(policy: str | None) -> tuple[str, int]:
    from ..kosmos.decide import parse_policy

    return parse_policy(policy or "self")


def _fields(p: Point, prof: dict, s: mm.MoeShape, ld: Loads, t: float, extra: dict) -> dict:
    from ..ops import get_op

    op = get_op(p.op)
    rows = s.T * (p.world if p.fabric == "local" else 1)
    n = max(256, round(op.bound_flops(p) / (2 * rows * s.H) / 256) * 256)
    t_gemm = baselines.cublas_us(prof, "bf16", rows, n, s.H)
    row = s.H * 2 * (2 if p.op == "moe-step" else 1)  # per pass, as the GPU rows
    return {"profile": prof["name"], "sim_model": MODEL, "t_median_us": t, "t_min_us": t, "t_p99_us": t, "cv": 0.0,
            "t_gemm_us": t_gemm, "gemm_flops": 2.0 * rows * n * s.H, "t_comm_us": None,
            "dispatch_bytes": (ld.sent + ld.recv) * row, "combine_bytes": (ld.sent + ld.recv) * row,
            "tok_per_expert_max": max(ld.per_expert), "tok_per_expert_mean": sum(ld.per_expert) / len(ld.per_expert),
            **extra}
