"""Where the fused call's time goes past copy alone (host fabric, sm90 + CE movers), back to back
in one fresh process per variant (variants from the environment, as device_b2b_variant.py).
Each repetition: L2 flush, then events on the main stream before the call (t0) and after it
(t_end), and on the plan's copy and flag streams right after the call's enqueue (t_copies: the
last copy has landed; t_flags: the last release is written). Medians over the repetitions:

  span    t0 -> t_copies   (the call's start hop + every copy)
  flags   t_copies -> t_flags  (the last release after the last byte)
  tail    t_copies -> t_end    (what the kernel still computes after the last byte, + exit)
  total   t0 -> t_end          (the timed call)

and copy alone (nccl_impls.comm_alone, one copy per peer) and the runner's plan alone (copies +
releases, no kernel; timed last: its releases would make later kernel calls wrong) the same way.

    B2B_TAG=inline KOSMOS_CE_TAIL_INLINE=1 python3 scripts/device_tail_probe.py OUT [MxNxK,...]
Prints one line per shape; appends rows to OUT/tail_probe.parquet.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from kosmos_bench import harness, timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.kosmos import KosmosImpl
from _host_point import append_rows, host_ce_point, script_args

REPS = int(os.environ.get("B2B_REPS", "30"))
WARMUP = 5


def timed(fn, dev, streams=()) -> np.ndarray:
    """(reps, 2 + len(streams)) event times in us relative to t0: [t_end, t_stream...]."""
    flush = timing.l2_flush_buffer(dev)
    main = torch.cuda.current_stream(dev)
    rows = []
    for r in range(WARMUP + REPS):
        flush.zero_()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 + len(streams))]
        ev[0].record(main)
        fn()
        for e, s in zip(ev[2:], streams):
            e.record(s)
        ev[1].record(main)
        if r >= WARMUP:
            rows.append(ev)
    torch.cuda.synchronize(dev)
    return np.array([[ev[0].elapsed_time(e) * 1e3 for e in ev[1:]] for ev in rows])


def main() -> None:
    out, shapes, dev = script_args("/tmp/tail-probe")
    tag = os.environ.get("B2B_TAG", "default")
    rows = []
    for M, N, K in shapes:
        p, ctx, inputs, A, B = host_ce_point(M, N, K, dev, with_ref=True)
        runner = KosmosImpl().prepare(p, ctx, inputs)
        wrong, err, same = harness._check(runner, p, ctx, A, B)
        del A, B
        copy = nccl_impls.comm_alone(p, ctx, inputs)
        cs, fs = runner.ce_streams
        c = np.median(timed(copy, dev)[:, 0])
        k = np.median(timed(runner.run, dev, (cs, fs)), axis=0)  # t_end, t_copies, t_flags
        spare = KosmosImpl().prepare(p, ctx, inputs)  # the same plan, timed without the kernel
        runner.close()
        pl = np.median(timed(spare.run_ce_plan_alone, dev)[:, 0])
        spare.close()
        row = {"tag": tag, "M": M, "N": N, "K": K, "total_us": k[0], "span_us": k[1], "flags_us": k[2] - k[1],
               "tail_us": k[0] - k[1], "copy_us": c, "plan_us": pl, "eff": c / k[0], "wrong": wrong, "bitwise": same,
               "ce_copies": runner.ce_copies}
        rows.append(row)
        print(f"{tag:10s} {M}x{N}x{K}: total {k[0]:.0f} = span {k[1]:.0f} + tail {k[0] - k[1]:.0f} us "
              f"(last release +{k[2] - k[1]:.1f})  copy alone {c:.0f}  plan alone {pl:.0f}  eff {c / k[0]:.3f}  "
              f"copies {runner.ce_copies}  wrong {wrong} bitwise {same}", flush=True)
    append_rows(out, "tail_probe.parquet", rows)


if __name__ == "__main__":
    main()
