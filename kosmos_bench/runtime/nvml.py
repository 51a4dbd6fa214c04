"""SM clock while each timed function runs, read from NVML (the driver's libnvidia-ml, through
ctypes: no extra dependency).

Why: a power-limited GPU clocks a GEMM lower when it runs beside a copy, or after other
GEMMs, than when it follows a low-power copy phase, so "GEMM alone" inside an interleaved
loop can be faster than any GEMM that overlaps a copy can be. Storing the SM clock each
function ran at lets a reader tell a slower kernel from a lower clock.

A background thread polls the SM clock every `period_s` (host perf_counter timestamps);
`per_window` attributes the samples to the host-time windows of each function's reps
(timing.bench maps its device events onto the host clock). The driver refreshes the reading
every few ms, so for interleaved calls of a few ms each the per-function medians blur into
each other; what they show reliably is the point's clock regime (1980 MHz = not power
limited on the H200; 1600-1850 on the 405b FC1 host points). Without NVML (CPU machines,
ROCm) the sampler is inert and every attribution is None.

With each clock it also reads the board power (W) and the driver's clock-event reasons (why the
clock is below its maximum: the power cap, a power brake, thermal, ...): a kernel that runs at a
lower clock *below* the power limit is held back by something else than the average power
(the fused AG+GEMM on 405b FC1 ran at 1410 MHz and 660 W where cuBLAS ran 1485 MHz at 700 W).
"""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

NVML_CLOCK_SM = 1
# nvmlClocksEventReasons bits (nvml.h); the idle bit says nothing about a running kernel.
CLOCK_EVENT_REASONS = {0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
                       0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}


def reason_names(mask: int) -> str:
    """The clock-event reasons in a bitmask, '+'-joined in bit order ('none' if none is set)."""
    names = [n for bit, n in sorted(CLOCK_EVENT_REASONS.items()) if mask & bit]
    return "+".join(names) or "none"


def _lib():
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class ClockSampler:
    """Context manager: polls the SM clock (MHz) of the GPU with this UUID while open."""

    def __init__(self, uuid: str | None, period_s: float = 0.001):
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []  # (perf_counter s, MHz)
        self.power: list[tuple[float, float]] = []  # (perf_counter s, W)
        self.reasons: list[tuple[float, int]] = []  # (perf_counter s, clock-event reason bits)
        self._stop = threading.Event()
        self._thread = None
        self._handle = None
        self._nvml = _lib() if uuid else None
        if self._nvml is None:
            return
        try:
            if self._nvml.nvmlInit_v2() != 0:
                self._nvml = None
                return
            h = ctypes.c_void_p()
            u = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            if self._nvml.nvmlDeviceGetHandleByUUID(u.encode(), ctypes.byref(h)) != 0:
                self._nvml = None
                return
            self._handle = h
        except AttributeError:  # a library without these entry points
            self._nvml = None

    @property
    def active(self) -> bool:
        return self._nvml is not None

    def read(self) -> float | None:
        if not self.active:
            return None
        mhz = ctypes.c_uint()
        if self._nvml.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        return float(mhz.value)

    def read_power(self) -> float | None:
        """Board power (W), or None (no NVML, or the reading is not supported)."""
        mw = ctypes.c_uint()
        try:
            if not self.active or self._nvml.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(mw)) != 0:
                return None
        except AttributeError:
            return None
        return mw.value / 1e3

    def read_reasons(self) -> int | None:
        """The clock-event reason bits now (CLOCK_EVENT_REASONS), or None."""
        bits = ctypes.c_ulonglong()
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nvml, name, None) if self.active else None
            if fn is not None:
                return int(bits.value) if fn(self._handle, ctypes.byref(bits)) == 0 else None
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            v = self.read()
            if v is not None:
                t = time.perf_counter()
                self.samples.append((t, v))
                w, r = self.read_power(), self.read_reasons()
                if w is not None:
                    self.power.append((t, w))
                if r is not None:
                    self.reasons.append((t, r))
            self._stop.wait(self.period_s)

    def __enter__(self) -> "ClockSampler":
        if self.active:
            self._thread = threading.Thread(target=self._run, name="nvml-clock", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()


def per_window(samples: list[tuple[float, float]], windows: dict[str, list[tuple[float, float]]],
               min_samples: int = 1) -> dict[str, float | None]:
    """Median sampled value inside each name's (start, end) windows; None with fewer than
    `min_samples` samples there (windows shorter than the polling period, no NVML)."""
    if not samples:
        return {k: None for k in windows}
    s = np.asarray(samples, dtype=float)
    t, v = s[:, 0], s[:, 1]
    out = {}
    for k, ws in windows.items():
        inside = np.zeros(t.shape, dtype=bool)
        for a, b in ws:
            inside |= (t >= a) & (t <= b)
        out[k] = float(np.median(v[inside])) if inside.sum() >= min_samples else None
    return out


def reasons_per_window(samples: list[tuple[float, int]], windows: dict[str, list[tuple[float, float]]],
                       min_samples: int = 1) -> dict[str, str | None]:
    """The clock-event reasons set in at least half of each name's samples ('none': no reason
    but idle that often); None with fewer than `min_samples` samples inside its windows."""
    out = {}
    for k, ws in windows.items():
        inside = [r for t, r in samples if any(a <= t <= b for a, b in ws)]
        if len(inside) < min_samples or not inside:
            out[k] = None
            continue
        mask = sum(bit for bit in CLOCK_EVENT_REASONS if 2 * sum(1 for r in inside if r & bit) >= len(inside))
        out[k] = reason_names(mask)
    return out
