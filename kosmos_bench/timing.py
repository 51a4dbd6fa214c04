"""Timing: device events after warm-up, L2 flushed between repetitions, robust statistics.

On CUDA each repetition is bracketed by events on the current stream; the L2 flush (a write
of twice the L2 size) happens outside the bracket. On CPU the host clock is used. Samples
are per repetition, in microseconds; multi-rank callers reduce them (max over ranks) before
`stats`.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

_FLUSH: dict[torch.device, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    if device.type != "cuda":
        return None
    if device not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20)
        _FLUSH[device] = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _FLUSH[device]


def bench(fn: Callable[[], None], *, device: torch.device, warmup: int, reps: int, flush_l2: bool = True,
          before_rep: Callable[[], None] | None = None) -> np.ndarray:
    """Run fn warmup times, then time `reps` calls; returns per-call times in microseconds.

    before_rep runs before each timed call, outside the timed region (e.g. a barrier).
    """
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        flush = l2_flush_buffer(device) if flush_l2 else None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if flush is not None:
                flush.zero_()
            if before_rep is not None:
                before_rep()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(device)
        return np.array([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])
    out = np.empty(reps)
    for i in range(reps):
        if before_rep is not None:
            before_rep()
        t0 = time.perf_counter()
        fn()
        out[i] = (time.perf_counter() - t0) * 1e6
    return out


def stats(samples_us: np.ndarray) -> dict:
    s = np.asarray(samples_us, dtype=float)
    med = float(np.median(s))
    return {
        "t_median_us": med,
        "t_min_us": float(s.min()),
        "t_p99_us": float(np.percentile(s, 99)),
        "cv": float(s.std() / s.mean()) if s.mean() > 0 else 0.0,
        "reps": int(s.size),
    }
