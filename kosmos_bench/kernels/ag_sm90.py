"""The opt-in Hopper-builder AG+GEMM kernel (``csrc/ag_gemm_sm90.cu``): build, ctypes load.

Selected by the configuration's ``builder`` (``kosmos_bench/kosmos/builder.py`` picks it by
device when unset). Its own shared library
(``libkosmos_ag_sm90-<hash>-sm_90a.so``) because it needs the CUTLASS/CuTe headers of the
``nvidia-cutlass`` wheel (or ``$KOSMOS_CUTLASS_INCLUDE``), which the default build does not.
Same cache directories and hashing rules as :mod:`kosmos_bench.kernels` (the hash covers the
source, every kosmos header and the flags); builds on any machine with nvcc, no GPU needed.

C ABI (see the file): ``kosmos_sm90_ag_{validate,smem_bytes,threads,create,destroy,set_ahead,set_split,
set_rank,max_wgs,launch}``, ``kosmos_sm90_last_error``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from . import CSRC, BuildError, _search_dirs, cache_dir, nvcc

SOURCE = "ag_gemm_sm90.cu"
ARCH = "sm_90a"
GENCODE = ("-gencode=arch=compute_90a,code=sm_90a",)
NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-cudart",
              "static", "-Xptxas", "-v")
# The builder model (tile sizes, what TMA takes, which builder a shape gets) is pure Python in
# kosmos/builder.py; re-exported here for the callers of this module.
from ..kosmos.builder import BK, BM, BN, BUILDERS, CTA_TFLOPS, MOVER_THREADS, builder_choice, schedule_model, validate  # noqa: E402,F401,E501

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None


def _can_build() -> bool:
    try:
        cutlass_include()
        nvcc()
        return True
    except Exception:  # noqa: BLE001 - no nvcc or no CUTLASS headers: the portable builder
        return False


def cutlass_include() -> Path:
    from .sm90_gemm import cutlass_include as inc

    try:
        return inc()
    except RuntimeError as e:
        raise BuildError(str(e)) from e


def _headers() -> list[Path]:
    return sorted((CSRC / "kosmos").glob("*.h")) + sorted((CSRC / "kosmos").glob("*.cuh"))


def source_hash() -> str:
    h = hashlib.sha256()
    for p in [CSRC / SOURCE] + _headers():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(NVCC_FLAGS + GENCODE).encode())
    return h.hexdigest()[:16]


def lib_name() -> str:
    return f"libkosmos_ag_sm90-{source_hash()}-{ARCH}.so"


def find_lib() -> Path | None:
    for d in _search_dirs():
        if (d / lib_name()).exists():
            return d / lib_name()
    return None


def _cmd(extra: list[str]) -> list[str]:
    return [nvcc(), *NVCC_FLAGS, *GENCODE, f"-I{CSRC}", f"-I{cutlass_include()}", *extra]


def _run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"nvcc failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-6000:]}")
    return p.stdout + p.stderr


def check() -> str:
    """Compile the kernel to an object in a temp dir (no GPU); returns the nvcc/ptxas log."""
    with tempfile.TemporaryDirectory() as tmp:
        return _run(_cmd(["-c", str(CSRC / SOURCE), "-o", str(Path(tmp) / "ag_gemm_sm90.o")]))


def build(force: bool = False) -> Path:
    """Build the shared library into the cache dir (no GPU needed); returns its path."""
    out = cache_dir() / lib_name()
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".libkosmos_ag_sm90.", suffix=".so")
    os.close(fd)
    try:
        log = _run(_cmd(["-shared", "-o", tmp, str(CSRC / SOURCE)]))
        (out.parent / f"{out.stem}.ptxas.txt").write_text(log)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


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
    lib.kosmos_sm90_ag_set_split.argtypes = [P, I, P, I]
    lib.kosmos_sm90_ag_set_split.restype = I
    lib.kosmos_sm90_ag_set_rank.argtypes = [P, I, P, P, P, P, I, I, I, I]
    lib.kosmos_sm90_ag_set_rank.restype = I
    lib.kosmos_sm90_ag_max_wgs.argtypes = [I, ctypes.POINTER(I)]
    lib.kosmos_sm90_ag_max_wgs.restype = I
    lib.kosmos_sm90_ag_launch.argtypes = [P, ctypes.POINTER(abi.Params), P]
    lib.kosmos_sm90_ag_launch.restype = I
    return lib


def load() -> ctypes.CDLL:
    """The loaded library (built on first use when no cached build matches the sources)."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        path = find_lib()
        if path is None:
            if shutil.which("nvcc") is None:
                raise BuildError(f"{lib_name()} not found in {[str(d) for d in _search_dirs()]} and nvcc is missing "
                                 "to build it")
            path = build()
        _LIB = _declare(ctypes.CDLL(str(path)))
        return _LIB


def last_error(lib: ctypes.CDLL) -> str:
    return (lib.kosmos_sm90_last_error() or b"").decode(errors="replace")
