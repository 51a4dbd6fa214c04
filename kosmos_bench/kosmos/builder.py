"""The builder model: tile sizes of the Hopper (sm90) builder, what its TMA loads can take,
which builder a shape gets (``builder_choice``), which mover the configuration's ``mover:
auto`` becomes (``mover_choice``), and the schedule-model rates the schedule is built with.

Pure Python (no torch, no compiled library): the GPU runner, the simulator and the trace
analysis all use it. Building and loading the sm90 library is ``kernels/ag_sm90.py``'s.
"""
from __future__ import annotations

BM, BN, BK = 128, 256, 64  # sm90 builder tile (the schedule is built with BN = 256 for it); BK: one k-block
MOVER_THREADS = 128  # a mover item is copied by the loader warpgroup (csrc/ag_gemm_sm90.cu)
CTA_TFLOPS = 5.3  # one builder CTA's nominal rate for the schedule's model: ~700 TFLOP/s world-1 over 132 SMs
BUILDERS = ("mma", "sm90")
# Ops whose builder is picked by device when unset (sm90 on an sm_90 GPU when the shape suits
# TMA). gemm-rs: the sm90 kernel (csrc/ag_gemm_sm90.cu, gemm_rs_sm90_kernel), verified on the
# H200 (GPU tests; host W=8 out-proj/FC2 at 8k tokens 1.67x nccl-seq geomean vs 1.32x for mma,
# results/gemm-rs-sm90-h200-20261204/).
# ag-wgrad: the sm90 kernel only (A read transposed, csrc/ag_gemm_sm90.cu's A-transposed build).
AUTO_OPS = ("ag-gemm", "gemm-rs", "ag-wgrad")
MOVERS = ("sm", "ce")


def mover_share(builder: str) -> float:
    """What one mover item moves per second relative to a 256-thread WG's rate: an sm90 mover
    is the 128-thread loader warpgroup (half the bytes in flight); an mma mover a whole WG.
    The schedule model (the mover cap, the predicted split) and the simulator's per-mover
    rate both take it from here. Measured on the host fabric (results/issue4-h200-20261202/
    host-sm.parquet): 8 sm90 movers carried ~45 GB/s (16384x18432x16384 fixed:8 10407 us vs
    9330 us with 16), ~5.6 GB/s each against ~13 GB/s for a 256-thread mma WG (fixed:1)."""
    return MOVER_THREADS / 256 if builder == "sm90" else 1.0


def schedule_model(fabric: str) -> dict:
    """The schedule-model overrides of the sm90 builder (schedule.MODEL_DEFAULTS otherwise): a
    mover item is the 128-thread loader warpgroup's, a builder is one CTA at CTA_TFLOPS.
    Everything that rebuilds the kernel's schedule (runner, simulator, trace analysis) uses it."""
    from .. import schedule as S

    base = S.MODEL_DEFAULTS.get(fabric, S.MODEL_DEFAULTS["host"])
    return {"wg_copy_gbs": base["wg_copy_gbs"] * mover_share("sm90"),
            "wg_tile_copy_gbs": base.get("wg_tile_copy_gbs", base["wg_copy_gbs"]) * mover_share("sm90"),
            "wg_tflops": CTA_TFLOPS}


def _world_and_sizes(op: str, M: int, N: int, K: int, world: int) -> str | None:
    """The checks both sm90 kernels share (mirrors the C validators)."""
    if world < 1 or world > 8:
        return f"sm90 {op}: world outside 1..8"
    if min(M, N, K) <= 0:
        return f"sm90 {op}: M, N, K must be positive"
    return None


def validate(M: int, N: int, K: int, world: int, op: str = "ag-gemm") -> str | None:
    """None when the sm90 kernel of ``op`` takes the shape, else why not (mirrors the C
    validate / validate_rs of csrc/ag_gemm_sm90.cu)."""
    if op == "gemm-rs":
        return validate_rs(M, N, K, world)
    if op == "ag-wgrad":
        return validate_wgrad(M, N, K, world)
    why = _world_and_sizes("ag-gemm", M, N, K, world)
    if why:
        return why
    if M % world or N % world:
        return "sm90 ag-gemm: M and N must be divisible by world"
    if K % 8:
        return "sm90 ag-gemm: K must be a multiple of 8 (TMA: 16-byte row strides)"
    if (N // world) % 8:
        return "sm90 ag-gemm: N/world must be a multiple of 8 (TMA: 16-byte row strides of B_r and C_r)"
    return None


def validate_wgrad(M: int, N: int, K: int, world: int) -> str | None:
    """None when the sm90 ag-wgrad kernel takes the shape (At: K x M gathered along K, B_r:
    K x N/W, C_r: M x N/W), else why not (csrc/ag_gemm_sm90.cu validate_wgrad). Its bands are
    BM * chunk rows of At, whole k-blocks (BM % BK == 0)."""
    why = _world_and_sizes("ag-wgrad", M, N, K, world)
    if why:
        return why
    if K % world or N % world:
        return "sm90 ag-wgrad: K and N must be divisible by world"
    if M % 8:
        return "sm90 ag-wgrad: M must be a multiple of 8 (TMA: 16-byte row strides of At)"
    if (N // world) % 8:
        return "sm90 ag-wgrad: N/world must be a multiple of 8 (TMA: 16-byte row strides of B_r and C_r)"
    return None


def validate_rs(M: int, N: int, K: int, world: int) -> str | None:
    """None when the sm90 GEMM+RS takes the shape (A_r: M x K/W, B_r: K/W x N), else why not."""
    why = _world_and_sizes("gemm-rs", M, N, K, world)
    if why:
        return why
    if M % world or K % world:
        return "sm90 gemm-rs: M and K must be divisible by world"
    if (K // world) % 8:
        return "sm90 gemm-rs: K/world must be a multiple of 8 (TMA: 16-byte row strides of A_r)"
    if N % 8:
        return "sm90 gemm-rs: N must be a multiple of 8 (TMA: 16-byte row strides of B_r, partials and C_r)"
    return None


def _sm90_library_ok() -> bool:
    """Whether the sm90 library is cached or can be built here (nvcc and CUTLASS headers)."""
    from ..kernels import ag_sm90

    return ag_sm90.find_lib() is not None or ag_sm90._can_build()


def builder_choice(builder: str | None, op: str = "ag-gemm", shape: tuple[int, int, int, int] | None = None,
                   capability: tuple[int, int] | None = None, mover_bulk: bool = False,
                   library_ok=None) -> str:
    """The builder to use: the argument (the configuration's ``builder``), else picked by
    device: 'sm90' (wgmma + TMA) for the ops of AUTO_OPS on an sm_90 GPU when the shape (M, N,
    K, world) suits it, the library can be had (``library_ok()``, default: cached or buildable
    here) and no bulk movers are asked for; the portable 'mma' otherwise."""
    if builder:
        if builder not in BUILDERS:
            raise ValueError(f"builder={builder!r}: expected one of {', '.join(BUILDERS)}")
        return builder
    if op not in AUTO_OPS or mover_bulk or capability != (9, 0):
        return "mma"
    if shape is not None and validate(*shape, op=op) is not None:
        return "mma"
    return "sm90" if (library_ok or _sm90_library_ok)() else "mma"


# Ops whose auto mover is the copy engine on the host fabric (sm90 builder, policy self).
CE_AUTO_OPS = ("ag-gemm", "gemm-rs", "ag-wgrad")


def mover_choice(mover: str | None, op: str, fabric: str, builder: str, policy: str = "self",
                 world: int | None = None) -> str:
    """The mover to use: the argument (the configuration's ``mover``), else (``auto``) the one
    measured faster for the fabric, op and (resolved) builder: 'ce' (the copy engine moves,
    every CTA builds) for the ops of ``CE_AUTO_OPS`` on the host fabric with the sm90 builder
    under policy self; 'sm' (WGs move) everywhere else (on nvlink and local the WGs' loads are
    the fast path; fixed / predicted split WGs between moving and building, which needs SM
    movers). The measurements behind it: the ``mover`` field of kosmos/config.py (docs/knobs.md)."""
    if mover:
        if mover not in MOVERS:
            raise ValueError(f"mover={mover!r}: expected one of {', '.join(MOVERS)} or auto")
        return mover
    if world == 1:  # nothing moves
        return "sm"
    if op == "moe":  # the MoE forward kernel (sm90, self-scheduling only): the copy engine on the host fabric
        return "ce" if fabric == "host" else "sm"
    ce = op in CE_AUTO_OPS and fabric == "host" and builder == "sm90" and policy == "self"
    return "ce" if ce else "sm"


def sim_builder(builder: str | None, op: str, shape: tuple[int, int, int, int], has_sm90_figures: bool,
                mover_bulk: bool = False) -> str:
    """The builder the GPU runner would use on a simulated device (``builder_choice`` with the
    profile's sm90 figures standing for an sm_90 device whose library can be had)."""
    return builder_choice(builder, op, shape, (9, 0) if has_sm90_figures else None, mover_bulk, lambda: True)
