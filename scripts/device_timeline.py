"""Where the time of one host-fabric AG+GEMM call goes, from the GPU's own activity records
(CUPTI through torch.profiler): the same interleaved loop as timing.bench (L2 flush, event,
call, event) for kosmos (self, ce movers, one runner per TL_VARIANTS entry), nccl-overlap,
GEMM alone and copy alone, each call wrapped in an annotation so its GPU work is found by
correlation id.

Per function (medians over the profiled reps, us): the event-timed duration; the GPU span
from the flush's end to the last GPU activity of the call; when the first copy and the kernel
start after the flush; the kernel's duration; the last copy's end relative to the kernel's
end; the host's lead (GPU start of the call minus the host time its launch was issued: < 0
means the GPU waited for the host).

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_timeline.py OUT_DIR [MxNxK,...]
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch

from kosmos_bench import schedule as S
from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.runtime import nvml
from kosmos_bench.trace import gpu_work_per_range
from _host_point import W, host_ce_point, nccl_overlap_run, script_args  # scripts/: shared host-fabric set-up

# kosmos variants: "h<MB>" = KOSMOS_CE_HEAD_MB, then optional ".<key><value>" parts: s = ce_slices
# (K-slices of the last group; "s3-1": 4 slices in 2 copies, ce_plan.parse_split; "sd": the
# runner's default), g = bands per group (KOSMOS_BAND_GROUP, 0: the default),
# t = sliced groups at the end (KOSMOS_CE_TAIL_GROUPS), b = flag-spin sleep in ns (KOSMOS_SPIN_NS),
# m1 = one copy per peer before the sliced groups (KOSMOS_CE_MERGE),
# e.g. TL_VARIANTS=h0,h0.s2,h0.s2.g4,h0.s2.b1024
VARIANTS = [v for v in os.environ.get("TL_VARIANTS", "h0,h0.s2").split(",") if v]
VARIANT_ENV = {"h": "KOSMOS_CE_HEAD_MB", "g": "KOSMOS_BAND_GROUP", "t": "KOSMOS_CE_TAIL_GROUPS", "b": "KOSMOS_SPIN_NS",
               "m": "KOSMOS_CE_MERGE"}
# reference functions besides kosmos, nccl-overlap, GEMM and copy alone (TL_EXTRA="" drops them)
EXTRA = [f for f in os.environ.get("TL_EXTRA", "plan,plan-copies,copy2").split(",") if f]


def variant(v: str) -> tuple[dict[str, str], str | None]:
    """(environment of the runner, ce_slices) of one TL_VARIANTS entry."""
    kw = {q[0]: q[1:] for q in v.split(".")}
    unknown = set(kw) - set(VARIANT_ENV) - {"s"}
    if unknown or "h" not in kw:
        raise SystemExit(f"TL_VARIANTS entry {v!r}: expected h<MB>[.s<S>|.s<a>-<b>...][.g<G>][.t<T>][.b<ns>][.m1]")
    s = kw.get("s", "1")  # "sd": the runner's own default (regime rules included)
    return {VARIANT_ENV[k]: val for k, val in kw.items() if k != "s"}, None if s == "d" else s.replace("-", ",")


def plan_copies_only(r, M: int):
    """The whole-band CE plan's copies, same order and sizes, one stream, no flag releases."""
    m, side = M // W, torch.cuda.Stream(r.dev)
    cps = [(r.ce_work[e.peer * m + e.row0:e.peer * m + e.row0 + e.rows], r._host_A[e.peer][e.row0:e.row0 + e.rows])
           for e in r.ce_entries if e.rows]

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for d, s in cps:
                d.copy_(s, non_blocking=True)
        main.wait_stream(side)
    return run


def copy_two_streams(p, ctx, inputs):
    """Copy alone with the peers' shards dealt to two streams (can two engines beat one?)."""
    host, m = nccl_impls.host_peers(p, ctx, inputs), p.M // W
    dst = torch.empty((p.M, p.K), dtype=inputs.A[0].dtype, device=ctx.device)
    side = [torch.cuda.Stream(ctx.device) for _ in range(2)]

    def run():
        main = torch.cuda.current_stream()
        for q in range(1, W):
            s = side[q % 2]
            s.wait_stream(main)
            with torch.cuda.stream(s):
                dst[q * m:(q + 1) * m].copy_(host.shards[q], non_blocking=True)
        for s in side:
            main.wait_stream(s)
    return run


def profiled_loop(fns: dict, dev, reps: int):
    """timing.bench's timed loop under the profiler; returns (event-timed us per fn, trace path)."""
    flush = timing.l2_flush_buffer(dev)
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for k in fns}
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(reps):
            for k, fn in fns.items():
                with torch.profiler.record_function(f"flush|{i}|{k}"):
                    flush.zero_()
                ev[k][i][0].record()
                with torch.profiler.record_function(f"call|{i}|{k}"):
                    fn()
                ev[k][i][1].record()
        torch.cuda.synchronize(dev)
    path = f"/tmp/timeline-{os.getpid()}.json"
    prof.export_chrome_trace(path)
    return {k: np.array([s.elapsed_time(e) * 1e3 for s, e in ev[k]]) for k in fns}, path


def analyse(path: str, timed: dict) -> pd.DataFrame:
    df = gpu_work_per_range(path)
    df[["what", "rep", "fn"]] = df["name"].str.split("|", expand=True)
    df["rep"] = df["rep"].astype(int)
    fl = df[df.what == "flush"].set_index(["rep", "fn"])["gpu_end"]
    c = df[df.what == "call"].copy()
    c["flush_end"] = [fl.get((r, f), np.nan) for r, f in zip(c.rep, c.fn)]
    c["timed_us"] = [timed[f][r] for r, f in zip(c.rep, c.fn)]
    for col in ("gpu_end", "k_start", "k_end", "c_start", "c_end"):
        c[col + "_rel"] = c[col] - c["flush_end"]
    c["kernel_us"] = c.k_end - c.k_start
    c["copy_span_us"] = c.c_end - c.c_start
    c["tail_us"] = c.k_end - c.c_end  # kernel time after the last copied byte
    return c


def main() -> None:
    out, shapes, dev = script_args("/tmp/timeline", "8192x57344x8192,8192x106496x16384")
    reps = int(os.environ.get("TL_REPS", "6"))
    frames = []
    for M, N, K in shapes:
        p, ctx, inputs = host_ce_point(M, N, K, dev)
        fns, runners = {}, []
        for v in VARIANTS:
            env, slices = variant(v)
            os.environ.update(env)
            try:
                r = IMPLS[0].prepare(p, ctx, inputs, ce_slices=slices)
            finally:
                for k in env:
                    os.environ.pop(k)
            runners.append(r)
            fns[f"kosmos-{v}"] = r.run
        spare = IMPLS[0].prepare(p, ctx, inputs, ce_slices=1)  # never launched: its plan alone
        if "plan" in EXTRA:
            fns["plan"] = spare.run_ce_plan_alone  # copies + flag releases, no kernel
        if "plan-copies" in EXTRA:
            fns["plan-copies"] = plan_copies_only(spare, M)  # the same copies, no releases
        fns["nccl-overlap"] = nccl_overlap_run(p, ctx, inputs)
        fns["gemm"] = nccl_impls.gemm_alone(p, ctx, inputs)
        fns["copy"] = nccl_impls.comm_alone(p, ctx, inputs)
        if "copy2" in EXTRA:
            fns["copy2"] = copy_two_streams(p, ctx, inputs)
        # unprofiled first: the numbers the sweep would report, then the same loop profiled
        windows: dict = {}
        with nvml.ClockSampler(str(torch.cuda.get_device_properties(dev).uuid)) as clock:
            plain = timing.bench(fns, device=dev, warmup=3, reps=reps, windows_out=windows)
        mhz = nvml.per_window(clock.samples, windows)
        timed, path = profiled_loop(fns, dev, reps)
        for r in runners:
            r.check()
        if os.environ.get("TL_TRACE"):  # role trace of the first variant's call, after a flush
            timing.l2_flush_buffer(dev).zero_()
            tr = runners[0].run_traced()
            tab = runners[0].scheds[0].builders.table
            b = tr.role == "BUILD"
            for f in ("peer", "m0", "n0"):
                tr.loc[b, f] = tab[tr.item[b].values, S.F[f]]
            tr.assign(M=M, N=N, K=K, variant=VARIANTS[0]).to_parquet(f"{out}/trace-{M}x{N}x{K}.parquet")
        runners.append(spare)
        c = analyse(path, timed).assign(M=M, N=N, K=K)
        c["plain_us"] = [float(np.median(plain[f])) for f in c.fn]
        c["sm_mhz"] = [mhz.get(f) for f in c.fn]
        frames.append(c)
        print(f"\n{M}x{N}x{K}: medians (us), times after the flush's end")
        cols = ["plain_us", "sm_mhz", "timed_us", "gpu_end_rel", "c_start_rel", "k_start_rel", "kernel_us", "c_end_rel",
                "k_end_rel", "copy_span_us", "tail_us", "lead_us", "n_copies"]
        print(c.groupby("fn", sort=False)[cols].median().round(1).to_string())
        for r in runners:
            r.close()
        del fns, runners, inputs
        torch.cuda.empty_cache()
    pd.concat(frames).to_parquet(f"{out}/timeline.parquet")


if __name__ == "__main__":
    main()
