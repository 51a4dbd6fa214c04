"""csrc/ keeps every vendor difference in the platform header (issue 35), CPU only.

* ``#if`` / ``#ifdef`` / ``#ifndef`` / ``#elif``: only in kosmos/platform.cuh, plus the one
  builder choice in kosmos/builder.cuh (``#if KOSMOS_PLATFORM_HIP``: MFMA or mma.sync);
  the C ABI header's ``#ifdef __cplusplus`` guards (a language, not a vendor) are allowed, and
  in the two Hopper-only MoE kernels the build variant ``KOSMOS_MOE_PINGPONG`` (joint or
  ping-pong math warpgroups, two libraries; temporary: the slower build is deleted once both are
  timed, docs/notes/pingpong-plan.md).
* inline assembly and AMD builtins: only in platform.cuh among the files the HIP build
  compiles (the Hopper-only files, builder_sm90.cuh, ag_gemm_sm90.cu, gemm_sm90.cu and the MoE kernels, are
  NVIDIA's alone and excluded).
(The HIP compile itself: ``kosmos-bench build --check --arch gfx90a``, run by .ci/run.)
"""
from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
PLATFORM = CSRC / "kosmos" / "platform.cuh"
BUILDER_CHOICE = CSRC / "kosmos" / "builder.cuh"
HOPPER_ONLY = {"builder_sm90.cuh", "ag_gemm_sm90.cu", "gemm_sm90.cu", "moe_fwd_sm90.cu", "moe_bwd_sm90.cu", "moe_common.cuh"}
COND = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b(.*)$", re.M)
VENDOR = re.compile(r"\basm\b|__builtin_amdgcn_|__hip_atomic_|\b__nanosleep\b|%globaltimer")


def sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cu", ".cuh", ".h"))


def test_preprocessor_choices_only_in_the_platform_header_and_the_builder_choice():
    found = {p.relative_to(CSRC).as_posix(): COND.findall(p.read_text()) for p in sources()}
    found = {k: [c for c in v if c[1].strip() != "__cplusplus"] for k, v in found.items()}
    found = {k: v for k, v in found.items() if v}
    assert found.pop("kosmos/platform.cuh")
    assert found.pop("kosmos/builder.cuh") == [("if", " KOSMOS_PLATFORM_HIP")]
    for moe in ("moe_fwd_sm90.cu", "moe_bwd_sm90.cu"):  # the build variant only (module doc)
        assert {c[1].strip().lstrip("!") for c in found.pop(moe)} == {"KOSMOS_MOE_PINGPONG"}, moe
    assert found == {}


def test_vendor_intrinsics_only_in_the_platform_header():
    offenders = [p.relative_to(CSRC).as_posix() for p in sources()
                 if p != PLATFORM and p.name not in HOPPER_ONLY and VENDOR.search(p.read_text())]
    assert offenders == []


def test_platform_header_has_both_branches():
    text = PLATFORM.read_text()
    assert "#if defined(__HIP__)" in text and "#else" in text
    assert "constexpr int kWarpSize = 64;" in text and "constexpr int kWarpSize = 32;" in text
    assert "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k" in text and "mma.sync.aligned" in text
    assert BUILDER_CHOICE.read_text().count('#include "builder_') == 2
