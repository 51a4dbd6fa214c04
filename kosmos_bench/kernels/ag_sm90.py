"""The Hopper-builder kernels (``csrc/ag_gemm_sm90.cu``: AG+GEMM and GEMM+RS): build, ctypes load.

Selected by the configuration's ``builder`` (``kosmos_bench/kosmos/builder.py`` picks it by
device when unset). Its own shared library
(``libkosmos_ag_sm90-<hash>-sm_90a.so``) because it needs the CUTLASS/CuTe headers of the
``nvidia-cutlass`` wheel (or ``$KOSMOS_CUTLASS_INCLUDE``), which the default build does not.
Built, cached and loaded by :mod:`kosmos_bench.kernels.libs` (``libs.AG_SM90``: the hash covers
the source, every kosmos header and the flags); builds on any machine with nvcc, no GPU needed.

C ABI (see the file): ``kosmos_sm90_ag_{validate,smem_bytes,threads,create,destroy,set_ahead,set_rank,
max_wgs,launch}``, ``kosmos_sm90_rs_{validate,create,destroy,set_rank,max_wgs,launch}`` (GEMM+RS; they fail in
the A-transposed build, which has no such kernel), ``kosmos_sm90_{last_error,b_transposed,a_transposed}``.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from . import libs
from .libs import BuildError, cutlass_include, nvcc  # noqa: F401 - cutlass_include, nvcc: _can_build

LIB = libs.AG_SM90
# The builder model (tile sizes, what TMA takes, which builder a shape gets): kosmos/builder.py.


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
    lib.kosmos_sm90_b_transposed.restype = I
    lib.kosmos_sm90_a_transposed.restype = I
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
    # GEMM+RS on the same builder (gemm_rs_sm90_kernel)
    lib.kosmos_sm90_rs_validate.argtypes = [I, I, I, I]
    lib.kosmos_sm90_rs_validate.restype = ctypes.c_char_p
    lib.kosmos_sm90_rs_create.restype = P
    lib.kosmos_sm90_rs_destroy.argtypes = [P]
    lib.kosmos_sm90_rs_destroy.restype = None
    lib.kosmos_sm90_rs_set_rank.argtypes = [P, I, P, P, I, I, I, I]
    lib.kosmos_sm90_rs_set_rank.restype = I
    lib.kosmos_sm90_rs_max_wgs.argtypes = [I, ctypes.POINTER(I)]
    lib.kosmos_sm90_rs_max_wgs.restype = I
    lib.kosmos_sm90_rs_launch.argtypes = [P, ctypes.POINTER(abi.Params), P]
    lib.kosmos_sm90_rs_launch.restype = I
    return lib


def library(b_transposed: bool = False, a_transposed: bool = False) -> libs.Library:
    """The build of ``ag_gemm_sm90.cu`` with these operand layouts."""
    if a_transposed and b_transposed:
        raise ValueError("no sm90 library reads both A and B transposed")
    return libs.AG_SM90_AT if a_transposed else libs.AG_SM90_BT if b_transposed else LIB


def load(b_transposed: bool = False, a_transposed: bool = False) -> ctypes.CDLL:
    """The loaded library (built on first use when no cached build matches the sources);
    ``b_transposed``: the build that reads B_r transposed (libs.AG_SM90_BT, the dgrad ops);
    ``a_transposed``: the one that reads A transposed, whose AG kernel is op ag-wgrad
    (libs.AG_SM90_AT; its kosmos_sm90_rs_* entry points fail)."""
    lib = library(b_transposed, a_transposed).load(declare=_declare)
    if (bool(lib.kosmos_sm90_b_transposed()), bool(lib.kosmos_sm90_a_transposed())) != (b_transposed, a_transposed):
        raise BuildError(f"{lib._name}: operand layouts are not the ones asked for "
                         f"(b_transposed={b_transposed}, a_transposed={a_transposed})")
    return lib


def last_error(lib: ctypes.CDLL) -> str:
    return (lib.kosmos_sm90_last_error() or b"").decode(errors="replace")
