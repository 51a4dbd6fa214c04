"""Host-fabric benchmark of the kosmos kernels (one H200): kosmos self / fixed:k / predicted
against torch.matmul-alone and copy-engine-alone times. Prints a fixed-width table last and
writes JSON to $OUT (or ./device_kernels.json).

    PYTHONPATH=. python3 scripts/device_kernels.py [--quick]
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

from kosmos_bench.impls.base import RankCtx
from kosmos_bench.impls.kosmos import IMPLS
from kosmos_bench.ops import get_op
from kosmos_bench.ops.base import check_output
from kosmos_bench.point import Point

DEV = torch.device("cuda", 0)
W = 8
SHAPES = [("ag-gemm", 8192, 8192, 8192), ("ag-gemm", 16384, 28672, 8192), ("gemm-rs", 8192, 8192, 8192),
          ("gemm-rs", 16384, 8192, 28672)]
# (label, policy, prepare kwargs)
POLICIES = [("self", "self", {}), ("self@8", "self", {"max_inflight": 8}), ("self@16", "self", {"max_inflight": 16}),
            ("self@32", "self", {"max_inflight": 32}), ("self@inf", "self", {"max_inflight": 0}),
            ("fixed:4", "fixed:4", {}), ("fixed:8", "fixed:8", {}), ("fixed:16", "fixed:16", {}),
            ("fixed:32", "fixed:32", {}), ("fixed:48", "fixed:48", {}), ("predicted", "predicted", {}),
            ("self+bulk", "self", {"mover_bulk": True}), ("fixed:8+bulk", "fixed:8", {"mover_bulk": True}),
            ("fixed:16+bulk", "fixed:16", {"mover_bulk": True}), ("self+ce", "self", {"mover": "ce"})]


def bench(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        st[i].record()
        fn()
        en[i].record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) * 1e3 for s, e in zip(st, en)]))


def baselines(op, M, N, K, inputs, A, B):
    m_loc = M // W
    if op == "ag-gemm":
        b0 = inputs.B[0]
        c = torch.empty(M, N // W, dtype=torch.bfloat16, device=DEV)
        t_gemm = bench(lambda: torch.matmul(A, b0, out=c))
        host = torch.empty((W - 1) * m_loc, K, dtype=torch.bfloat16).pin_memory()
        dst = torch.empty_like(host, device=DEV)
        t_h2d = bench(lambda: dst.copy_(host, non_blocking=True))
        return {"t_gemm_us": t_gemm, "t_comm_us": t_h2d, "comm_gbs": host.numel() * 2 / t_h2d / 1e3}
    a0, b0 = inputs.A[0], inputs.B[0]
    c = torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    t_gemm = bench(lambda: torch.matmul(a0, b0, out=c))
    host_in = torch.empty((W - 1) * m_loc, N, dtype=torch.bfloat16).pin_memory()
    host_out = torch.empty((W - 1) * m_loc, N, dtype=torch.bfloat16).pin_memory()
    d_in = torch.empty_like(host_in, device=DEV)
    d_out = torch.empty_like(host_out, device=DEV)
    s2 = torch.cuda.Stream()

    def both():  # push (D2H) and pull (H2D) concurrently on the two copy engines
        s2.wait_stream(torch.cuda.current_stream())
        d_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(s2):
            host_out.copy_(d_out, non_blocking=True)
        torch.cuda.current_stream().wait_stream(s2)

    t_both = bench(both)
    t_h2d = bench(lambda: d_in.copy_(host_in, non_blocking=True))
    return {"t_gemm_us": t_gemm, "t_comm_us": t_both, "t_h2d_us": t_h2d, "comm_gbs": host_in.numel() * 2 / t_h2d / 1e3}


TRACES = []


def main(argv):
    quick = "--quick" in argv
    shapes = SHAPES[::2] if quick else SHAPES
    impl = IMPLS[0]
    rows = []
    for op, M, N, K in shapes:
        p0 = Point(op=op, impl="kosmos", M=M, N=N, K=K, world=W, fabric="host")
        o = get_op(op)
        inputs, A, B = o.inputs(p0, list(range(W)), DEV, seed=1)
        base = baselines(op, M, N, K, inputs, A, B)
        ref = o.reference(A, B, 0, W)
        t_seq = base["t_gemm_us"] + base["t_comm_us"]
        for label, pol, kw in POLICIES:
            if op == "gemm-rs" and (kw.get("mover_bulk") or kw.get("mover")):
                continue  # bulk copies / copy-engine movers are ag-gemm band movers only
            p = p0.replace(policy=pol)
            why = impl.unsupported(p)
            if why:
                rows.append({"op": op, "M": M, "N": N, "K": K, "policy": label, "error": why})
                continue
            ctx = RankCtx(rank=0, world=W, procs=1, device=DEV, fabric="host", backend="gpu")
            t0 = time.time()
            r = impl.prepare(p, ctx, inputs, **kw)
            t_prep = time.time() - t0
            try:
                r.outputs[0].fill_(float("nan"))
                r.run()
                r.check()
                wrong, err = check_output(r.outputs[0], ref, "bf16")
                t = bench(r.run)
                r.check()
                row = {"op": op, "M": M, "N": N, "K": K, "policy": label, "k": r.info["num_movers"],
                       "cap": r.info["max_inflight_movers"],
                       "t_us": t, "wrong": wrong, "max_rel_err": err, "prep_s": t_prep, **base,
                       "t_seq_us": t_seq, "speedup_vs_seq": t_seq / t,
                       "overlap_eff": max(base["t_gemm_us"], base["t_comm_us"]) / t}
                if label in ("self", "predicted", "fixed:8", "self+ce"):
                    df = r.run_traced()
                    TRACES.append(df.assign(op=op, M=M, N=N, K=K, policy=label))
                    nw = df[df.role != "WAIT"].groupby("wg")["role"].nunique()
                    row["roles"] = {k: int(v) for k, v in df.role.value_counts().items()}
                    row["wgs_changing_role"] = int((nw > 1).sum())
                    busy = (df[df.role != "WAIT"].t1_ns - df[df.role != "WAIT"].t0_ns).sum()
                    span = df.t1_ns.max() - df.t0_ns.min()
                    row["busy_frac"] = float(busy / (span * r.grid)) if span > 0 else None
            except Exception as e:  # noqa: BLE001
                row = {"op": op, "M": M, "N": N, "K": K, "policy": label, "error": f"{type(e).__name__}: {e}"}
            finally:
                r.close()
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
        del inputs, A, B, ref
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    if TRACES:
        import pandas as pd

        pd.concat(TRACES, ignore_index=True).to_parquet(os.path.join(out, "traces.parquet"), index=False)
    with open(os.path.join(out, "device_kernels.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    print("\n# kosmos host fabric, W=8 (rank-0 view), 1x " + torch.cuda.get_device_name(0))
    print(f"{'op':8} {'M':>6} {'N':>6} {'K':>6} {'policy':13} {'k':>4} {'t_us':>9} {'gemm_us':>9} {'comm_us':>9} "
          f"{'seq/t':>6} {'ovl_eff':>7} {'wrong':>6}")
    for x in rows:
        if "error" in x:
            print(f"{x['op']:8} {x['M']:6} {x['N']:6} {x['K']:6} {x['policy']:13} ERROR {x['error'][:80]}")
            continue
        print(f"{x['op']:8} {x['M']:6} {x['N']:6} {x['K']:6} {x['policy']:13} {str(x['k'] or x['cap']):>4} {x['t_us']:9.1f} "
              f"{x['t_gemm_us']:9.1f} {x['t_comm_us']:9.1f} {x['speedup_vs_seq']:6.2f} {x['overlap_eff']:7.2f} "
              f"{x['wrong']:6d}")
    bad = [x for x in rows if "error" in x or x.get("wrong")]
    print(f"# {len(rows) - len(bad)}/{len(rows)} points ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
