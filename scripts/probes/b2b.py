"""b2b: variants of one point timed back to back in one process.

Each --variant is the point with more configuration fields ("NAME: field=value field=value";
the shared --set pairs apply to all). Every variant gets its own runner and fresh inputs (seeded
by its point's key), is checked once on poisoned outputs, and all of them are timed interleaved
with the point's GEMM alone and copy alone (kosmos_bench.timing.bench: L2 flushed, order rotated
every repetition), --rounds times. eff = max(GEMM alone, copy alone) / t, as the sweep's
overlap efficiency; "vs first" is the first variant's time over this one's.

Runners made one after another in one process can differ by a few percent for reasons that
are not the variant (the pinned pages they get): compare --rounds, swap the order of the
variants, or run one process per variant to confirm a small gain.

    python3 scripts/probe.py b2b --set builder=sm90 --set mover=ce \\
        --variant "self: policy=self" --variant "fixed16: policy=fixed:16"
"""
from __future__ import annotations

from .common import alone, bench, check, emit, parse_sets, points, prepare, shape_name


def add_arguments(p) -> None:
    p.add_argument("--variant", action="append", default=[], metavar='"NAME: FIELD=VALUE ..."',
                   help="a variant of the point (repeatable; default: the point as --set makes it)")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds, each interleaving every variant (default 2)")


def variants(specs: list[str]) -> list[tuple[str, dict]]:
    out = []
    for v in specs or ["default:"]:
        name, colon, rest = v.partition(":")
        if not colon or not name.strip():
            raise SystemExit(f'probe.py b2b: --variant {v!r}: expected "NAME: FIELD=VALUE ..."')
        out.append((name.strip(), parse_sets(rest.split(), "--variant")))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"probe.py b2b: variant names repeat: {', '.join(names)}")
    return out


def run(args) -> int:
    import torch

    vs = variants(args.variant)
    per_variant = {name: points(args, sets) for name, sets in vs}
    rows = []
    for i in range(len(next(iter(per_variant.values())))):  # one shape at a time
        preps = {}
        try:
            for name, pts in per_variant.items():
                preps[name] = prepare(pts[i])
            first = next(iter(preps.values()))
            p, dev = first.point, first.ctx.device
            print(f"\n# {p.op} {p.impl} {shape_name(p)} W={p.world} {p.fabric}: {len(preps)} variants, "
                  f"{p.reps} reps x {args.rounds} rounds")
            checks = {name: check(pr) for name, pr in preps.items()}
            fns = {name: pr.runner.run for name, pr in preps.items()}
            fns.update(alone(first))
            for rnd in range(args.rounds):
                t = bench(fns, p, dev)
                ref = max(t["gemm"], t.get("copy", 0.0))
                print(f"round {rnd}: gemm alone {t['gemm']:.1f} us" + (f", copy alone {t['copy']:.1f} us" if "copy" in t else ""))
                print(f"{'variant':16s} {'time(us)':>10s} {'eff':>6s} {'vs first':>8s} {'wrong':>6s}  key")
                base = t[next(iter(preps))]
                for name, pr in preps.items():
                    wrong, err = checks[name]
                    print(f"{name:16s} {t[name]:10.1f} {ref / t[name]:6.3f} {base / t[name]:8.3f} {wrong:6d}  {pr.point.key()}")
                    rows.append({"variant": name, "round": rnd, "key": pr.point.key(), "M": p.M, "N": p.N, "K": p.K,
                                 "t_us": t[name], "t_gemm_us": t["gemm"], "t_comm_us": t.get("copy"), "eff": ref / t[name],
                                 "wrong": wrong, "max_rel_err": err})
        finally:
            for pr in preps.values():
                pr.close()
            torch.cuda.empty_cache()
    emit(args, "b2b", rows)
    return 0
