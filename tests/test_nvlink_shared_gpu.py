"""The nvlink fabric in shared-GPU mode on one GPU: W = 2 and 4 rank processes on cuda:0, gloo
group, peers through torch symmetric memory or CUDA IPC (kosmos_bench/shared_gpu_check.py runs
the processes; these tests judge what each rank reported).

Fails on: a wrong element against the fp32 reference (outputs NaN-poisoned, fresh random
inputs per case), outputs that differ bitwise across 3 calls, a late rank (sleeping half the
watchdog timeout before its launch) that fails, a missing watchdog error in any process when
a rank is absent, and a fresh point that does not run correctly afterwards.
One spawn per W (~20-40 s each on an H200).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.hopper]

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("kosmos kernels need an sm_90 GPU", allow_module_level=True)

from kosmos_bench import shared_gpu_check as chk  # noqa: E402

_SESSIONS: dict[int, list[dict]] = {}


def session(W: int) -> list[dict]:
    if W not in _SESSIONS:
        res = chk.run_session(W)
        print("\n".join(chk.summary(W, res)))
        _SESSIONS[W] = res
    res = _SESSIONS[W]
    crashes = [r["crash"] for r in res if r.get("crash")]
    assert not crashes, crashes[0]
    return res


@pytest.mark.parametrize("W", [2, 4])
def test_kosmos_every_policy_correct_and_bitwise_stable(W):
    res = session(W)
    for r in res:
        cases = [c for c in r["cases"] if c["impl"] == "kosmos"]
        want = {(op, b, p) for op, b, _ in chk.KOSMOS_CASES for p in chk.POLICIES}
        assert {(c["op"], c.get("builder"), c["policy"]) for c in cases} == want, cases
        for c in cases:
            assert c["status"] == "ok", f"rank {r['rank']}: {c}"
            assert c["wrong"] == 0 and c["deterministic"], c
            assert c["builder_used"] == c["builder"], c
            assert c["peer_memory"] in ("symm", "cuda-ipc"), c
            if c["peer_memory"] == "cuda-ipc":
                assert c["peer_memory_why"], "the IPC fallback must say why symmetric memory was not used"


@pytest.mark.parametrize("W", [2, 4])
def test_symm_mem_baseline(W):
    res = session(W)
    for r in res:
        cases = [c for c in r["cases"] if c["impl"] == "symm-mem"]
        assert len(cases) == len(chk.SHAPES)
        for c in cases:
            if c["status"] == "skipped":
                pytest.skip(c["error"])
            assert c["status"] == "ok", f"rank {r['rank']}: {c}"


@pytest.mark.parametrize("W", [2, 4])
def test_late_rank_still_succeeds(W):
    res = session(W)
    for r in res:
        assert len(r["late"]) == len(chk.SHAPES)
        for c in r["late"]:
            assert c["status"] == "ok", f"rank {r['rank']}: {c}"
    last = res[-1]["late"]
    assert all(c["seconds"] >= chk.LATE_TIMEOUT_S / 2 for c in last), last


@pytest.mark.parametrize("W", [2, 4])
def test_absent_rank_raises_everywhere_and_gpu_stays_usable(W):
    res = session(W)
    for r in res:
        a = r["absent"]
        assert a.get("watchdog"), f"rank {r['rank']} raised no watchdog error: {a}"
        assert "kosmos watchdog" in a["watchdog"] and "fabric=nvlink" in a["watchdog"], a["watchdog"]
        assert a["seconds"] < chk.ABSENT_TIMEOUT_S + 10, a
        assert a["next"]["status"] == "ok", f"rank {r['rank']}: next point {a['next']}"


def test_nccl_baselines_are_skipped_with_the_reason():
    from kosmos_bench import sharing
    from kosmos_bench.impls import get_impl
    from kosmos_bench.point import Point

    sharing.set_forced(True)
    try:
        for name in ("nccl-seq", "nccl-overlap"):
            p = Point(op="ag-gemm", impl=name, M=96, N=60, K=40, world=2, fabric="nvlink", backend="gpu")
            assert "Duplicate GPU" in (get_impl(name).unsupported(p) or "")
    finally:
        sharing.set_forced(None)
