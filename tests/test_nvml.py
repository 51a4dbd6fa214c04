"""SM-clock attribution: samples -> the host-time windows of each timed function."""
import time

import numpy as np
import pytest
import torch

from kosmos_bench import timing
from kosmos_bench.runtime import nvml


def test_per_window_takes_the_median_inside_each_functions_windows():
    samples = [(0.5, 1980.0), (1.5, 1400.0), (2.5, 1980.0), (3.5, 1350.0), (4.5, 1985.0), (5.5, 1420.0)]
    windows = {"copy": [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)], "gemm": [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)],
               "never": [(10.0, 11.0)]}
    got = nvml.per_window(samples, windows)
    assert got["copy"] == 1980.0
    assert got["gemm"] == 1400.0
    assert got["never"] is None  # no sample inside: unknown, not 0


def test_per_window_without_samples_or_below_min_samples_is_none():
    assert nvml.per_window([], {"op": [(0.0, 1.0)]}) == {"op": None}
    assert nvml.per_window([(0.5, 1500.0)], {"op": [(0.0, 1.0)]}, min_samples=2) == {"op": None}


def test_sampler_without_a_gpu_is_inert():
    with nvml.ClockSampler(None, period_s=0.001) as s:
        time.sleep(0.01)
    assert not s.active and s.samples == [] and s.read() is None
    assert s.power == [] and s.reasons == [] and s.read_power() is None and s.read_reasons() is None


def test_clock_event_reasons_by_name_and_by_majority_per_window():
    assert nvml.reason_names(0) == "none" and nvml.reason_names(0x1) == "none"  # idle alone says nothing
    assert nvml.reason_names(0x4) == "sw_power_cap"
    assert nvml.reason_names(0x4 | 0x80 | 0x1) == "sw_power_cap+hw_power_brake"
    samples = [(0.1, 0x4), (0.2, 0x4 | 0x80), (0.3, 0x4), (1.1, 0x0), (1.2, 0x1), (1.3, 0x20)]
    got = nvml.reasons_per_window(samples, {"op": [(0.0, 1.0)], "gemm": [(1.0, 2.0)], "never": [(5.0, 6.0)]})
    assert got == {"op": "sw_power_cap", "gemm": "none", "never": None}  # brake in 1 of 3, thermal in 1 of 3
    assert nvml.reasons_per_window(samples, {"op": [(0.0, 1.0)]}, min_samples=4) == {"op": None}
    assert nvml.reasons_per_window(samples[:2], {"op": [(0.0, 1.0)]}) == {"op": "sw_power_cap+hw_power_brake"}


def test_sampler_with_a_fake_library_records_timestamped_samples(monkeypatch):
    class FakeNvml:  # the three entry points the sampler uses, NVML's calling convention
        def nvmlInit_v2(self):
            return 0

        def nvmlDeviceGetHandleByUUID(self, uuid, handle):
            assert uuid == b"GPU-abc"
            return 0

        def nvmlDeviceGetClockInfo(self, handle, kind, out):
            assert kind == nvml.NVML_CLOCK_SM
            out._obj.value = 1755
            return 0

    class FakeNvmlOld(FakeNvml):  # power, and the reasons under their pre-12.2 name
        def nvmlDeviceGetPowerUsage(self, handle, out):
            out._obj.value = 654321  # mW
            return 0

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, out):
            out._obj.value = 0x4 | 0x1
            return 0

    monkeypatch.setattr(nvml, "_lib", lambda: FakeNvml())
    t0 = time.perf_counter()
    with nvml.ClockSampler("abc", period_s=0.001) as s:
        time.sleep(0.03)
    t1 = time.perf_counter()
    assert s.active and len(s.samples) >= 3
    ts = [t for t, _ in s.samples]
    assert ts == sorted(ts) and t0 <= ts[0] and ts[-1] <= t1
    assert {v for _, v in s.samples} == {1755.0}
    assert nvml.per_window(s.samples, {"all": [(t0, t1)]}) == {"all": 1755.0}
    assert s.power == [] and s.reasons == []  # a library without them: the clock alone
    monkeypatch.setattr(nvml, "_lib", lambda: FakeNvmlOld())
    with nvml.ClockSampler("abc", period_s=0.001) as s:
        time.sleep(0.03)
    t1 = time.perf_counter()
    assert len(s.power) == len(s.samples) >= 3 and {w for _, w in s.power} == {654.321}
    assert nvml.reasons_per_window(s.reasons, {"all": [(t0, t1)]}) == {"all": "sw_power_cap"}


def test_bench_reports_each_reps_host_window_in_order():
    def slow():
        time.sleep(0.002)

    windows: dict = {}
    out = timing.bench({"a": slow, "b": slow}, device=torch.device("cpu"), warmup=1, reps=3, min_warmup_s=0.0,
                       windows_out=windows)
    assert set(windows) == {"a", "b"} and all(len(w) == 3 for w in windows.values())
    assert all(w[i][1] <= w[i + 1][0] for w in windows.values() for i in range(2))  # reps in order
    flat = sorted(w for k in ("a", "b") for w in windows[k])  # interleaved: one after the other
    assert all(a < b for a, b in flat) and all(flat[i][1] <= flat[i + 1][0] for i in range(len(flat) - 1))
    for k in ("a", "b"):
        dur = np.array([(b - a) * 1e6 for a, b in windows[k]])
        assert np.allclose(dur, out[k], rtol=0.05, atol=50)


def test_bench_varies_the_order_so_each_function_follows_each_other_equally():
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("op", "gemm", "comm")}
    timing.bench(fns, device=torch.device("cpu"), warmup=1, reps=6, min_warmup_s=0.0)
    timed = calls[-18:]  # after the warm-up round(s)
    assert timed[:9] == ["op", "gemm", "comm", "comm", "gemm", "op", "gemm", "comm", "op"]
    follows = {(a, b): 0 for a in fns for b in fns if a != b}
    for a, b in zip(timed, timed[1:]):
        if a != b:
            follows[a, b] += 1
    assert min(follows.values()) >= 2 and max(follows.values()) - min(follows.values()) <= 2, follows
    assert all(timed.count(k) == 6 for k in fns)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_windows_on_the_device_follow_the_events_and_the_clock_is_read():
    dev = torch.device("cuda", 0)
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    windows: dict = {}
    with nvml.ClockSampler(str(torch.cuda.get_device_properties(dev).uuid), period_s=0.0005) as s:
        t0 = time.perf_counter()
        out = timing.bench({"mm": lambda: x @ x}, device=dev, warmup=3, reps=20, windows_out=windows)
        t1 = time.perf_counter()
    (w,) = windows.values()
    assert len(w) == 20 and all(t0 <= a < b <= t1 + 0.01 for a, b in w)
    assert np.allclose([(b - a) * 1e6 for a, b in w], out["mm"], rtol=1e-3, atol=2)
    assert s.active, "NVML missing on a CUDA machine"
    mhz = nvml.per_window(s.samples, {"all": [(t0, t1)]})["all"]
    assert mhz is not None and 200 < mhz < 4000
    watts = nvml.per_window(s.power, {"all": [(t0, t1)]})["all"]
    assert watts is not None and 20 < watts < 2000
    assert s.reasons and nvml.reasons_per_window(s.reasons, {"all": [(t0, t1)]})["all"] is not None
