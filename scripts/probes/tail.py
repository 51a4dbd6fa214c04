"""tail: where the call's time goes past its last landed byte, and past copy alone.

Timed: the call and the point's copy alone and GEMM alone, interleaved (the sweep's loop);
"past copy" = call - copy alone. Traced (--traced calls, after the timed loop): the kernel's
span (first to last role record) and its tail, from the moment the last data landed to the
end of the last record. "Landed" is read from the records: the end of the last MOVE record
(SM movers), else of the last WAIT record (copy-engine movers: the builders' last wait for a
flag before their last tiles). The tiles that start after it, their count and median length,
are the work that could not overlap the copy.

    python3 scripts/probe.py tail --shape 8192x57344x8192,8192x106496x16384 --set builder=sm90 --set mover=ce
"""
from __future__ import annotations

from .common import alone, bench, check, emit, points, prepare, shape_name


def add_arguments(p) -> None:
    p.add_argument("--traced", type=int, default=3, help="traced calls whose tails are shown (default 3)")


def landed_tail(tr) -> dict:
    """Span, landed time and tail (us) of one traced call, from its role records."""
    t0, t1 = int(tr.t0_ns.min()), int(tr.t1_ns.max())
    mv, wt = tr[tr.role == "MOVE"], tr[tr.role == "WAIT"]
    src = mv if len(mv) else wt
    landed = int(src.t1_ns.max()) if len(src) else t0
    late = tr[(tr.role == "BUILD") & (tr.t0_ns >= landed)]
    return {"span_us": (t1 - t0) / 1e3, "landed_us": (landed - t0) / 1e3, "tail_us": (t1 - landed) / 1e3,
            "landed_by": "MOVE" if len(mv) else "WAIT", "late_tiles": len(late),
            "late_tile_us": float(((late.t1_ns - late.t0_ns) / 1e3).median()) if len(late) else 0.0}


def run(args) -> int:
    import torch

    rows = []
    for p in points(args):
        prep = prepare(p)
        try:
            wrong, err = check(prep)
            fns = {"call": prep.runner.run, **alone(prep)}
            t = bench(fns, p, prep.ctx.device)
            traced = [landed_tail(prep.runner.run_traced()) for _ in range(args.traced)] \
                if hasattr(prep.runner, "run_traced") else []
        finally:
            prep.close()
            torch.cuda.empty_cache()
        copy = t.get("copy", 0.0)  # world 1: no collective
        print(f"\n# {p.op} {p.impl} {shape_name(p)} W={p.world} {p.fabric} key {p.key()}  wrong {wrong}")
        print(f"call {t['call']:.1f} us  copy alone {copy:.1f}  gemm alone {t['gemm']:.1f}  past copy "
              f"{t['call'] - copy:.1f} us  eff {max(copy, t['gemm']) / t['call']:.3f}")
        if traced:
            print(f"{'traced':>6s} {'span(us)':>9s} {'landed':>9s} {'tail':>7s} {'by':>5s} {'late tiles':>10s} {'tile us':>8s}")
        for i, r in enumerate(traced):
            print(f"{i:6d} {r['span_us']:9.1f} {r['landed_us']:9.1f} {r['tail_us']:7.1f} {r['landed_by']:>5s} "
                  f"{r['late_tiles']:10d} {r['late_tile_us']:8.1f}")
            rows.append({"key": p.key(), "M": p.M, "N": p.N, "K": p.K, "traced": i, "t_us": t["call"], "t_comm_us": copy,
                         "t_gemm_us": t["gemm"], "wrong": wrong, "max_rel_err": err, **r})
    emit(args, "tail", rows)
    return 0
