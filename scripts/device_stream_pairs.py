"""Do two new streams share a hardware queue? Runners that made their CE plan's (copy, flag)
stream pair themselves ran alternately fast and 5.5% slow (probes/b2b_runner_parity.parquet);
a pair whose two streams share one hardware queue would run like releases on the copy stream
(the flag stream's event waits then hold back the next copy: +92 us at 70b FC1 8k). This makes
PAIRS pairs the way runners did (kosmos_stream_create, two per pair) and probes each: a third
stream sleeps ~2 ms and records an event, the pair's flag stream waits for that event, then an
event is recorded on the pair's copy stream. If that event completes while the sleeper still
runs, the copy stream was not held back by the flag stream's wait.

    python3 scripts/device_stream_pairs.py
"""
from __future__ import annotations

import ctypes
import os
import time

import torch

from kosmos_bench import kernels

PAIRS = int(os.environ.get("SP_PAIRS", "6"))


def held_back(cs: torch.cuda.ExternalStream, fs: torch.cuda.ExternalStream, sleeper: torch.cuda.Stream) -> bool:
    gate, mark = torch.cuda.Event(), torch.cuda.Event()
    with torch.cuda.stream(sleeper):
        torch.cuda._sleep(4_000_000)  # ~2 ms at 1980 MHz
        gate.record(sleeper)
    fs.wait_event(gate)
    mark.record(cs)
    time.sleep(0.0005)
    free = mark.query()
    torch.cuda.synchronize()
    return not free


def main() -> None:
    lib = kernels.load()
    torch.cuda.init()
    sleeper = torch.cuda.Stream()
    keep = []
    for i in range(PAIRS):
        hs = []
        for _ in range(2):
            h = ctypes.c_void_p()
            assert lib.kosmos_stream_create(ctypes.byref(h)) == 0, kernels.last_error(lib)
            hs.append(h.value)
        cs, fs = (torch.cuda.ExternalStream(h) for h in hs)
        keep.append((cs, fs))
        print(f"pair {i}: copy stream held back by the flag stream's wait: {held_back(cs, fs, sleeper)}", flush=True)


if __name__ == "__main__":
    main()
