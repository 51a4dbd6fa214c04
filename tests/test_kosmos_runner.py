"""The kosmos runner's set-up, CPU only: a failure anywhere in set-up closes the runner (so
what it had made is released) and the set-up's own error is the one raised. Releasing real
resources is checked on the GPU (test_kosmos_gpu.py::test_failed_setup_releases_what_it_made)."""
from __future__ import annotations

import pytest
import torch

from kosmos_bench import kernels
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.impls.kosmos import KosmosRunner
from kosmos_bench.point import Point


def test_failed_setup_closes_and_raises_its_own_error(monkeypatch):
    closes = []
    real_close = KosmosRunner.close

    def close(self):
        closes.append(self.closed)
        real_close(self)

    def no_library():
        raise RuntimeError("kosmos library unavailable (injected)")

    monkeypatch.setattr(KosmosRunner, "close", close)
    monkeypatch.setattr(kernels, "load", no_library)
    p = Point(op="ag-gemm", impl="kosmos", M=1024, N=1024, K=256, world=2, fabric="local", seed=0)
    ctx = RankCtx(rank=0, world=2, procs=1, device=torch.device("cpu"), fabric="local", backend="gpu")
    with pytest.raises(RuntimeError, match="injected"):
        KosmosRunner(p, ctx, None)
    assert closes == [False], f"close() calls (closed flag before each): {closes}, expected one"


class _FakeStreamLib:
    """kosmos_stream_create as ctypes sees it: fills the handle behind byref; fails when told."""

    def __init__(self, fail_after: int | None = None):
        self.made, self.fail_after = [], fail_after

    def kosmos_stream_create(self, ref):
        if self.fail_after is not None and len(self.made) >= self.fail_after:
            return 3
        self.made.append(0x1000 + 16 * len(self.made))
        ref._obj.value = self.made[-1]
        return 0

    def kosmos_stream_destroy(self, h):
        self.made.remove(h.value)
        return 0

    def kosmos_last_error(self):
        return b"no streams left (injected)"


def test_plan_streams_are_made_once_per_device_and_shared(monkeypatch):
    import contextlib

    from kosmos_bench.impls import kosmos as K

    monkeypatch.setattr(K, "_PLAN_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
    lib = _FakeStreamLib()
    first = K.plan_streams(lib, 0)
    assert K.plan_streams(lib, 0) == first and len(set(first)) == 2, "runners of one device share one pair"
    other = K.plan_streams(lib, 1)
    assert not set(other) & set(first) and len(lib.made) == 4, "one pair per device, made once"


def test_plan_streams_failure_names_the_cause(monkeypatch):
    import contextlib

    from kosmos_bench.impls import kosmos as K

    monkeypatch.setattr(K, "_PLAN_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
    lib = _FakeStreamLib(fail_after=1)
    with pytest.raises(RuntimeError, match="kosmos_stream_create failed: no streams left"):
        K.plan_streams(lib, 0)
    assert K._PLAN_STREAMS == {} and lib.made == [], "a half-made pair is destroyed, not kept"


def test_ce_settings_defaults_regimes_and_explicit_knobs():
    """One decision for the GPU runner and the simulator: 70b FC1 (link-bound) 3 K-slices, 8-band
    groups, no ramp; 405b FC1 (compute) 2 K-slices, the schedule's groups;
    QKV (copy-bound) 4 slices, per-peer copies, 1-band groups; explicit knobs win; no K-streaming
    without the sm90 builder; bad values are one-line errors."""
    from kosmos_bench import schedule as S
    from kosmos_bench.impls import kosmos as K

    fc1 = K.ce_settings(7168, 132, True, True, env={})  # 70b FC1: link-bound
    assert (fc1.k_stream, fc1.regime, fc1.slices, fc1.merge, fc1.band_group, fc1.tail_bands, fc1.ramp) == \
        (True, "link-bound", K.LINK_BOUND_SLICES, False, K.LINK_BOUND_GROUP, None, False)
    big = K.ce_settings(13312, 132, True, True, env={})  # 405b FC1: link and builders balanced
    assert (big.regime, big.slices, big.merge, big.band_group, big.ramp) == \
        ("compute", K.DEFAULT_CE_SLICES, False, None, None)  # ramp: the schedule's ramp_needed
    fc1_env = K.ce_settings(7168, 132, True, True, env={"KOSMOS_BAND_GROUP": "11", "KOSMOS_BAND_RAMP": "1",
                                                        "KOSMOS_CE_SLICES": "2"})
    assert (fc1_env.band_group, fc1_env.ramp, fc1_env.slices) == (11, True, 2)  # explicit settings win
    qkv = K.ce_settings(1280, 132, True, True, env={})
    assert (qkv.regime, qkv.slices, qkv.merge, qkv.band_group) == ("copy-bound", K.COPY_BOUND_SLICES, True, 1)
    # the last group: a K-slice of its bands on the link >= a slice of a tile on a CTA (H200: 3 bands)
    assert qkv.tail_bands == K.copy_bound_tail_bands(1280, 132) == 3
    assert K.copy_bound_tail_bands(1280, 6) == 1  # at most one wave of tiles
    env = {"KOSMOS_CE_SLICES": "2", "KOSMOS_CE_MERGE": "0", "KOSMOS_BAND_GROUP": "peer", "KOSMOS_CE_TAIL_BANDS": "2"}
    mine = K.ce_settings(1280, 132, True, True, env=env)
    assert (mine.regime, mine.slices, mine.merge, mine.band_group, mine.tail_bands) == \
        ("copy-bound", 2, False, S.PEER_GROUPS, 2)
    assert K.ce_settings(1280, 132, True, True, ce_slices="3,1", env={}).split == (3, 1)
    mma = K.ce_settings(1280, 132, False, True, env={})
    assert (mma.k_stream, mma.regime, mma.merge, mma.band_group) == (False, "", False, None)
    assert not fc1.head_main and K.ce_settings(7168, 132, True, True, env={"KOSMOS_CE_HEAD_MAIN": "1"}).head_main
    assert (big.ramp, big.halve) == (None, True)
    flat = K.ce_settings(7168, 132, True, True, env={"KOSMOS_BAND_RAMP": "0", "KOSMOS_BAND_HALVE": "0"})
    assert (flat.ramp, flat.halve) == (False, False)
    assert (fc1.shared_release, fc1.peer_runs, fc1.local_halve, fc1.local_group) == (True, False, False, 0)
    assert K.ce_settings(7168, 132, True, True, env={"KOSMOS_LOCAL_HALVE": "1"}).local_halve
    knobs = {"KOSMOS_CE_SHARED_RELEASE": "0", "KOSMOS_PEER_RUNS": "1", "KOSMOS_LOCAL_HALVE": "0",
             "KOSMOS_LOCAL_GROUP": "8"}
    both = K.ce_settings(7168, 132, True, True, env=knobs)
    assert (both.shared_release, both.peer_runs, both.local_halve, both.local_group) == (False, True, False, 8)
    for bad in ({"KOSMOS_BAND_GROUP": "x"}, {"KOSMOS_BAND_GROUP": "-2"}, {"KOSMOS_CE_TAIL_BANDS": "-1"},
                {"KOSMOS_CE_HEAD_MAIN": "yes"}, {"KOSMOS_BAND_RAMP": "2"}, {"KOSMOS_BAND_HALVE": "no"},
                {"KOSMOS_CE_SLICE_MB": "-1"}, {"KOSMOS_CE_SLICES": "0"}, {"KOSMOS_CE_SHARED_RELEASE": "2"},
                {"KOSMOS_PEER_RUNS": "x"}, {"KOSMOS_LOCAL_HALVE": "2"}, {"KOSMOS_LOCAL_GROUP": "-1"}):
        with pytest.raises(ValueError, match="KOSMOS_|slice"):
            K.ce_settings(7168, 132, True, True, env=bad)
