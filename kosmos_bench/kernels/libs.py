"""Build, cache and load of every compiled library of csrc/: one implementation, three libraries.

Each library is a small declarative :class:`Library` (name, sources, hashed headers, extra
nvcc flags, whether it needs the CUTLASS/CuTe headers, the arches it builds for); this module
holds the one implementation of what all of them need:

* cache: ``$KOSMOS_BENCH_CACHE`` if set, else ``~/.cache/kosmos-bench`` (built libraries go
  there); loading also searches ``<repo>/.kb-cache`` and ``~/.cache/kosmos-bench``.
* file name ``lib<name>-<hash>-<arch>.so``: the hash covers every source, every hashed header,
  the nvcc flags and the arch, so a stale build is never loaded.
* :func:`build` (nvcc into a temp file, atomic rename; a file lock keeps concurrent processes
  from building the same library twice), :func:`check` (compile every source to an object in
  a temp dir: nvcc only, no GPU), :func:`load` (ctypes, once per process; rebuilds when a
  found library does not load here).
* errors: :class:`BuildError` names what is missing (nvcc, the CUTLASS headers) or the failing
  nvcc command; a missing compiler is a :class:`ToolchainMissing`. ``$KOSMOS_CUTLASS_INCLUDE`` is
  read in :func:`cutlass_include` only.
* two toolchains, picked by the arch: ``sm_*`` -> nvcc; ``gfx*`` (AMD GPUs) -> hipcc with
  ``HIP_PLATFORM=amd`` (:func:`is_hip`). For AMD the libraries are compile-checked only
  (:func:`check`); :func:`build` refuses a ``gfx`` arch: nothing has run on an AMD GPU.

The libraries are torch-free with a C ABI and the CUDA runtime linked statically, so one
built on a CPU box with nvcc loads on a GPU machine with another Python (see
``kosmos_bench/kernels/__init__.py``).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
DEFAULT_ARCH = "sm_90a"
# Every library: C++17, optimized, position-independent, CUDA runtime static, ptxas report.
NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-Xcompiler", "-fPIC", "-cudart", "static", "-Xptxas", "-v")
KOSMOS_HEADERS = ("kosmos/*.h", "kosmos/*.cuh")  # every kosmos header: a library never loads stale
# hipcc (AMD GPUs): C++17, optimized, position-independent, the register / LDS / spill report
# (what -Xptxas -v is for nvcc). A library's own `flags` are nvcc flags: not passed to hipcc.
HIP_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-fPIC", "-Rpass-analysis=kernel-resource-usage")
HIP_INSTALL = "apt-get install hipcc libamdhip64-dev (Debian/Ubuntu), or ROCm from AMD"


class BuildError(RuntimeError):
    """A library could not be built or loaded (missing nvcc or CUTLASS headers, compile error:
    the message says which)."""


class ToolchainMissing(BuildError):
    """The compiler an arch needs (nvcc, hipcc) is not on this machine (one-line message)."""


@dataclass(frozen=True)
class Library:
    """What one compiled library is; everything else is derived by this module."""

    name: str                                # file name lib<name>-<hash>-<arch>.so
    sources: tuple[str, ...]                 # under csrc/, compiled into the library
    headers: tuple[str, ...] = KOSMOS_HEADERS  # globs under csrc/, hashed (not compiled)
    flags: tuple[str, ...] = ()              # nvcc flags besides NVCC_FLAGS
    cutlass: bool = False                    # needs the CUTLASS/CuTe include dir
    arches: tuple[str, ...] | None = None    # the arches it builds for (None: any)

    def supports(self, arch: str) -> bool:
        return self.arches is None or arch in self.arches

    # The per-library API (the module functions below, bound): arch None = the library's own
    # arch when it has one, else the visible GPU's.
    def source_hash(self, arch: str | None = None) -> str:
        return source_hash(self, arch)

    def lib_name(self, arch: str | None = None) -> str:
        return lib_name(self, arch)

    def find_lib(self, arch: str | None = None) -> Path | None:
        return find_lib(self, arch)

    def check(self, arch: str | None = None) -> str:
        return check(self, arch)

    def build(self, arch: str | None = None, force: bool = False, out_dir: Path | None = None) -> BuildResult:
        return build(self, arch, force, out_dir)

    def load(self, arch: str | None = None, declare: Callable[[ctypes.CDLL], object] | None = None,
             build_if_missing: bool = True) -> ctypes.CDLL:
        return load(self, arch, declare, build_if_missing)


# The libraries of csrc/ (their Python sides: kernels/__init__.py, ag_sm90.py, sm90_gemm.py, moe_sm90.py,
# moe_bwd_sm90.py).
KOSMOS = Library("kosmos", ("ag_gemm.cu", "gemm_rs.cu", "runtime.cu"))
AG_SM90 = Library("kosmos_ag_sm90", ("ag_gemm_sm90.cu",),
                  flags=("--expt-relaxed-constexpr", "-DKOSMOS_SM90_B_TRANSPOSED=0", "-DKOSMOS_SM90_A_TRANSPOSED=0"),
                  cutlass=True,
                  arches=("sm_90a",))
# The same kernels with B_r read transposed (K contiguous): the backward dgrad ops (W_r^T in place).
AG_SM90_BT = Library("kosmos_ag_sm90_bt", ("ag_gemm_sm90.cu",),
                     flags=("--expt-relaxed-constexpr", "-DKOSMOS_SM90_B_TRANSPOSED=1", "-DKOSMOS_SM90_A_TRANSPOSED=0"),
                     cutlass=True,
                     arches=("sm_90a",))
# The AG kernel with A read transposed (M contiguous): op ag-wgrad, At (K x M) gathered along K
# (its GEMM+RS entry points fail: no such kernel in it).
AG_SM90_AT = Library("kosmos_ag_sm90_at", ("ag_gemm_sm90.cu",),
                     flags=("--expt-relaxed-constexpr", "-DKOSMOS_SM90_B_TRANSPOSED=0", "-DKOSMOS_SM90_A_TRANSPOSED=1"),
                     cutlass=True, arches=("sm_90a",))
SM90_GEMM = Library("sm90_gemm", ("gemm_sm90.cu",), flags=("--expt-relaxed-constexpr",), cutlass=True,
                    arches=("sm_90a",))
MOE_SM90 = Library("kosmos_moe_sm90", ("moe_fwd_sm90.cu",), flags=("--expt-relaxed-constexpr",), cutlass=True,
                   arches=("sm_90a",))
# The same forward with ping-pong math warpgroups (KosmosConfig.math_wgs pingpong; csrc/moe_fwd_sm90.cu).
MOE_SM90_PP = Library("kosmos_moe_pp_sm90", ("moe_fwd_sm90.cu",),
                      flags=("--expt-relaxed-constexpr", "-DKOSMOS_MOE_PINGPONG=1"), cutlass=True, arches=("sm_90a",))
# The MoE backward (one launch per backward; reads the forward's saved state: kernels/moe_bwd_sm90.py).
MOE_BWD_SM90 = Library("kosmos_moe_bwd_sm90", ("moe_bwd_sm90.cu",), flags=("--expt-relaxed-constexpr",), cutlass=True,
                       arches=("sm_90a",))
# The same backward with ping-pong math warpgroups (KosmosConfig.math_wgs pingpong; csrc/moe_bwd_sm90.cu).
MOE_BWD_SM90_PP = Library("kosmos_moe_bwd_pp_sm90", ("moe_bwd_sm90.cu",),
                          flags=("--expt-relaxed-constexpr", "-DKOSMOS_MOE_PINGPONG=1"), cutlass=True,
                          arches=("sm_90a",))
LIBRARIES = (KOSMOS, AG_SM90, SM90_GEMM, MOE_SM90, AG_SM90_BT, AG_SM90_AT, MOE_BWD_SM90, MOE_SM90_PP, MOE_BWD_SM90_PP)


@dataclass
class BuildResult:
    """What build / check did: ``path`` is None for a compile check; ``log`` the nvcc output."""

    libs: tuple[Library, ...]
    path: Path | None
    arch: str
    check_only: bool
    log: str

    def __str__(self) -> str:
        what = ("compile-checked" if self.check_only else
                f"built in {self.path}" if self.path is not None and self.path.is_dir() else f"built {self.path}")
        srcs = [s for lib in self.libs for s in lib.sources]
        return f"kosmos kernels {what} for {self.arch} ({', '.join(srcs)})"


# ------------------------------------------------------------------------------ environment
def cache_dir() -> Path:
    """Where libraries are built: $KOSMOS_BENCH_CACHE, else ~/.cache/kosmos-bench."""
    return Path(os.environ.get("KOSMOS_BENCH_CACHE") or Path.home() / ".cache" / "kosmos-bench")


def search_dirs() -> list[Path]:
    """Where a prebuilt library is looked for, in order (the cache dir first)."""
    out: list[Path] = []
    for d in (cache_dir(), REPO / ".kb-cache", Path.home() / ".cache" / "kosmos-bench"):
        if d not in out:
            out.append(d)
    return out


def nvcc() -> str:
    """Path of nvcc (PATH, else /usr/local/cuda/bin), else ToolchainMissing."""
    path = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
    if not path:
        raise ToolchainMissing("nvcc (the CUDA compiler) was not found on PATH or in /usr/local/cuda/bin; install the CUDA "
                         "toolkit or set KOSMOS_BENCH_CACHE to a directory holding a prebuilt lib*.so")
    return path


def is_hip(arch: str) -> bool:
    """An AMD GPU arch (gfx90a, gfx942, ...): built with hipcc."""
    return arch.startswith("gfx")


def hipcc() -> str:
    """Path of hipcc (PATH, else /opt/rocm/bin), else ToolchainMissing."""
    path = shutil.which("hipcc") or shutil.which("hipcc", path="/opt/rocm/bin")
    if not path:
        raise ToolchainMissing(f"hipcc (the HIP compiler) was not found on PATH or in /opt/rocm/bin: {HIP_INSTALL}")
    return path


def hip_toolchain() -> tuple[str, str] | None:
    """(hipcc path, its 'HIP version: ...' line) or None when hipcc is absent."""
    try:
        path = hipcc()
    except ToolchainMissing:
        return None
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, env=_hip_env())
        lines = (p.stdout + p.stderr).splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return path, f"error: {e}"
    version = next((ln.strip() for ln in lines if ln.startswith("HIP version")), lines[0].strip() if lines else "?")
    return path, version


def _hip_env() -> dict[str, str]:
    # Without HIP_PLATFORM=amd, hipcc on a machine that also has nvcc hands the files to nvcc.
    return {**os.environ, "HIP_PLATFORM": "amd"}


def cutlass_include() -> Path:
    """The CUTLASS/CuTe include dir: $KOSMOS_CUTLASS_INCLUDE, else the nvidia-cutlass wheel's."""
    env = os.environ.get("KOSMOS_CUTLASS_INCLUDE")
    if env:
        return Path(env)
    try:
        import cutlass_library  # noqa: PLC0415  (only needed to build)
    except ImportError as e:
        raise BuildError("building the sm90 kernels needs the CUTLASS headers: pip install nvidia-cutlass "
                         "(or set KOSMOS_CUTLASS_INCLUDE to a CUTLASS include dir)") from e
    inc = Path(cutlass_library.__file__).parent / "source" / "include"
    if not (inc / "cute" / "tensor.hpp").exists():
        raise BuildError(f"CUTLASS headers not found under {inc} (set KOSMOS_CUTLASS_INCLUDE)")
    return inc


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


# ------------------------------------------------------------------------------ naming
def _arch(lib: Library, arch: str | None) -> str:
    if arch is None:
        return lib.arches[0] if lib.arches else detect_arch()
    if not lib.supports(arch):
        raise BuildError(f"lib{lib.name} builds for {', '.join(lib.arches or ())} only (asked for {arch})")
    return arch


def gencode(arch: str) -> list[str]:
    a = arch.removeprefix("sm_").removeprefix("compute_")
    return [f"-gencode=arch=compute_{a},code=sm_{a}"]


def flags(lib: Library, arch: str) -> list[str]:
    if is_hip(arch):
        return [*HIP_FLAGS, f"--offload-arch={arch}"]
    return [*NVCC_FLAGS, *lib.flags, *gencode(arch)]


def hashed_files(lib: Library) -> list[Path]:
    """The files the hash covers: the sources, then the headers (sorted per glob)."""
    files = [CSRC / s for s in lib.sources]
    for g in lib.headers:
        files += [p for p in sorted(CSRC.glob(g)) if p not in files]
    return files


def source_hash(lib: Library, arch: str | None = None) -> str:
    arch = _arch(lib, arch)
    h = hashlib.sha256()
    for p in hashed_files(lib):
        h.update(p.relative_to(CSRC).as_posix().encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags(lib, arch)).encode())
    return h.hexdigest()[:16]


def lib_name(lib: Library, arch: str | None = None) -> str:
    arch = _arch(lib, arch)
    return f"lib{lib.name}-{source_hash(lib, arch)}-{arch}.so"


def find_lib(lib: Library, arch: str | None = None) -> Path | None:
    """A prebuilt library matching the sources, in search_dirs(), else None."""
    name = lib_name(lib, arch)
    for d in search_dirs():
        if (d / name).exists():
            return d / name
    return None


# ------------------------------------------------------------------------------ compile
def _command(lib: Library, arch: str, extra: list[str]) -> list[str]:
    inc = [f"-I{CSRC}"] + ([f"-I{cutlass_include()}"] if lib.cutlass else [])
    return [hipcc() if is_hip(arch) else nvcc(), *flags(lib, arch), *inc, *extra]


def _run(cmd: list[str], hip: bool = False) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=_hip_env() if hip else None)
    if p.returncode != 0:
        raise BuildError(f"{'hipcc' if hip else 'nvcc'} failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-6000:]}")
    return p.stdout + p.stderr


def check(lib: Library, arch: str | None = None) -> str:
    """Compile every source of `lib` to an object in a temp dir (the compiler only, no GPU); the log."""
    arch = _arch(lib, arch)
    logs = []
    with tempfile.TemporaryDirectory() as tmp:
        for src in lib.sources:
            cmd = _command(lib, arch, ["-c", str(CSRC / src), "-o", str(Path(tmp) / (src + ".o"))])
            logs.append(_run(cmd, hip=is_hip(arch)))
    return "\n".join(logs)


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(lib: Library, arch: str | None = None, force: bool = False, out_dir: Path | None = None) -> BuildResult:
    """Build `lib` into out_dir (default cache_dir()) unless a build of these sources is there;
    nvcc writes a temp file that is renamed into place, next to it ``<stem>.ptxas.txt``."""
    arch = _arch(lib, arch)
    if is_hip(arch):
        raise BuildError(f"lib{lib.name} for {arch}: AMD GPUs are compile-checked only (build --check --arch {arch})")
    out = Path(out_dir or cache_dir()) / lib_name(lib, arch)
    if out.exists() and not force:
        return BuildResult((lib,), out, arch, False, "cached")
    cmd_head = _command(lib, arch, [])  # nvcc / CUTLASS missing: fail before touching the cache
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".lib{lib.name}.lock"):
        if out.exists() and not force:  # another process built it while this one waited
            return BuildResult((lib,), out, arch, False, "cached")
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".lib{lib.name}.", suffix=".so")
        os.close(fd)
        try:
            log = _run(cmd_head + ["-shared", "-o", tmp] + [str(CSRC / s) for s in lib.sources])
            (out.parent / f"{out.stem}.ptxas.txt").write_text(log)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return BuildResult((lib,), out, arch, False, log)


def build_all(arch: str | None = None, force: bool = False) -> BuildResult:
    """Build every library that builds for `arch` into the cache (path: the cache directory):
    what a GPU machine without nvcc or the CUTLASS headers loads when the cache is carried there."""
    arch = arch or detect_arch()
    libs = tuple(lib for lib in LIBRARIES if lib.supports(arch))
    logs = [build(lib, arch, force).log for lib in libs]
    return BuildResult(libs, cache_dir(), arch, False, "\n".join(logs))


def check_all(arch: str | None = None) -> BuildResult:
    """Compile-check every library that builds for `arch` (default: the visible GPU's)."""
    arch = arch or detect_arch()
    libs = tuple(lib for lib in LIBRARIES if lib.supports(arch))
    return BuildResult(libs, None, arch, True, "\n".join(check(lib, arch) for lib in libs))


# ------------------------------------------------------------------------------ load
_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], ctypes.CDLL] = {}


def load(lib: Library, arch: str | None = None, declare: Callable[[ctypes.CDLL], object] | None = None,
         build_if_missing: bool = True) -> ctypes.CDLL:
    """The loaded library, once per process (built first when no build of these sources is
    found; rebuilt when a found one does not load here). ``declare(cdll)`` sets the ctypes
    signatures (and may check the ABI) before the library is handed out."""
    arch = _arch(lib, arch)
    with _LOCK:
        key = (lib.name, arch)
        if key in _LOADED:
            return _LOADED[key]
        path = find_lib(lib, arch)
        if path is None:
            if not build_if_missing:
                raise BuildError(f"{lib_name(lib, arch)} not found in {[str(d) for d in search_dirs()]}")
            path = build(lib, arch).path
        try:
            cdll = ctypes.CDLL(str(path))
        except OSError as e:  # e.g. built against another system's libraries: rebuild here
            if shutil.which("nvcc") is None:
                raise BuildError(f"cannot load {path}: {e}; and nvcc is missing to rebuild it") from e
            path = build(lib, arch, force=True).path
            cdll = ctypes.CDLL(str(path))
        if declare is not None:
            declare(cdll)
        _LOADED[key] = cdll
        return cdll
