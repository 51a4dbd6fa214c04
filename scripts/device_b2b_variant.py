"""One kosmos runner (host fabric, sm90 + CE movers) in a fresh process, timed back to back
(timing.bench with L2 flush, one function at a time), with copy alone (nccl_impls.comm_alone,
the sweep's "copy alone") timed the same way before and after it. Variants come from the
environment (KOSMOS_CE_SLICES, KOSMOS_BAND_GROUP, ...), so a shell loop runs one process per
variant: in-process comparisons of several runners are biased (the second runner a process
creates ran 2.6-4.5% slow, copy alone with it: results/issue4-h200-20261203/, point_repeat).
B2B_RUNNERS=n makes n runners per shape one after another (each closed before the next),
B2B_DUMMY_STREAMS=k creates k raw CUDA streams before each, B2B_KEEP=1 keeps every runner
open (probing that bias).

    B2B_TAG=s4 KOSMOS_CE_SLICES=4 python3 scripts/device_b2b_variant.py OUT_DIR [MxNxK,...]
Prints one line per shape; appends rows to OUT_DIR/b2b_variant.parquet.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from kosmos_bench import harness, kernels, timing
from kosmos_bench.impls import nccl as nccl_impls
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.impls.kosmos import KosmosImpl
from kosmos_bench.ops import get_op
from kosmos_bench.point import Point
from _host_point import W, append_rows, script_args  # scripts/: shared host-fabric set-up

REPS = int(os.environ.get("B2B_REPS", "30"))
RUNNERS = int(os.environ.get("B2B_RUNNERS", "1"))  # runners made one after another per shape
DUMMY = int(os.environ.get("B2B_DUMMY_STREAMS", "0"))  # raw CUDA streams made (and kept) before each
KEEP = os.environ.get("B2B_KEEP") == "1"  # keep every runner open (no address reuse between runners)


def main() -> None:
    out, shapes, dev = script_args("/tmp/b2b-variant")
    tag = os.environ.get("B2B_TAG", "default")
    rows, dummies = [], []
    for (M, N, K), nr in ((shape, nr) for shape in shapes for nr in range(RUNNERS)):
        p = Point(op="ag-gemm", impl="kosmos", M=M, N=N, K=K, world=W, fabric="host", policy="self", seed=0,
                  builder="sm90", mover="ce")
        ctx = RankCtx(rank=0, world=W, procs=1, device=dev, fabric="host", backend="gpu")
        inputs, A, B = get_op("ag-gemm").inputs(p, list(range(W)), dev, seed=1)
        for _ in range(DUMMY):  # moves the driver's round-robin of hardware queues on
            h = ctypes.c_void_p()
            kernels.load().kosmos_stream_create(ctypes.byref(h))
            dummies.append(h)
        runner = KosmosImpl().prepare(p, ctx, inputs)
        wrong, err, same = harness._check(runner, p, ctx, A, B)
        del A, B
        copy = nccl_impls.comm_alone(p, ctx, inputs)

        def b2b(fn):
            return float(np.median(timing.bench({"x": fn}, device=dev, warmup=5, reps=REPS)["x"]))

        c0 = b2b(copy)
        k0 = b2b(runner.run)
        c1 = b2b(copy)
        k1 = b2b(runner.run)
        addrs = {"state": runner.state.data_ptr(), "flags": runner.flag_tensors[0].data_ptr(),
                 "C": runner.outputs[0].data_ptr(), "work": runner.ce_work.data_ptr()}
        if KEEP:
            dummies.append(runner)
        else:
            runner.close()
        copy_us, kos_us = min(c0, c1), float(np.median([k0, k1]))
        rows.append({"tag": tag, "runner": nr, "M": M, "N": N, "K": K, "kosmos_us": kos_us, "kosmos_runs": f"{k0:.0f},{k1:.0f}",
                     "copy_us": copy_us, "copy_runs": f"{c0:.0f},{c1:.0f}", "eff": copy_us / kos_us,
                     "wrong": wrong, "bitwise": same, "ce_copies": getattr(runner, "ce_copies", None),
                     **{f"{k}_ptr": hex(v) for k, v in addrs.items()}})
        print(f"{tag:14s} #{nr} {M}x{N}x{K}: kosmos {k0:.0f},{k1:.0f} us  copy {c0:.0f},{c1:.0f} us  "
              f"eff {copy_us / kos_us:.3f}  copies {rows[-1]['ce_copies']}  wrong {wrong} bitwise {same}  "
              + " ".join(f"{k} {v:#x}" for k, v in addrs.items()), flush=True)
    append_rows(out, "b2b_variant.parquet", rows)


if __name__ == "__main__":
    main()
