"""CPU tests of kernels/libs.py: naming, hashing, cache dirs, build/check with a stand-in nvcc,
the errors that name what is missing. (The real nvcc builds: `kosmos-bench build --check`.)"""
from __future__ import annotations

import stat
import sys

import pytest

from kosmos_bench import kernels
from kosmos_bench.kernels import ag_sm90, libs, moe_bwd_sm90, moe_sm90, sm90_gemm

FAKE_NVCC = """#!/bin/sh
# stand-in nvcc: log the arguments, touch the -o file, print a ptxas-like line
echo "$@" >> "$(dirname "$0")/calls.txt"
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
[ -n "$out" ] && echo built > "$out"
echo "ptxas info : Used 1 registers" >&2
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A csrc/ of two sources and two headers, a cache dir, a stand-in nvcc on PATH."""
    csrc = tmp_path / "csrc"
    (csrc / "kosmos").mkdir(parents=True)
    for name in ("a.cu", "b.cu", "kosmos/x.h", "kosmos/y.cuh"):
        (csrc / name).write_text(f"// {name}\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvcc").write_text(FAKE_NVCC)
    (bin_ / "nvcc").chmod(stat.S_IRWXU)
    monkeypatch.setattr(libs, "CSRC", csrc)
    monkeypatch.setattr(libs, "REPO", tmp_path)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    monkeypatch.setenv("KOSMOS_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _lib(**kw):
    return libs.Library("demo", ("a.cu", "b.cu"), **kw)


def test_the_libraries():
    assert [lib.name for lib in libs.LIBRARIES] == ["kosmos", "kosmos_ag_sm90", "sm90_gemm", "kosmos_moe_sm90", "kosmos_ag_sm90_bt",
                                                    "kosmos_ag_sm90_at", "kosmos_moe_bwd_sm90", "kosmos_moe_pp_sm90",
                                                    "kosmos_moe_bwd_pp_sm90"]
    # one source, three layouts: the flags say which (and so the hashes differ)
    assert ag_sm90.library(a_transposed=True) is libs.AG_SM90_AT and ag_sm90.library(True) is libs.AG_SM90_BT
    assert "-DKOSMOS_SM90_A_TRANSPOSED=1" in libs.AG_SM90_AT.flags and libs.AG_SM90_AT.sources == libs.AG_SM90.sources
    assert len({lib.source_hash() for lib in (libs.AG_SM90, libs.AG_SM90_BT, libs.AG_SM90_AT)}) == 3
    with pytest.raises(ValueError, match="both"):
        ag_sm90.library(True, True)
    assert kernels.LIB is libs.KOSMOS and ag_sm90.LIB is libs.AG_SM90 and sm90_gemm.LIB is libs.SM90_GEMM
    assert moe_sm90.LIB is libs.MOE_SM90 and moe_bwd_sm90.LIB is libs.MOE_BWD_SM90
    # the MoE forward: one source, two math-warpgroup schedules (KosmosConfig.math_wgs)
    assert moe_sm90.LIBS == {"joint": libs.MOE_SM90, "pingpong": libs.MOE_SM90_PP}
    assert libs.MOE_SM90_PP.sources == libs.MOE_SM90.sources and "-DKOSMOS_MOE_PINGPONG=1" in libs.MOE_SM90_PP.flags
    assert libs.MOE_SM90_PP.source_hash() != libs.MOE_SM90.source_hash()
    with pytest.raises(ValueError, match="math_wgs"):
        moe_sm90.load("cooperative")
    assert moe_bwd_sm90.LIBS == {"joint": libs.MOE_BWD_SM90, "pingpong": libs.MOE_BWD_SM90_PP}
    assert "-DKOSMOS_MOE_PINGPONG=1" in libs.MOE_BWD_SM90_PP.flags and libs.MOE_BWD_SM90_PP.sources == libs.MOE_BWD_SM90.sources
    with pytest.raises(ValueError, match="math_wgs"):
        moe_bwd_sm90.load("cooperative")
    for lib in libs.LIBRARIES:
        for p in libs.hashed_files(lib):
            assert p.exists(), p
    assert kernels.lib_name("sm_90a").startswith("libkosmos-") and kernels.lib_name("sm_90a").endswith("-sm_90a.so")
    assert kernels.lib_name("sm_80") != kernels.lib_name("sm_90a")
    assert sm90_gemm.lib_name().startswith("libsm90_gemm-") and sm90_gemm.source_hash() != ag_sm90.source_hash()
    with pytest.raises(libs.BuildError, match="sm_90a only"):
        ag_sm90.LIB.lib_name("sm_80")


def test_hash_covers_sources_headers_flags_and_arch(tree):
    lib = _lib()
    h = lib.source_hash("sm_90a")
    assert h == lib.source_hash("sm_90a") and len(h) == 16
    assert lib.source_hash("sm_80") != h
    assert _lib(flags=("-G",)).source_hash("sm_90a") != h
    (tree / "csrc" / "kosmos" / "y.cuh").write_text("// changed\n")
    assert lib.source_hash("sm_90a") != h
    assert [p.name for p in libs.hashed_files(lib)] == ["a.cu", "b.cu", "x.h", "y.cuh"]


def test_cache_dir_and_search_order(tree, monkeypatch):
    assert libs.cache_dir() == tree / "cache"
    assert libs.search_dirs() == [tree / "cache", tree / ".kb-cache", tree / "home" / ".cache" / "kosmos-bench"]
    monkeypatch.delenv("KOSMOS_BENCH_CACHE")
    assert libs.cache_dir() == tree / "home" / ".cache" / "kosmos-bench"
    assert libs.search_dirs() == [libs.cache_dir(), tree / ".kb-cache"]
    lib = _lib()
    (tree / ".kb-cache").mkdir()
    (tree / ".kb-cache" / lib.lib_name("sm_90a")).write_text("prebuilt")
    assert lib.find_lib("sm_90a") == tree / ".kb-cache" / lib.lib_name("sm_90a")


def test_build_renames_into_the_cache_once(tree):
    lib = _lib(flags=("-DX",))
    res = lib.build("sm_90a")
    out = tree / "cache" / lib.lib_name("sm_90a")
    assert res.path == out and out.read_text() == "built\n" and not res.check_only
    assert "ptxas info" in (tree / "cache" / f"{out.stem}.ptxas.txt").read_text()
    assert [p.name for p in (tree / "cache").iterdir() if p.name.startswith(".libdemo.") and p.suffix == ".so"] == []
    call = (tree / "bin" / "calls.txt").read_text().splitlines()
    assert len(call) == 1 and "-shared" in call[0] and "-DX" in call[0] and "code=sm_90a" in call[0]
    assert lib.find_lib("sm_90a") == out
    assert lib.build("sm_90a").log == "cached" and len((tree / "bin" / "calls.txt").read_text().splitlines()) == 1
    lib.build("sm_90a", force=True)
    assert len((tree / "bin" / "calls.txt").read_text().splitlines()) == 2


def test_check_compiles_every_source_to_an_object(tree):
    log = _lib().check("sm_90a")
    calls = (tree / "bin" / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and all(" -c " in c for c in calls) and "ptxas info" in log
    assert not (tree / "cache").exists()  # a check writes nothing to the cache


def test_check_all_names_what_it_compiled(monkeypatch):
    seen = []
    monkeypatch.setattr(libs, "check", lambda lib, arch: seen.append((lib.name, arch)) or "")
    res = kernels.build(check_only=True, arch="sm_90a")
    assert seen == [("kosmos", "sm_90a"), ("kosmos_ag_sm90", "sm_90a"), ("sm90_gemm", "sm_90a"),
                    ("kosmos_moe_sm90", "sm_90a"), ("kosmos_ag_sm90_bt", "sm_90a"), ("kosmos_ag_sm90_at", "sm_90a"),
                    ("kosmos_moe_bwd_sm90", "sm_90a"), ("kosmos_moe_pp_sm90", "sm_90a"),
                    ("kosmos_moe_bwd_pp_sm90", "sm_90a")]
    assert str(res) == ("kosmos kernels compile-checked for sm_90a (ag_gemm.cu, gemm_rs.cu, runtime.cu, ag_gemm_sm90.cu, "
                        "gemm_sm90.cu, moe_fwd_sm90.cu, ag_gemm_sm90.cu, ag_gemm_sm90.cu, "
                        "moe_bwd_sm90.cu, moe_fwd_sm90.cu, moe_bwd_sm90.cu)")
    seen.clear()
    assert str(kernels.build(check_only=True, arch="sm_80")).endswith("(ag_gemm.cu, gemm_rs.cu, runtime.cu)")
    assert seen == [("kosmos", "sm_80")]


def test_build_builds_every_library_of_the_arch(monkeypatch, tmp_path):
    # `kosmos-bench build` fills the cache a GPU machine without nvcc/CUTLASS loads from
    seen = []
    monkeypatch.setattr(libs, "build", lambda lib, arch, force=False: seen.append(lib.name) or libs.BuildResult(
        (lib,), tmp_path / lib.name, arch, False, "built"))
    monkeypatch.setattr(libs, "cache_dir", lambda: tmp_path)
    res = kernels.build(arch="sm_90a")
    assert seen == [lib.name for lib in libs.LIBRARIES] and str(res).startswith(f"kosmos kernels built in {tmp_path} ")
    seen.clear()
    kernels.build(arch="sm_80")
    assert seen == ["kosmos"]


def test_missing_nvcc_is_named(tree, monkeypatch):
    monkeypatch.setattr(libs.shutil, "which", lambda *a, **k: None)
    with pytest.raises(libs.BuildError, match="nvcc"):
        _lib().build("sm_90a")
    assert not (tree / "cache").exists()
    with pytest.raises(libs.BuildError, match="nvcc"):
        _lib().load("sm_90a")


def test_missing_cutlass_is_named(tree, monkeypatch):
    monkeypatch.delenv("KOSMOS_CUTLASS_INCLUDE", raising=False)
    monkeypatch.setitem(sys.modules, "cutlass_library", None)  # import fails
    with pytest.raises(libs.BuildError, match="KOSMOS_CUTLASS_INCLUDE"):
        _lib(cutlass=True).check("sm_90a")
    assert ag_sm90._can_build() is False
    monkeypatch.setenv("KOSMOS_CUTLASS_INCLUDE", str(tree / "cutlass"))
    assert libs.cutlass_include() == tree / "cutlass"
    _lib(cutlass=True).check("sm_90a")
    assert f"-I{tree / 'cutlass'}" in (tree / "bin" / "calls.txt").read_text()


def test_load_without_a_library_or_a_build(tree):
    with pytest.raises(libs.BuildError, match="not found in"):
        _lib().load("sm_90a", build_if_missing=False)


# ---- the HIP toolchain (AMD GPUs: compile-check only) ------------------------------------
FAKE_HIPCC = """#!/bin/sh
# stand-in hipcc: log HIP_PLATFORM and the arguments, touch the -o file
echo "HIP_PLATFORM=$HIP_PLATFORM $@" >> "$(dirname "$0")/hipcc_calls.txt"
[ "$1" = "--version" ] && { echo "HIP version: 5.2.21153-0"; echo "clang version 15"; exit 0; }
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
[ -n "$out" ] && echo built > "$out"
echo "remark: VGPRs: 172" >&2
"""


@pytest.fixture
def hip_tree(tree):
    hipcc = tree / "bin" / "hipcc"
    hipcc.write_text(FAKE_HIPCC)
    hipcc.chmod(stat.S_IRWXU)
    return tree


def test_hip_check_runs_hipcc_for_amd(hip_tree):
    assert libs.is_hip("gfx90a") and not libs.is_hip("sm_90a")
    log = _lib(flags=("--expt-relaxed-constexpr",)).check("gfx90a")
    calls = (hip_tree / "bin" / "hipcc_calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "VGPRs" in log
    for c in calls:  # HIP_PLATFORM=amd (else hipcc hands the file to nvcc), the arch, no nvcc flags
        assert c.startswith("HIP_PLATFORM=amd ") and "--offload-arch=gfx90a" in c and " -c " in c
        assert "-fPIC" in c and "-cudart" not in c and "expt-relaxed" not in c and "gencode" not in c
    assert not (hip_tree / "bin" / "calls.txt").exists()  # nvcc not used
    assert _lib().source_hash("gfx90a") != _lib().source_hash("sm_90a")
    with pytest.raises(libs.BuildError, match="compile-checked only"):
        _lib().build("gfx90a")
    assert libs.hip_toolchain() == (str(hip_tree / "bin" / "hipcc"), "HIP version: 5.2.21153-0")


def test_hip_check_all_skips_the_hopper_libraries(monkeypatch):
    seen = []
    monkeypatch.setattr(libs, "check", lambda lib, arch: seen.append((lib.name, arch)) or "")
    res = kernels.build(check_only=True, arch="gfx90a")
    assert seen == [("kosmos", "gfx90a")]
    assert str(res) == "kosmos kernels compile-checked for gfx90a (ag_gemm.cu, gemm_rs.cu, runtime.cu)"


def test_missing_hipcc_is_named(tree, monkeypatch):
    monkeypatch.setattr(libs.shutil, "which", lambda *a, **k: None)
    with pytest.raises(libs.ToolchainMissing, match="hipcc.*apt-get install hipcc libamdhip64-dev"):
        _lib().check("gfx90a")
    assert libs.hip_toolchain() is None
    with pytest.raises(libs.ToolchainMissing, match="nvcc"):
        _lib().check("sm_90a")
