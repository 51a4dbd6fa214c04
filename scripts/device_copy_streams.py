"""Does a host->device copy's speed depend on the stream that issues it? The driver binds each
stream to a hardware queue and its copies to a copy engine; the sweeps saw copy alone and
kosmos runners move 3-8% between points and runners of one process (results/issue4-h200-20261203,
t9 and run21/run25) with nothing else changed.

1. copy alone (the 7 peers' shards, pinned host -> device) back to back on the default stream,
   on each of torch's 32 pool streams and on 8 high-priority pool streams; two passes.
2. a kosmos runner (self, CE movers; its streams are pool streams of part 1) back to back and
   in the sweep's loop (call, GEMM alone, copy alone), without and with the sweep's NVML clock
   sampler polling every 1 ms; its output checked against torch after.
3. copy alone on the default stream before the runner, while it is alive, after close.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_copy_streams.py OUT_DIR [MxNxK]
    (CS_PARTS=1 runs part 1 only; CS_REPS repetitions per timing, default 8)
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.runtime import nvml
from _host_point import W, host_ce_point, script_args  # scripts/: shared host-fabric set-up
from device_timeline import analyse, profiled_loop

REPS = int(os.environ.get("CS_REPS", "8"))
PARTS = os.environ.get("CS_PARTS", "123")
# streams made before the runner: CS_LOW pool streams, CS_HI high-priority ones; CS_USE=0 makes
# them without copying on them (part 1 is then skipped)
LOW, HI, USE = (int(os.environ.get(k, d)) for k, d in (("CS_LOW", "32"), ("CS_HI", "8"), ("CS_USE", "1")))


def copy_on(stream, dst, shards, m: int):
    """Copy alone issued on `stream` (None: the current stream), joined to the current one."""
    def run():
        main = torch.cuda.current_stream()
        if stream is not None:
            stream.wait_stream(main)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for q in range(1, W):
                dst[q * m:(q + 1) * m].copy_(shards[q], non_blocking=True)
        if stream is not None:
            main.wait_stream(stream)
    return run


def main() -> None:
    out, ((M, N, K), *_), dev = script_args("/tmp/copy-streams")
    p, ctx, inputs = host_ce_point(M, N, K, dev)
    host, m = nccl_impls.host_peers(p, ctx, inputs), M // W
    dst = torch.empty((M, K), dtype=inputs.A[0].dtype, device=dev)
    tag = os.environ.get("CS_TAG", f"pid{os.getpid()}")

    def med(fns: dict, key: str = "x") -> float:
        return float(np.median(timing.bench(fns, device=dev, warmup=2, reps=REPS, min_warmup_s=0.05)[key]))

    streams = {"default": None} | {f"pool{i:02d}": torch.cuda.Stream(dev) for i in range(LOW)} | \
              {f"hi{i}": torch.cuda.Stream(dev, priority=-1) for i in range(HI)}
    handle = {s.cuda_stream: k for k, s in streams.items() if s is not None}
    rows = []
    for ps in ("A", "B") if USE else ():
        for k, s in streams.items():
            rows.append({"part": 1, "what": f"copy on {k}", "stream": k, "pass": ps,
                         "median_us": med({"x": copy_on(s, dst, host.shards, m)})})
    print(f"[{tag}] {LOW} pool + {HI} high-priority streams made{'' if USE else ' (unused)'} before the runner; "
          f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}", flush=True)
    if rows:
        one = pd.DataFrame(rows).pivot(index="stream", columns="pass", values="median_us")
        one["mean"] = one.mean(axis=1)
        print(f"[{tag}] part 1, copy alone by stream (us): min {one['mean'].min():.0f} median {one['mean'].median():.0f} "
          f"max {one['mean'].max():.0f}; pass A vs B per-stream corr "
              f"{np.corrcoef(one['A'], one['B'])[0, 1]:.2f}", flush=True)
    if "2" in PARTS:
        copy = copy_on(None, dst, host.shards, m)
        gemm = nccl_impls.gemm_alone(p, ctx, inputs)
        rows.append({"part": 3, "what": "copy default, before runner", "median_us": med({"x": copy})})
        r = IMPLS[0].prepare(p, ctx, inputs)
        own = [handle.get(s.cuda_stream, "new") for s in r.ce_streams]
        rows.append({"part": 3, "what": "copy default, runner alive", "median_us": med({"x": copy})})
        print(f"runner's copy/flag streams: {', '.join(own)}", flush=True)
        uuid = str(torch.cuda.get_device_properties(dev).uuid)
        for sampled in (False, True):  # the sweep polls NVML every 1 ms while it times (harness._bench)
            with nvml.ClockSampler(uuid if sampled else None):
                tag2 = ", NVML sampler on" if sampled else ""
                rows.append({"part": 2, "what": f"kosmos b2b{tag2}", "median_us": med({"x": r.run})})
                got = timing.bench({"x": r.run, "gemm": gemm, "copy": copy}, device=dev, warmup=2, reps=REPS,
                                   min_warmup_s=0.05)
                rows += [{"part": 2, "what": f"sweep loop {k}{tag2}", "median_us": float(np.median(v))}
                         for k, v in got.items()]
        # where the call's time goes (CUPTI records, scripts/device_timeline.py)
        timed, path = profiled_loop({"x": r.run}, dev, 4)
        c = analyse(path, timed)
        cols = ["timed_us", "c_start_rel", "k_start_rel", "c_end_rel", "k_end_rel", "copy_span_us", "tail_us"]
        print("kosmos call, profiled (us): " + ", ".join(f"{k} {c[k].median():.0f}" for k in cols), flush=True)
        rows += [{"part": 2, "what": f"profiled {k}", "median_us": float(c[k].median())} for k in cols]
        r.run()
        r.check()
        ref = torch.matmul(torch.cat([inputs.A[q] for q in range(W)]), inputs.B[0]).float()
        err = float((r.outputs[0].float() - ref).abs().max() / ref.abs().max())
        print(f"kosmos output after timing: max error / max |ref| = {err:.2e}", flush=True)
        if not err < 1e-2:
            raise SystemExit(f"kosmos output wrong after timing (relative error {err:.3g})")
        r.close()
        rows.append({"part": 3, "what": "copy default, runner closed", "median_us": med({"x": copy})})
        print(pd.DataFrame([x for x in rows if x["part"] > 1])[["what", "median_us"]].round(0).to_string(index=False))
    df = pd.DataFrame(rows).assign(M=M, N=N, K=K, tag=tag)
    df.to_parquet(f"{out}/copy_streams-{tag}.parquet")


if __name__ == "__main__":
    main()
