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


def test_ag_wgrad_points_kosmos_takes_and_refuses():
    """kosmos ag-wgrad: the sm90 builder, SM or (host, policy self) copy-engine movers; the reasons
    name what is missing."""
    from kosmos_bench.impls.kosmos import IMPLS, _out_tensor

    impl = IMPLS[0]
    assert "ag-wgrad" in impl.ops
    p = Point(op="ag-wgrad", impl="kosmos", M=264, N=1088, K=1600, world=8, fabric="host", policy="self")
    assert impl.unsupported(p) is None
    assert "sm90" in impl.unsupported(p.replace(builder="mma"))
    assert impl.unsupported(p.replace(mover="ce")) is None
    assert "policies" in impl.unsupported(p.replace(mover="ce", policy="fixed:8"))
    assert "host-fabric" in impl.unsupported(p.replace(mover="ce", fabric="local"))
    for mover in ("ce", "sm"):  # band items: the carry-epilogue kernel (tests/test_wgrad_band.py)
        assert impl.unsupported(p.replace(mover=mover, knobs=(("wgrad_items", "band"),))) is None
        assert impl.unsupported(p.replace(mover=mover, knobs=(("wgrad_items", "band"), ("wgrad_group", 1)))) is None
    assert "wgrad_items=band only" in impl.unsupported(p.replace(knobs=(("wgrad_group", 2), ("wgrad_items", "tile"))))
    assert "multiple of 8" in impl.unsupported(p.replace(M=260))
    assert "divisible" in impl.unsupported(p.replace(K=1601))
    assert "bf16" in impl.unsupported(p.replace(dtype="fp16"))
    # out= (the layer step's packed gradient as C_r): checked, never copied
    t = torch.zeros(264 * 136 + 8, dtype=torch.bfloat16)
    good = t[:264 * 136].view(264, 136)
    assert _out_tensor({0: good}, 0, (264, 136), torch.bfloat16) is good
    for bad in ({}, {0: good.t()}, {0: t[1:1 + 264 * 136].view(264, 136)}, {0: good.float()}):
        with pytest.raises(ValueError, match="out"):
            _out_tensor(bad, 0, (264, 136), torch.bfloat16)
