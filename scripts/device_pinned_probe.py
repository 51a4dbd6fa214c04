"""Does copy alone's speed depend on which pinned host pages (or device pages) it uses? In one
process the sweep's points moved between 2145 and 2245 us for the same copy
(scripts/device_point_repeat.py: the third point, every time), together with the fused call.

Copy alone (the 7 peers' shards of one shape, host -> device, back to back, median us) from:
  * fresh: SETS sets of shards, each freshly pinned by torch (CachingHostAllocator);
  * reused: SETS sets pinned after the fresh ones were freed (the allocator's cached blocks);
  * thp: shards in anonymous memory advised MADV_HUGEPAGE, registered with cudaHostRegister;
and into SETS different device destinations from one source set.

    python3 scripts/device_pinned_probe.py OUT_DIR [MxNxK]
"""
from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from _host_point import W, script_args  # scripts/: shared host-fabric set-up

SETS, REPS = int(os.environ.get("PP_SETS", "5")), int(os.environ.get("PP_REPS", "8"))


def shards_pinned(m: int, K: int) -> list[torch.Tensor]:
    return [torch.randn(m, K).to(torch.bfloat16).pin_memory() for _ in range(1, W)]


def shards_thp(m: int, K: int, keep: list) -> list[torch.Tensor]:
    out = []
    for _ in range(1, W):
        n = m * K * 2
        buf = mmap.mmap(-1, n + (2 << 20))
        if hasattr(mmap, "MADV_HUGEPAGE"):
            buf.madvise(mmap.MADV_HUGEPAGE)
        t = torch.frombuffer(buf, dtype=torch.uint8)[:n].view(torch.bfloat16).view(m, K)
        t.copy_(torch.randn(m, K).to(torch.bfloat16))
        rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), n, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {rc}")
        keep.append(buf)
        out.append(t)
    return out


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/pinned-probe")
    m = M // W
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print("THP:", thp.read_text().strip() if thp.exists() else "n/a", flush=True)
    dst = torch.empty((M, K), dtype=torch.bfloat16, device=dev)

    def copy_alone(srcs, d):
        def run():
            for q in range(1, W):
                d[q * m:(q + 1) * m].copy_(srcs[q - 1], non_blocking=True)
        return float(np.median(timing.bench({"x": run}, device=dev, warmup=2, reps=REPS, min_warmup_s=0.05)["x"]))

    rows = []
    fresh = [shards_pinned(m, K) for _ in range(SETS)]
    rows += [{"source": "fresh", "set": i, "median_us": copy_alone(s, dst)} for i, s in enumerate(fresh)]
    del fresh
    gc.collect()
    reused = [shards_pinned(m, K) for _ in range(SETS)]
    rows += [{"source": "reused", "set": i, "median_us": copy_alone(s, dst)} for i, s in enumerate(reused)]
    keep: list = []
    try:
        rows += [{"source": "thp-registered", "set": i, "median_us": copy_alone(shards_thp(m, K, keep), dst)}
                 for i in range(2)]
    except (RuntimeError, AttributeError, ValueError) as e:
        print(f"thp-registered: {e}", flush=True)
    for i in range(SETS):
        d = torch.empty((M, K), dtype=torch.bfloat16, device=dev)
        rows.append({"source": "device dst", "set": i, "median_us": copy_alone(reused[0], d)})
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K)
    df.to_parquet(f"{out}/pinned_probe.parquet")
    print(df.pivot(index="source", columns="set", values="median_us").round(0).to_string(), flush=True)


if __name__ == "__main__":
    main()
