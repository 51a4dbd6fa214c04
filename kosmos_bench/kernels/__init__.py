"""Lazy build + load of the KOSMOS kernels (csrc/), never at import.

The kernels compile with nvcc into a torch-free shared library with a C ABI
(``csrc/kosmos/params.h``; CUDA runtime linked statically) that Python loads with ctypes
(``abi.py`` mirrors the structs). Why not a pybind11 extension: the library then builds on
any machine with nvcc (a CPU-only CI box included), does not depend on the Python or torch
version, and can be prebuilt on one machine and carried to another; the binding layer is
the ~10 functions of params.h.

Build, cache and load of every library of csrc/ live in ``libs.py`` (the main library here,
the sm90 AG+GEMM in ``ag_sm90.py``, the standalone sm90 GEMM in ``sm90_gemm.py``): cache
``$KOSMOS_BENCH_CACHE`` if set, else ``~/.cache/kosmos-bench``; ``<repo>/.kb-cache`` is also
searched when loading. File name ``libkosmos-<hash>-<arch>.so``, the hash covering the
sources, the kosmos headers and the nvcc flags, so a stale build is never loaded.

API: ``build(check_only=False, arch=None) -> BuildResult`` (``kosmos-bench build [--check]``:
the check compiles every library that builds for the arch), ``load() -> ctypes.CDLL`` (builds
if needed), ``BuildError``.
"""
from __future__ import annotations

import ctypes

from . import abi, libs
from .libs import CSRC, DEFAULT_ARCH, REPO, BuildError, BuildResult, cache_dir, detect_arch, nvcc  # noqa: F401

LIB = libs.KOSMOS
SOURCES = LIB.sources


source_hash, lib_name, find_lib = LIB.source_hash, LIB.lib_name, LIB.find_lib  # (arch)


def build(check_only: bool = False, arch: str | None = None, force: bool = False) -> BuildResult:
    """Build every library that builds for `arch` into the cache (or, with check_only, compile
    every source of those libraries to an object in a temp dir: needs nvcc, no GPU)."""
    if check_only:
        return libs.check_all(arch)
    return libs.build_all(arch, force=force)


def _declare(lib: ctypes.CDLL) -> None:
    abi.declare(lib)
    if lib.kosmos_abi_version() != abi.ABI_VERSION:
        raise BuildError(f"{lib._name}: ABI version {lib.kosmos_abi_version()} != {abi.ABI_VERSION}")


def load(arch: str | None = None) -> ctypes.CDLL:
    """The loaded library (built on first use if no cached build matches the sources)."""
    return LIB.load(arch, declare=_declare)


def last_error(lib: ctypes.CDLL) -> str:
    return (lib.kosmos_last_error() or b"").decode(errors="replace")
