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
