"""What every op module provides: shapes, counts, inputs and the pure-torch reference.

Inputs are generated *globally* from the point's seed (identical in every process, so each
rank can compute its own reference) and then sharded; see `Point` for the layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..point import Point

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Per-element tolerance |out - ref| <= RTOL * (|ref| + rms(ref)), by output dtype. bf16 has an
# 8-bit mantissa (eps 7.8e-3): rounding the output alone costs up to eps/2, the rest is
# fp32-accumulation order and (gemm-rs) rounding of the partials before the reduction.
RTOL = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 1e-4}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


@dataclass
class RankInputs:
    """Shards held by this process, on its device.

    A[r], B[r]: rank r's operands (layouts in `Point`'s docstring) for every rank r whose
    inputs this process has (all W ranks on the single-GPU fabrics, its own rank otherwise).
    """

    A: dict[int, torch.Tensor]
    B: dict[int, torch.Tensor]
    # Host fabric: pinned host copies of the peers' data, made once per point and shared by
    # the impl under test and the point's copy-alone timing, so that both read the same
    # pages (fresh pinned buffers moved copy-alone by up to ~10% between allocations).
    host: dict = field(default_factory=dict)


def randn(shape, dtype: torch.dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Fresh standard-normal data (never zeros), generated in fp32 then cast."""
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


def generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def check_output(out: torch.Tensor, ref: torch.Tensor, dtype: str, rtol: float | None = None) -> tuple[int, float]:
    """(wrong, max_rel_err) of out against the fp32 reference.

    wrong counts elements outside the tolerance, NaN/inf (e.g. an unwritten, poisoned
    element) included; max_rel_err = max|out - ref| / rms(ref).
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    o = out.float()
    diff = (o - ref).abs()
    rms = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    tol = (RTOL[dtype] if rtol is None else rtol) * (ref.abs() + rms)
    ok = diff <= tol  # False for NaN
    wrong = int((~ok).sum().item())
    finite = torch.isfinite(diff)
    max_rel = float((diff[finite].max() / rms).item()) if finite.any() else float("inf")
    if not bool(finite.all()):
        max_rel = float("inf")
    return wrong, max_rel


class Op:
    """Base for op modules. Subclasses define the shapes; counts and checks are shared."""

    name: str = ""
    # The forward op whose kernels and baselines run this one (itself for the forward ops;
    # the backward ops of ops/backward.py name theirs).
    base: str = ""
    # Which collective this op fuses, for bus bandwidth (nccl-tests' factor (W-1)/W).
    collective: str = ""

    def validate(self, p: Point) -> str | None:
        """None when the shape splits across p.world ranks, else a one-line reason."""
        raise NotImplementedError

    def flops(self, p: Point) -> float:
        """FLOPs of the whole op, all ranks together (2*M*N*K)."""
        return 2.0 * p.M * p.N * p.K

    def comm_bytes(self, p: Point) -> float:
        """nccl-tests' 'size' of the collective, in bytes."""
        raise NotImplementedError

    def bus_factor(self, p: Point) -> float:
        return (p.world - 1) / p.world if p.world > 1 else 0.0

    def make_global(self, p: Point, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Global A (M x K) and B (K x N) in the point's dtype; B scaled so C is O(1)."""
        g = generator(torch.device(device), seed)
        dt = torch_dtype(p.dtype)
        A = randn((p.M, p.K), dt, device, g)
        B = randn((p.K, p.N), dt, device, g, scale=p.K ** -0.5)
        return A, B

    def shard(self, A: torch.Tensor, B: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def reference(self, A: torch.Tensor, B: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        """fp32 reference output of `rank`."""
        raise NotImplementedError

    def out_shape(self, p: Point) -> tuple[int, int]:
        raise NotImplementedError

    def check(self, out: torch.Tensor, ref, dtype: str, B=None) -> tuple[int, float]:
        """(wrong, max_rel_err) of one rank's output against reference() (B: inputs()' third value)."""
        return check_output(out, ref, dtype)

    def own(self, t: torch.Tensor, which: str) -> torch.Tensor:
        """A shard as this process keeps it (which: 'A' or 'B'): contiguous, unless the op's
        layout says otherwise (the dgrad ops keep B_r as a transposed view of W_r)."""
        return t.contiguous()

    def inputs(self, p: Point, ranks: list[int], device, seed: int) -> tuple[RankInputs, torch.Tensor, torch.Tensor]:
        """This process's shards plus the global tensors (kept for the reference)."""
        A, B = self.make_global(p, device, seed)
        As, Bs = {}, {}
        for r in ranks:
            a, b = self.shard(A, B, r, p.world)
            As[r], Bs[r] = self.own(a, "A"), self.own(b, "B")
        return RankInputs(As, Bs), A, B

    # ---- harness hooks: what the harness does with every op (ops/moe.py overrides them) ----
    def setup(self, p: Point, ranks: list[int], device, seed: int):
        """(inputs for the implementation, state for `compare`/`columns`)."""
        inputs, A, B = self.inputs(p, ranks, device, seed)
        return inputs, (A, B)

    def poison(self, runner) -> None:
        """Make every output the implementation must write invalid (NaN) before a checked call."""
        for out in runner.outputs.values():
            out.fill_(float("nan"))

    def snapshot(self, runner) -> dict:
        """Copies of everything a call produced ({name: {rank: tensor}}), compared bitwise
        between two calls and against the reference."""
        return {"out": {r: o.clone() for r, o in runner.outputs.items()}}

    def compare(self, p: Point, ranks: list[int], snap: dict, inputs, state) -> dict:
        """{'wrong', 'max_rel_err', ...extra columns} of this process's ranks against the reference."""
        A, B = state
        wrong, err = 0, 0.0
        for r in ranks:
            w, e = self.check(snap["out"][r], self.reference(A, B, r, p.world), p.dtype, B)
            wrong, err = wrong + w, max(err, e)
        return {"wrong": wrong, "max_rel_err": err}

    def columns(self, p: Point, state) -> dict:
        """Extra columns of a point known from its inputs."""
        return {}

    def alone(self, p: Point, ctx, inputs):
        """None: the harness times impls/nccl.py's GEMM alone and collective alone; else
        ({'gemm': fn, 'comm': fn or None}, extra columns)."""
        return None

    def derive(self, row: dict, p: Point) -> dict:
        """Op-specific rates from a measured row."""
        return {}


def divides(what: str, n: int, w: int) -> str | None:
    return None if n % w == 0 else f"{what}={n} is not divisible by world={w}"
