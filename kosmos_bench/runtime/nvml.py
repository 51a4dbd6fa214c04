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
"""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

NVML_CLOCK_SM = 1


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

    def _run(self) -> None:
        while not self._stop.is_set():
            v = self.read()
            if v is not None:
                self.samples.append((time.perf_counter(), v))
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
