"""Does the host-fabric AG+GEMM's time depend on how calls follow each other? The same
functions (kosmos self+ce with the default and a ~4 us flag-spin sleep, its CE plan alone
(copies + flag releases, no kernel), nccl-overlap, GEMM alone, copy alone) timed in four
regimes:

* ``loop``: timing.bench's interleaved loop (what a sweep reports; the host runs far ahead),
* ``b2b``: one function back to back (flush, event, call, event; the host runs ahead),
* ``sync``: one function, the host synchronizing after every call (never ahead, ~no idle),
* ``rest``: one function, each call after 50 ms of idle GPU (never ahead, rested clocks),

plus the traced span of one rested kosmos call. Prints median us per function x regime and
the NVML SM clock per regime; writes regime.parquet.

    KOSMOS_BENCH_CACHE=$PWD/.kb-cache python3 scripts/device_regime.py OUT_DIR [MxNxK,...]
"""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import torch

from kosmos_bench import timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.runtime import nvml
from _host_point import host_ce_point, nccl_overlap_run, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("RG_REPS", "10"))


def timed(fn, dev, reps: int, *, sync: bool, rest_s: float = 0.0) -> np.ndarray:
    flush = timing.l2_flush_buffer(dev)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        if rest_s:
            time.sleep(rest_s)
        flush.zero_()
        a.record()
        fn()
        b.record()
        if sync:
            torch.cuda.synchronize(dev)
    torch.cuda.synchronize(dev)
    return np.array([a.elapsed_time(b) * 1e3 for a, b in ev])


def main() -> None:
    out, shapes, dev = script_args("/tmp/regime")
    rows = []
    uuid = str(torch.cuda.get_device_properties(dev).uuid)
    for M, N, K in shapes:
        p, ctx, inputs = host_ce_point(M, N, K, dev)
        runner = IMPLS[0].prepare(p, ctx, inputs)
        os.environ["KOSMOS_SPIN_NS"] = "4096"
        slow_spin = IMPLS[0].prepare(p, ctx, inputs)  # idle builders poll every ~4 us instead of ~32 ns
        os.environ.pop("KOSMOS_SPIN_NS")
        spare = IMPLS[0].prepare(p, ctx, inputs)  # never launched: its CE plan alone
        fns = {"kosmos": runner.run, "kosmos-spin4096": slow_spin.run, "plan": spare.run_ce_plan_alone,
               "nccl-overlap": nccl_overlap_run(p, ctx, inputs),
               "gemm": nccl_impls.gemm_alone(p, ctx, inputs), "copy": nccl_impls.comm_alone(p, ctx, inputs)}
        res: dict[tuple[str, str], np.ndarray] = {}
        mhz: dict[str, float] = {}
        for regime in ("loop", "b2b", "sync", "rest"):
            with nvml.ClockSampler(uuid) as clock:
                t0 = time.perf_counter()
                if regime == "loop":
                    got = timing.bench(fns, device=dev, warmup=3, reps=REPS)
                    res.update({(k, regime): v for k, v in got.items()})
                else:
                    for k, fn in fns.items():
                        timed(fn, dev, 3, sync=False)  # warm-up in this regime's own pattern
                        res[k, regime] = timed(fn, dev, REPS, sync=regime != "b2b",
                                               rest_s=0.05 if regime == "rest" else 0.0)
                t1 = time.perf_counter()
            s = [v for t, v in clock.samples if t0 <= t <= t1]
            mhz[regime] = float(np.median(s)) if s else float("nan")
        time.sleep(0.05)
        timing.l2_flush_buffer(dev).zero_()
        tr = runner.run_traced()
        span = float((tr.t1_ns.max() - tr.t0_ns.min()) / 1e3)
        for r in (runner, slow_spin):
            r.check()
        for r in (runner, slow_spin, spare):
            r.close()
        for (k, regime), v in res.items():
            rows.append({"M": M, "N": N, "K": K, "fn": k, "regime": regime, "median_us": float(np.median(v)),
                         "min_us": float(v.min()), "max_us": float(v.max()), "sm_mhz": mhz[regime]})
        df = pd.DataFrame([r for r in rows if (r["M"], r["N"], r["K"]) == (M, N, K)])
        tab = df.pivot(index="fn", columns="regime", values="median_us")[["loop", "b2b", "sync", "rest"]]
        print(f"\n{M}x{N}x{K}: median us per regime (SM MHz {mhz}); traced rested kosmos span {span:.0f} us")
        print(tab.round(0).to_string())
        rows.append({"M": M, "N": N, "K": K, "fn": "kosmos-traced-span", "regime": "rest", "median_us": span})
        del fns, inputs
        torch.cuda.empty_cache()
    pd.DataFrame(rows).to_parquet(f"{out}/regime.parquet")


if __name__ == "__main__":
    main()
