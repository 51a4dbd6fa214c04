"""Timing: device events after warm-up, L2 flushed between repetitions, robust statistics.

Functions compared with each other (the fused op, its GEMM alone, its collective alone) are
timed interleaved in one loop.

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


def rep_order(names: list[str], i: int) -> list[str]:
    """The order of rep i: rotation i // 2 of names, reversed on odd reps. Over 2n reps every
    function is in every position and, for n <= 3, follows every other equally often."""
    j = (i // 2) % len(names) if names else 0
    order = names[j:] + names[:j]
    return order[::-1] if i % 2 else order


def bench(fns: dict[str, Callable[[], None]], *, device: torch.device, warmup: int, reps: int,
          flush_l2: bool = True, before_rep: Callable[[], None] | None = None,
          min_warmup_s: float = 0.2, agree: Callable[[bool], bool] | None = None,
          windows_out: dict[str, list[tuple[float, float]]] | None = None) -> dict[str, np.ndarray]:
    """Time several functions *interleaved*, rep by rep; returns per-call microseconds each.

    Interleaving puts every function under the same clock and thermal state (a GPU that
    throttles under sustained GEMMs would otherwise favour whichever was timed first), so
    ratios such as fused / GEMM-alone are honest. The order changes from rep to rep
    (rep_order) so that no function always follows the same one: a fixed order made copy
    alone always follow the GEMM alone, where it ran 5% slower than the same copy after
    the fused op (results/issue4-h200-20261203/, run20). Warm-up runs each function `warmup` times
    and keeps going until `min_warmup_s` has passed, so clocks have ramped up.
    before_rep runs before each timed call, outside the timed region (e.g. a barrier);
    agree(more) makes ranks agree on warming up once more (any rank wants more -> all do),
    since ranks that call collectives a different number of times deadlock.
    windows_out, if given, receives each function's (start, end) per rep on the host's
    perf_counter clock (device events mapped through one reference event recorded on the
    idle device), for attributing sampled clocks (runtime.nvml).
    """
    t0, n = time.perf_counter(), 0
    while True:
        more = n < warmup or (time.perf_counter() - t0 < min_warmup_s and n < 10 * warmup + 100)
        if agree is not None:
            more = agree(more)
        if not more:
            break
        for fn in fns.values():
            fn()
        n += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    names = list(fns)
    if device.type == "cuda":
        flush = l2_flush_buffer(device) if flush_l2 else None
        ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for k in names}
        ref = torch.cuda.Event(enable_timing=True)
        ref.record()  # the device is idle (synchronized above): it stamps this at once
        t_ref = time.perf_counter()
        for i in range(reps):
            for k in rep_order(names, i):
                if flush is not None:
                    flush.zero_()
                if before_rep is not None:
                    before_rep()
                ev[k][i][0].record()
                fns[k]()
                ev[k][i][1].record()
        torch.cuda.synchronize(device)
        if windows_out is not None:
            for k in names:
                windows_out[k] = [(t_ref + ref.elapsed_time(s) * 1e-3, t_ref + ref.elapsed_time(e) * 1e-3)
                                  for s, e in ev[k]]
        return {k: np.array([s.elapsed_time(e) * 1e3 for s, e in ev[k]]) for k in names}
    out = {k: np.empty(reps) for k in names}
    for i in range(reps):
        for k in rep_order(names, i):
            if before_rep is not None:
                before_rep()
            t = time.perf_counter()
            fns[k]()
            t1 = time.perf_counter()
            out[k][i] = (t1 - t) * 1e6
            if windows_out is not None:
                windows_out.setdefault(k, []).append((t, t1))
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
