"""timeline: one traced call, where the workgroups' time goes.

After --warmup untimed calls, one call with role tracing (runner.run_traced: one record per
workgroup and role interval, MOVE / BUILD / REDUCE / WAIT). Prints the idle and role summary the
sweep stores with a traced point (kosmos_bench.trace.summarize), each role's time and tile
durations, and the call cut into --slices equal windows: how many workgroups were building,
moving or idle in each. --trace-out keeps the records (store.TRACE_COLUMNS plus the point's key).

    python3 scripts/probe.py timeline --shape 8192x106496x16384 --set builder=sm90 --set mover=ce
"""
from __future__ import annotations

from .common import emit, points, prepare, shape_name


def add_arguments(p) -> None:
    p.add_argument("--slices", type=int, default=10, help="windows the call is cut into (default 10)")
    p.add_argument("--trace-out", metavar="FILE.parquet", help="write the role records of the traced call")


def show(tr, slices: int, title: str) -> dict:
    """Print one traced call's summary, role table and per-window busy workgroups; returns
    the summary (kosmos_bench.trace.summarize)."""
    import numpy as np

    from kosmos_bench.trace import idle_windows, summarize

    s = summarize(tr)
    print(f"\n# {title}  ({len(tr)} records)")
    print(f"kernel {s.get('kernel_us', float('nan')):9.1f} us  busy {s.get('busy_frac', 0):.3f} "
          f"(move {s.get('busy_frac_move', 0):.3f} build {s.get('busy_frac_build', 0):.3f} "
          f"reduce {s.get('busy_frac_reduce', 0):.3f})  wait {s.get('wait_frac', 0):.3f}  idle {s.get('idle_frac', 0):.3f}")
    print(f"idle windows {s.get('idle_windows', 0)}: total {s.get('idle_total_us', 0):.0f} us, longest "
          f"{s.get('idle_longest_us', 0):.1f}, p50 {s.get('idle_p50_us', 0):.1f}, p90 {s.get('idle_p90_us', 0):.1f}; "
          f"first build {s.get('first_build_us', float('nan')):.1f} us; role switches/WG "
          f"{s.get('role_switches_per_wg', float('nan')):.1f}")
    if tr.empty:
        return s
    dur = (tr.t1_ns - tr.t0_ns) / 1e3
    print(f"{'role':8s} {'records':>8s} {'WGs':>5s} {'total us':>10s} {'median us':>10s} {'p90 us':>8s}")
    for role, g in tr.assign(dur_us=dur).groupby("role"):
        print(f"{role:8s} {len(g):8d} {g.wg.nunique():5d} {g.dur_us.sum():10.0f} {g.dur_us.median():10.1f} "
              f"{g.dur_us.quantile(0.9):8.1f}")
    t0, t1 = int(tr.t0_ns.min()), int(tr.t1_ns.max())
    edges = np.linspace(t0, t1, slices + 1)
    idle = idle_windows(tr)
    print(f"{'window (us)':>15s} " + " ".join(f"{r:>6s}" for r in ("BUILD", "MOVE", "REDUCE", "idle"))
          + f"   (workgroups, of {tr.groupby(['rank', 'wg']).ngroups})")
    for a, b in zip(edges[:-1], edges[1:]):
        def busy(df):  # WG-time inside [a, b), in workgroups
            return float((np.minimum(df.t1_ns, b) - np.maximum(df.t0_ns, a)).clip(lower=0).sum() / (b - a))
        cols = [busy(tr[tr.role == r]) for r in ("BUILD", "MOVE", "REDUCE")] + [busy(idle)]
        print(f"{(a - t0) / 1e3:7.0f}-{(b - t0) / 1e3:7.0f} " + " ".join(f"{c:6.1f}" for c in cols))
    return s


def run(args) -> int:
    import pandas as pd

    from kosmos_bench.store import write_frame

    rows, traces = [], []
    for p in points(args):
        prep = prepare(p)
        try:
            if not hasattr(prep.runner, "run_traced"):
                raise SystemExit(f"probe.py timeline: {p.impl} has no traced call (run_traced)")
            for _ in range(args.warmup):
                prep.runner.run()
            prep.ctx.sync()
            tr = prep.runner.run_traced()
        finally:
            prep.close()
        s = show(tr, args.slices, f"{p.op} {p.impl} {shape_name(p)} W={p.world} {p.fabric} key {p.key()}")
        rows.append({"key": p.key(), "op": p.op, "impl": p.impl, "M": p.M, "N": p.N, "K": p.K, "world": p.world,
                     "fabric": p.fabric, **s})
        traces.append(tr.assign(key=p.key()))
    emit(args, "timeline", rows)
    if args.trace_out and traces:
        write_frame(args.trace_out, pd.concat(traces, ignore_index=True))
        print(f"# wrote the role records to {args.trace_out}")
    return 0
