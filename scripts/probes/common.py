"""What every probe routine shares: its points (an inline sweep through kosmos_bench.spec),
runners made through the implementations' public interface, a correctness check, and rows.

Only single-process fabrics run here: ``host`` (this process is rank 0 of W, the peers' data in
pinned host memory), ``local`` (every rank in this process) and world 1.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import yaml

SINGLE_PROCESS_FABRICS = ("host", "local")


def add_point_args(p: argparse.ArgumentParser) -> None:
    """The options that make a point: the inline sweep's keys, plus timing and output."""
    g = p.add_argument_group("point (an inline sweep: kosmos_bench.spec)")
    g.add_argument("--op", default="ag-gemm", help="ag-gemm | gemm-rs | gemm (default ag-gemm)")
    g.add_argument("--impl", default="kosmos", help="implementation (default kosmos)")
    g.add_argument("--shape", default="8192x57344x8192",
                   help="MxNxK[,MxNxK...] (default 8192x57344x8192: llama3-70b FC1, 8k tokens)")
    g.add_argument("--world", type=int, default=8, help="W (default 8)")
    g.add_argument("--fabric", default="host", help="host | local (default host: rank-0 view over PCIe)")
    g.add_argument("--dtype", default="bf16")
    g.add_argument("--backend", default="gpu", choices=("gpu", "cpu"), help="gpu (default) | cpu (a smoke run, tiny shapes)")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="a configuration field of the sweep's kosmos: section (repeatable), "
                        "e.g. --set policy=self --set builder=sm90 --set mover=ce")
    g.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    g.add_argument("--reps", type=int, default=30, help="timed calls (default 30)")
    g.add_argument("--out", metavar="FILE.parquet", help="append this routine's rows to a Parquet file")


def parse_sets(pairs: list[str], what: str = "--set") -> dict:
    """['ce_slices=3', 'policy=fixed:16'] -> {'ce_slices': 3, 'policy': 'fixed:16'} (YAML-typed values)."""
    out = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise SystemExit(f"probe.py: {what} {pair!r}: expected NAME=VALUE")
        try:
            out[name.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[name.strip()] = value
    return out


def shapes(spec: str) -> list[dict]:
    try:
        return [dict(zip("MNK", (int(v) for v in s.lower().split("x")), strict=True)) for s in spec.split(",") if s]
    except ValueError:
        raise SystemExit(f"probe.py: --shape {spec!r}: expected MxNxK[,MxNxK...]") from None


def points(args, extra_sets: dict | None = None) -> list:
    """The routine's points: one inline sweep (op, impl, world, fabric, shapes, a kosmos: section
    from --set and `extra_sets`), validated and expanded by kosmos_bench.spec."""
    from kosmos_bench.spec import SpecError, expand, parse_sweep

    if args.fabric not in SINGLE_PROCESS_FABRICS and args.world != 1:
        raise SystemExit(f"probe.py: --fabric {args.fabric}: the probes run one process; use host or local (or --world 1)")
    sets = {**parse_sets(args.sets), **(extra_sets or {})}
    data = {"op": args.op, "impls": [args.impl], "world": [args.world], "dtype": [args.dtype], "fabric": args.fabric,
            "shapes": shapes(args.shape), "kosmos": {k: [v] for k, v in sets.items()},
            "timing": {"warmup": args.warmup, "reps": args.reps}}
    try:
        sweep = parse_sweep(data, "inline sweep", "probe")
        return expand(sweep, backend=args.backend, fabric=args.fabric)
    except SpecError as e:
        raise SystemExit(f"probe.py: {e}") from None


@dataclass
class Prepared:
    """One point's runner with its inputs (rank-0 view), made through the public interface."""

    point: object
    ctx: object
    inputs: object
    A: object
    B: object
    runner: object

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def prepare(p, seed: int | None = None, runner: bool = True) -> Prepared:
    """Inputs (fresh: seeded by the point's key unless `seed`) and a runner for point `p`
    (none with runner=False: the inputs for the reference functions only)."""
    from kosmos_bench import harness
    from kosmos_bench.impls import get_impl
    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.ops import get_op

    why = harness.skip_reason(p)
    if why:
        raise SystemExit(f"probe.py: {p.key()} cannot run here: {why}")
    dev = harness.device_for(p, 0)
    if p.fabric == "host" and dev.type == "cuda":  # pinned peers' pages near the GPU, as the sweep does
        from kosmos_bench.runtime import numa

        numa.bind_near(dev.index or 0)
    ctx = RankCtx(rank=0, world=p.world, procs=1, device=dev, fabric=p.fabric, backend=p.backend)
    ranks = list(range(p.world)) if p.fabric in SINGLE_PROCESS_FABRICS else [0]
    inputs, A, B = get_op(p.op).inputs(p, ranks, dev, harness.seed_for(p) if seed is None else seed)
    return Prepared(p, ctx, inputs, A, B, get_impl(p.impl).prepare(p, ctx, inputs) if runner else None)


def check(prep: Prepared) -> tuple[int, float]:
    """(wrong elements, max relative error) of one call on poisoned outputs, against the
    reference; frees the full operands afterwards (call it once per Prepared)."""
    from kosmos_bench.ops import get_op
    from kosmos_bench.ops.base import check_output

    p, r = prep.point, prep.runner
    for out in r.outputs.values():
        out.fill_(float("nan"))
    r.run()
    if hasattr(r, "check"):
        r.check()
    prep.ctx.sync()
    wrong, err = 0, 0.0
    for rank in prep.ctx.ranks_here:
        w, e = check_output(r.outputs[rank], get_op(p.op).reference(prep.A, prep.B, rank, p.world), p.dtype)
        wrong, err = wrong + w, max(err, e)
    prep.A = prep.B = None  # the full operands are only for the reference
    return wrong, err


def alone(prep: Prepared) -> dict:
    """The point's GEMM alone and collective alone (the sweep's reference functions)."""
    from kosmos_bench.impls import nccl

    fns = {"gemm": nccl.gemm_alone(prep.point, prep.ctx, prep.inputs)}
    comm = nccl.comm_alone(prep.point, prep.ctx, prep.inputs)
    if comm is not None:
        fns["copy"] = comm
    return fns


def bench(fns: dict, p, device) -> dict:
    """Median us of each function, timed interleaved (kosmos_bench.timing.bench, L2 flushed)."""
    import numpy as np

    from kosmos_bench import timing

    s = timing.bench(fns, device=device, warmup=p.warmup, reps=p.reps)
    return {k: float(np.median(v)) for k, v in s.items()}


def shape_name(p) -> str:
    return f"{p.M}x{p.N}x{p.K}"


def emit(args, routine: str, rows: list[dict]) -> None:
    """Append rows (with the routine, the command's --set pairs) to --out, if given."""
    if not args.out or not rows:
        return
    from pathlib import Path

    import pandas as pd

    from kosmos_bench.store import write_frame

    df = pd.DataFrame(rows).assign(routine=routine, sets=" ".join(args.sets))
    path = Path(args.out)
    if path.exists():
        df = pd.concat([pd.read_parquet(path), df], ignore_index=True)
    write_frame(path, df)
    print(f"# wrote {len(rows)} rows to {path}")
