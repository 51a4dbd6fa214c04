"""The opt-in Hopper-builder AG+GEMM kernel (``csrc/ag_gemm_sm90.cu``): build, ctypes load.

Selected by ``KosmosImpl.prepare(..., builder="sm90")`` or ``$KOSMOS_BUILDER=sm90`` (default:
the portable mma.sync builder of the main library). Its own shared library
(``libkosmos_ag_sm90-<hash>-sm_90a.so``) because it needs the CUTLASS/CuTe headers of the
``nvidia-cutlass`` wheel (or ``$KOSMOS_CUTLASS_INCLUDE``), which the default build does not.
Built, cached and loaded by :mod:`kosmos_bench.kernels.libs` (``libs.AG_SM90``: the hash covers
the source, every kosmos header and the flags); builds on any machine with nvcc, no GPU needed.

C ABI (see the file): ``kosmos_sm90_ag_{validate,smem_bytes,threads,create,destroy,set_ahead,set_rank,
max_wgs,launch}``, ``kosmos_sm90_last_error``.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from . import libs
from .libs import BuildError, cutlass_include, nvcc  # noqa: F401 - cutlass_include, nvcc: _can_build

LIB = libs.AG_SM90
BM, BN, BK = 128, 256, 64  # builder tile: the schedule is built with BN = 256 for this variant
MOVER_THREADS = 128  # a mover item is copied by the loader warpgroup (csrc/ag_gemm_sm90.cu)
CTA_TFLOPS = 5.3  # one builder CTA's nominal rate for the schedule's model: ~700 TFLOP/s world-1 over 132 SMs


def schedule_model(fabric: str) -> dict:
    """The schedule-model overrides of this builder (schedule.MODEL_DEFAULTS otherwise): a
    mover item is the 128-thread loader warpgroup's, a builder is one CTA at CTA_TFLOPS.
    Everything that rebuilds the kernel's schedule (runner, simulator, trace analysis) uses it."""
    from .. import schedule as S

    base = S.MODEL_DEFAULTS.get(fabric, S.MODEL_DEFAULTS["host"])
    return {"wg_copy_gbs": base["wg_copy_gbs"] * MOVER_THREADS / 256, "wg_tflops": CTA_TFLOPS}
BUILDERS = ("mma", "sm90")


def validate(M: int, N: int, K: int, world: int) -> str | None:
    """None when the sm90 AG+GEMM takes the shape, else why not (mirrors the C validate)."""
    if world < 1 or world > 8:
        return "sm90 ag-gemm: world outside 1..8"
    if min(M, N, K) <= 0:
        return "sm90 ag-gemm: M, N, K must be positive"
    if M % world or N % world:
        return "sm90 ag-gemm: M and N must be divisible by world"
    if K % 8:
        return "sm90 ag-gemm: K must be a multiple of 8 (TMA: 16-byte row strides)"
    if (N // world) % 8:
        return "sm90 ag-gemm: N/world must be a multiple of 8 (TMA: 16-byte row strides of B_r and C_r)"
    return None


def builder_choice(builder: str | None, op: str = "ag-gemm", shape: tuple[int, int, int, int] | None = None,
                   capability: tuple[int, int] | None = None, mover_bulk: bool = False) -> str:
    """The builder to use: the argument, else $KOSMOS_BUILDER, else picked by device: 'sm90'
    (wgmma + TMA) for ag-gemm on an sm_90 GPU when the shape (M, N, K, world) suits it, the
    library can be had and no bulk movers are asked for; the portable 'mma' otherwise."""
    b = builder or os.environ.get("KOSMOS_BUILDER")
    if b:
        if b not in BUILDERS:
            raise ValueError(f"builder={b!r}: expected one of {BUILDERS}")
        return b
    if op != "ag-gemm" or mover_bulk or capability != (9, 0):
        return "mma"
    if shape is not None and validate(*shape) is not None:
        return "mma"
    return "sm90" if (find_lib() is not None or _can_build()) else "mma"


def _can_build() -> bool:
    try:
        cutlass_include()
        nvcc()
        return True
    except Exception:  # noqa: BLE001 - no nvcc or no CUTLASS headers: the portable builder
        return False


# Build, cache, load: kernels/libs.py (compile-check: check(), no GPU needed).
source_hash, lib_name, find_lib, check = LIB.source_hash, LIB.lib_name, LIB.find_lib, LIB.check


def build(force: bool = False) -> Path:
    """Build the shared library into the cache dir (no GPU needed); returns its path."""
    return LIB.build(force=force).path


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    from . import abi

    P, I = ctypes.c_void_p, ctypes.c_int
    lib.kosmos_sm90_last_error.restype = ctypes.c_char_p
    lib.kosmos_sm90_ag_validate.argtypes = [I, I, I, I]
    lib.kosmos_sm90_ag_validate.restype = ctypes.c_char_p
    lib.kosmos_sm90_ag_smem_bytes.restype = I
    lib.kosmos_sm90_ag_threads.restype = I
    lib.kosmos_sm90_ag_create.restype = P
    lib.kosmos_sm90_ag_destroy.argtypes = [P]
    lib.kosmos_sm90_ag_destroy.restype = None
    lib.kosmos_sm90_ag_set_ahead.argtypes = [P, I]
    lib.kosmos_sm90_ag_set_ahead.restype = I
    lib.kosmos_sm90_ag_set_rank.argtypes = [P, I, P, P, P, P, I, I, I, I]
    lib.kosmos_sm90_ag_set_rank.restype = I
    lib.kosmos_sm90_ag_max_wgs.argtypes = [I, ctypes.POINTER(I)]
    lib.kosmos_sm90_ag_max_wgs.restype = I
    lib.kosmos_sm90_ag_launch.argtypes = [P, ctypes.POINTER(abi.Params), P]
    lib.kosmos_sm90_ag_launch.restype = I
    return lib


def load() -> ctypes.CDLL:
    """The loaded library (built on first use when no cached build matches the sources)."""
    return LIB.load(declare=_declare)


def last_error(lib: ctypes.CDLL) -> str:
    return (lib.kosmos_sm90_last_error() or b"").decode(errors="replace")
