"""Lazy build + load of the KOSMOS kernels (csrc/), never at import.

The kernels compile with nvcc into a torch-free shared library with a C ABI
(``csrc/kosmos/params.h``; CUDA runtime linked statically) that Python loads with ctypes
(``abi.py`` mirrors the structs). Why not a pybind11 extension: the library then builds on
any machine with nvcc (a CPU-only CI box included), does not depend on the Python or torch
version, and can be prebuilt on one machine and carried to another; the binding layer is
the ~10 functions of params.h.

Cache: ``$KOSMOS_BENCH_CACHE`` if set, else ``~/.cache/kosmos-bench``; ``<repo>/.kb-cache``
is also searched when loading. File name ``libkosmos-<hash>-<arch>.so``, the hash covering
every file under csrc/ used by the library and the nvcc flags, so a stale build is never
loaded.

API: ``build(check_only=False, arch=None) -> BuildResult`` (``kosmos-bench build [--check]``),
``load() -> ctypes.CDLL`` (builds if needed), ``BuildError``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
SOURCES = ("ag_gemm.cu", "gemm_rs.cu", "runtime.cu")
HEADERS = ("params.h", "platform.cuh", "sync.cuh", "queue.cuh", "trace.cuh", "mover.cuh", "builder_mma.cuh",
           "persistent.cuh", "host_error.h")
NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-Xcompiler", "-fPIC", "-cudart", "static", "-Xptxas", "-v")
DEFAULT_ARCH = "sm_90a"

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None


class BuildError(RuntimeError):
    """The kernels could not be built (missing nvcc, compile error: the message says which)."""


@dataclass
class BuildResult:
    path: Path | None
    arch: str
    check_only: bool
    log: str

    def __str__(self) -> str:
        what = "compile-checked" if self.check_only else f"built {self.path}"
        srcs = list(SOURCES)
        if self.check_only and self.arch == "sm_90a":
            srcs.append("ag_gemm_sm90.cu")
        return f"kosmos kernels {what} for {self.arch} ({', '.join(srcs)})"


def cache_dir() -> Path:
    return Path(os.environ.get("KOSMOS_BENCH_CACHE") or Path.home() / ".cache" / "kosmos-bench")


def _search_dirs() -> list[Path]:
    dirs = [cache_dir(), REPO / ".kb-cache", Path.home() / ".cache" / "kosmos-bench"]
    out = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def _gencode(arch: str) -> list[str]:
    a = arch.removeprefix("sm_").removeprefix("compute_")
    return [f"-gencode=arch=compute_{a},code=sm_{a}"]


def detect_arch() -> str:
    """The visible GPU's arch (sm_90 -> sm_90a), else DEFAULT_ARCH."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}" + ("a" if major == 9 else "")
    except Exception:  # noqa: BLE001 - no torch / no driver: fall back to the default arch
        pass
    return DEFAULT_ARCH


def source_hash(arch: str) -> str:
    h = hashlib.sha256()
    for name in list(SOURCES) + [f"kosmos/{x}" for x in HEADERS]:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(" ".join(NVCC_FLAGS + tuple(_gencode(arch))).encode())
    return h.hexdigest()[:16]


def lib_name(arch: str) -> str:
    return f"libkosmos-{source_hash(arch)}-{arch}.so"


def nvcc() -> str:
    path = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))
    if not path:
        raise BuildError("nvcc (the CUDA compiler) was not found on PATH or in /usr/local/cuda/bin; install the CUDA "
                         "toolkit or set KOSMOS_BENCH_CACHE to a directory holding a prebuilt libkosmos-*.so")
    return path


def _run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"nvcc failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-6000:]}")
    return p.stdout + p.stderr


def build(check_only: bool = False, arch: str | None = None, force: bool = False) -> BuildResult:
    """Build the shared library into the cache (or, with check_only, compile every kernel
    source to an object in a temp dir: needs nvcc, no GPU)."""
    arch = arch or detect_arch()
    cc = nvcc()
    base = [cc, *NVCC_FLAGS, *_gencode(arch), f"-I{CSRC}"]
    if check_only:
        logs = []
        with tempfile.TemporaryDirectory() as tmp:
            for src in SOURCES:
                logs.append(_run(base + ["-c", str(CSRC / src), "-o", str(Path(tmp) / (src + ".o"))]))
        # The opt-in Hopper-builder AG+GEMM (own library, needs the CUTLASS headers; sm_90a only).
        if arch == "sm_90a":
            from . import ag_sm90

            logs.append(ag_sm90.check())
        return BuildResult(None, arch, True, "\n".join(logs))
    out = cache_dir() / lib_name(arch)
    if out.exists() and not force:
        return BuildResult(out, arch, False, "cached")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".libkosmos.", suffix=".so")
    os.close(fd)
    try:
        log = _run(base + ["-shared", "-o", tmp] + [str(CSRC / s) for s in SOURCES])
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return BuildResult(out, arch, False, log)


def find_lib(arch: str) -> Path | None:
    name = lib_name(arch)
    for d in _search_dirs():
        if (d / name).exists():
            return d / name
    return None


def load(arch: str | None = None) -> ctypes.CDLL:
    """The loaded library (built on first use if no cached build matches the sources)."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        from . import abi

        arch = arch or detect_arch()
        path = find_lib(arch)
        if path is None:
            path = build(arch=arch).path
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:  # e.g. built against another system's libraries: rebuild here
            if shutil.which("nvcc") is None:
                raise BuildError(f"cannot load {path}: {e}; and nvcc is missing to rebuild it") from e
            path = build(arch=arch, force=True).path
            lib = ctypes.CDLL(str(path))
        abi.declare(lib)
        if lib.kosmos_abi_version() != abi.ABI_VERSION:
            raise BuildError(f"{path}: ABI version {lib.kosmos_abi_version()} != {abi.ABI_VERSION}")
        _LIB = lib
        return lib


def last_error(lib: ctypes.CDLL) -> str:
    return (lib.kosmos_last_error() or b"").decode(errors="replace")
