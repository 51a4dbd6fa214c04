"""kosmos-bench command line: sweep, ablate, trace, report, plot, list, doctor, build,
calibrate, validate-sim.

Data goes to stdout (rows, tables, --json), progress and diagnostics to stderr. Exit codes:
0 every point ok (or skipped, as long as one ran), 1 some point wrong/failed/timed out or no
point ran at all (every one skipped), 2 usage error (one line on stderr), 130 interrupted
(Ctrl-C; what finished is saved and `--resume` runs the rest).
"""
from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark self-scheduling persistent comm+GEMM kernels (KOSMOS) against the baselines.")
# Piped output (files, CI logs) gets wide tables instead of rich's 80-column default.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)

BAD_STATUSES = ("wrong", "failed", "timeout")


def usage_error(msg: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(msg)}")
    return typer.Exit(2)


def _split(values: Optional[List[str]]) -> list[str] | None:
    if not values:
        return None
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def _worlds(values: Optional[List[str]]) -> list[int] | None:
    """--world values (comma separated) as integers >= 1, else a usage error naming the value."""
    worlds = []
    for w in _split(values) or []:
        try:
            n = int(w)
        except ValueError:
            raise usage_error(f"--world: {w!r} is not an integer") from None
        if n < 1:
            raise usage_error(f"--world: {n}: world sizes must be >= 1")
        worlds.append(n)
    return worlds or None


def check_options(*, policies: list[str] | None = None, fabric: str | None = None, reps: int | None = None,
                  warmup: int | None = None, timeout: float | None = None) -> None:
    """Usage errors (exit 2, one line naming the bad value) for option values the sweep would
    otherwise carry into every row: --policy, --fabric, --reps, --warmup, --timeout."""
    from .point import FABRICS, parse_policy

    for pol in policies or []:
        try:
            parse_policy(pol)
        except ValueError as e:
            raise usage_error(f"--policy: {e}") from None
    if fabric is not None and fabric not in ("auto",) + FABRICS:
        raise usage_error(f"--fabric: {fabric!r} is not one of auto, {', '.join(FABRICS)}")
    if reps is not None and reps < 1:
        raise usage_error(f"--reps: {reps}: expected an integer >= 1 (timed repetitions per point)")
    if warmup is not None and warmup < 1:
        raise usage_error(f"--warmup: {warmup}: expected an integer >= 1 (warm-up calls per point)")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise usage_error(f"--timeout: {timeout:g}: expected seconds > 0")


def resolve_backend(backend: str) -> str:
    import torch

    if backend not in ("auto", "gpu", "cpu", "sim"):
        raise usage_error(f"--backend: {backend!r} is not one of auto, gpu, cpu, sim")
    if backend == "auto":
        return "gpu" if torch.cuda.is_available() else "sim"
    if backend == "gpu" and not torch.cuda.is_available():
        raise usage_error("--backend gpu: no CUDA/ROCm device is visible (use --backend sim or cpu)")
    return backend


def resolve_fabric(fabric: str, backend: str, world: int) -> str:
    """auto: real ranks when there are enough GPUs, else the single-GPU host fabric."""
    import torch

    if fabric != "auto":
        return fabric
    if backend == "cpu":
        return "gloo"
    if backend == "sim":
        return "nvlink"
    n = torch.cuda.device_count()
    return "nvlink" if world == 1 or n >= world else "host"


def _check_run(path: Path) -> None:
    """A run directory or a compacted run (one .parquet file of rows), else a usage error."""
    if not (path.is_dir() or (path.is_file() and path.suffix == ".parquet")):
        raise usage_error(f"{path}: not a run directory or a .parquet file of result rows")


def parse_settings(items: Optional[List[str]]) -> dict:
    """--set name=value (repeatable): KOSMOS configuration fields; a usage error when bad."""
    from .kosmos.config import parse_set

    try:
        return parse_set(items)
    except ValueError as e:
        raise usage_error(f"--set: {e}") from None


SET_HELP = "KOSMOS setting name=value, repeatable (e.g. --set ce_slices=3; docs/knobs.md lists them)."


def build_points(target: str, *, backend: str, fabric: str | None, impls, worlds, trace: bool,
                 reps: int | None = None, warmup: int | None = None, profile: str | None = None,
                 policies=None, concurrent: bool | None = None, settings: dict | None = None):
    from .spec import SpecError, expand, load_sweep

    try:
        sw = load_sweep(target)
        points = []
        for w in worlds or sw.world:
            fab = resolve_fabric(fabric or sw.fabric, backend, w)
            points += expand(sw, backend=backend, fabric=fab, impls=impls, worlds=[w], trace=trace,
                             reps=reps, warmup=warmup, profile=profile, policies=policies, concurrent=concurrent,
                             settings=settings)
    except SpecError as e:
        raise usage_error(str(e)) from None
    from .impls import IMPLS

    unknown = sorted({p.impl for p in points} - set(IMPLS))
    if unknown:
        raise usage_error(f"--impl: unknown implementation(s) {', '.join(unknown)}; known: {', '.join(IMPLS)}")
    if backend == "sim":
        from .sim import profiles

        points = [p.replace(profile=p.profile or profiles.default_for(p.fabric, p.world)) for p in points]
    return sw, points


class _Progress:
    """Progress on stderr: a live bar on a terminal; elsewhere (a CI log, `2>log`) one plain
    line per finished point, so a long run shows where it is."""

    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, time.monotonic()
        self.live = None
        if err.is_terminal:
            self.live = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err, transient=True)
            self.task = self.live.add_task("starting", total=total)

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    @staticmethod
    def label(p) -> str:
        what = f"{p.moe} T={p.M} {p.routing}" if p.moe else f"{p.M}x{p.N}x{p.K}"
        return f"{p.op} {p.variant} W={p.world} {what}"

    def start(self, p) -> None:
        if self.live is not None:
            self.live.update(self.task, description=self.label(p))

    def done(self, p, row: dict) -> None:
        self.n += 1
        if self.live is not None:
            self.live.advance(self.task)
            return
        t = row.get("t_median_us")
        took = f" {t:.2f} us" if isinstance(t, (int, float)) and math.isfinite(t) else ""
        el = int(time.monotonic() - self.t0)
        print(f"progress: {self.n}/{self.total} points, {el // 60}:{el % 60:02d} elapsed: {self.label(p)}: "
              f"{row.get('status')}{took}", file=sys.stderr, flush=True)


class _Table:
    """The sweep's fixed-width rows on stdout, derived like `report` (speedup, eff*): the rows
    of one problem (op, shape, world, fabric, ...) are printed together once its last point is
    in, so its nccl-seq baseline is known (points are expanded problem by problem)."""

    def __init__(self, prior, run_id: str):
        self.rows = {r["key"]: r for r in prior.to_dict(orient="records")} if len(prior) else {}
        self.run_id = run_id
        self.pending: list[str] = []
        self.seen: set[str] = set()  # keys added by this invocation
        self.group = None

    def add(self, row: dict) -> None:
        from .report import MATCH_COLS

        group = tuple(str(row.get(c)) for c in MATCH_COLS)
        if self.pending and group != self.group:
            self.flush()
        self.group = group
        row = dict(row, run_id=self.run_id)
        self.rows.pop(row["key"], None)  # a re-run (resume) replaces the old row
        self.rows[row["key"]] = row
        self.pending.append(row["key"])
        self.seen.add(row["key"])

    def flush(self) -> None:
        import pandas as pd

        from . import report

        if not self.pending:
            return
        df = report.derive(pd.DataFrame(list(self.rows.values())))
        by_key = {r["key"]: r for r in df.to_dict(orient="records") if r["key"] in set(self.pending)}
        for k in self.pending:
            out.print(report.row_text(by_key[k]), markup=False)
        self.pending = []


def execute(points, store, *, as_json: bool, timeout_s: float, profiler: str | None = None,
            isolate: bool = False, table: "_Table | None" = None) -> None:
    """Run points (resume-filtered by the caller), writing each row as it lands; with a table,
    rows go to it (printed by problem), else one JSON object per row when as_json."""
    from . import harness, launch

    def on_row(p, row, trace):
        if trace is not None and len(trace):
            store.write_trace(p.key(), trace)
            row["trace_file"] = f"traces/{p.key()}.parquet"
        store.write_row(row)
        if as_json:
            out.print(json.dumps({k: v for k, v in row.items()}, default=str), markup=False)
        elif table is not None:
            table.add(row)
        progress.done(p, row)

    with _Progress(len(points)) as progress:
        sim_points = [p for p in points if p.backend == "sim"]
        real_points = [p for p in points if p.backend != "sim"]
        for p in sim_points:
            progress.start(p)
            on_row(p, *harness.run_sim_point(p))
        if real_points:
            if launch.under_torchrun():
                launch.run_points_torchrun(real_points, progress.start, on_row)
            else:
                launch.run_points(real_points, progress.start, on_row, timeout_s, isolate=isolate)
    if table is not None:
        table.flush()


def _resume_command(root: Path) -> str:
    """This command line with --resume ROOT in place of -o/--output/--resume."""
    keep, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a in ("-o", "--output", "--resume"):
            skip = True
        elif not a.startswith(("--output=", "--resume=")) and not (a.startswith("-o") and len(a) > 2):
            keep.append(a)
    return shlex.join(["kosmos-bench", *keep, "--resume", str(root)])


def run_and_report(store, title: str, points, backend: str, *, total: int, as_json: bool = False,
                   timeout_s: float = 600.0, isolate: bool = False, resumable: bool = True) -> int:
    """Run the points into the store and print them the nccl-tests way (header with the
    config and devices, one row per point with speedup and eff*, footer with the verdict);
    returns the exit code of the whole run (report.verdict: 1 when a point is wrong, failed or
    timed out, or when nothing ran). Ctrl-C: says what is saved and how to resume, exit 130."""
    from . import report

    fabrics = sorted({p.fabric for p in points})
    note = ""
    if backend == "sim":
        note = " — SIMULATED (no GPU here): times come from a hardware model, not measurements"
    elif "host" in fabrics or "local" in fabrics:
        note = " — single-GPU emulated fabric (host: rank-0 view, peers over PCIe; local: emulated ranks)"
    if backend != "sim" and "nvlink" in fabrics:
        from . import sharing

        if any(p.backend == "gpu" and sharing.is_shared(p) for p in points):
            note += " — EMULATED: " + sharing.EMULATED_NOTE
    prior = store.rows()
    table = None
    if not as_json:
        out.print(report.header_text(store.manifest(), f"{title}: {len(points)} points, backend={backend}, "
                                     f"fabric={','.join(fabrics)}{note}"), markup=False)
        out.print(report.column_header("moe" if points and all(p.moe for p in points) else None), markup=False)
        table = _Table(prior, store.run_id)
    try:
        execute(points, store, as_json=as_json, timeout_s=timeout_s, isolate=isolate, table=table)
    except KeyboardInterrupt:
        import multiprocessing as mp

        for child in mp.active_children():  # this sweep's workers
            child.kill()
        stored = store.rows()
        if table is not None:  # every row saved before the interrupt is printed, once
            keys = {p.key() for p in points}
            for r in stored.to_dict(orient="records"):
                if r["key"] in keys and r["key"] not in table.seen:
                    table.add(r)
            table.flush()
        saved = len(stored)
        how = f"resume with: {_resume_command(store.root)}" if resumable else "run the command again"
        err.print(f"interrupted: {saved} of {total} points saved in {store.root}; {how}", markup=False)
        raise typer.Exit(130) from None
    rows = store.rows()
    if not as_json:
        out.print(report.footer_text(rows), markup=False)
        out.print(f"results: {store.root}", markup=False)
    return report.verdict(rows)["exit_code"]


def _run_store(resume, sw, be, points, create):
    """The run's store and the points still to run: the resumed run's (points already ok left
    out) or a new one from ``create()``; the manifest records the sweep and its total."""
    total = len(points)
    if resume is not None:
        store = open_resume(resume, sw, be)
        done = store.done_keys()
        points = [p for p in points if p.key() not in done]
        err.print(f"resume {resume}: {total - len(points)} points already ok, {len(points)} to run", markup=False)
    else:
        store = create()
    store.write_manifest({"sweep": sw.source, "sweep_name": sw.name, "op": sw.op, "backend": be, "points": total})
    return store, points


def open_resume(resume: Path, sw, backend: str):
    """The RunStore of `--resume DIR`, or a usage error when DIR is not a run or was made by
    another sweep, op or backend (its rows would be mixed with this sweep's)."""
    from .store import RunStore

    store = RunStore(resume)
    if not resume.is_dir() or not store.is_run():
        raise usage_error(f"--resume: {resume} is not a run directory (no manifest.json or points/)")
    man, rows = store.manifest(), store.rows()
    names = set(rows["sweep"].dropna().astype(str)) if len(rows) else set()
    if man.get("sweep_name") or man.get("sweep"):
        names.add(str(man.get("sweep_name") or Path(str(man["sweep"])).stem))
    ops = set(rows["op"].dropna().astype(str)) if len(rows) else set()
    backends = set(rows["backend"].dropna().astype(str)) if len(rows) else set()
    if man.get("backend"):
        backends.add(str(man["backend"]))
    made_by = f"sweep {'/'.join(sorted(names)) or '?'} (op {'/'.join(sorted(ops)) or '?'})"
    if (names and names != {sw.name}) or (ops and ops != {sw.op}):
        raise usage_error(f"--resume: {resume} was made by {made_by}, not by sweep {sw.name} (op {sw.op}): "
                          f"resume it with the sweep that made it, or start a new run without --resume")
    if backends and backends != {backend}:
        raise usage_error(f"--resume: {resume} ran on backend {'/'.join(sorted(backends))}, not {backend}: "
                          f"pass --backend {'/'.join(sorted(backends))}, or start a new run without --resume")
    return store


@app.command()
def sweep(
    target: str = typer.Argument(..., help="An op name (runs sweeps/<op>.yaml) or a sweep file / sweep name."),
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementations, comma separated (default: the sweep's)."),
    world: Optional[List[str]] = typer.Option(None, "--world", help="World sizes, comma separated (default: the sweep's)."),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="kosmos policies: self, fixed:<k>, predicted."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
    backend: str = typer.Option("auto", help="auto | gpu | cpu | sim (auto: gpu if one is visible, else the simulator)."),
    fabric: Optional[str] = typer.Option(None, help="nvlink | local | host | gloo (default: the sweep's, auto-resolved)."),
    profile: Optional[str] = typer.Option(None, help="Simulator hardware profile (backend sim)."),
    output: Path = typer.Option(Path("results"), "-o", "--output", help="Directory under which the run directory is created."),
    resume: Optional[Path] = typer.Option(None, help="Existing run directory of this sweep and backend: skip points "
                                          "already ok, run the rest (a run another sweep made is refused)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the expanded points and exit."),
    trace: bool = typer.Option(False, "--trace", help="Record role timelines of kosmos points."),
    reps: Optional[int] = typer.Option(None, help="Timed repetitions per point (default: the sweep's)."),
    warmup: Optional[int] = typer.Option(None, help="Warm-up calls per point (default: the sweep's)."),
    concurrent: Optional[bool] = typer.Option(None, "--concurrent/--no-concurrent", help="Also time the GEMM alone "
                                              "and the collective alone issued together, no dependency (GPU; "
                                              "t_concurrent_us; default: the sweep's timing.concurrent, on)."),
    timeout: float = typer.Option(600.0, help="Seconds one point may take before its workers are killed."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON row per point instead of the table."),
    isolate: bool = typer.Option(False, "--isolate", help="A fresh worker process per point (nothing a point "
                                 "leaves in the process reaches the next; a few seconds more per point)."),
):
    """Run a sweep: every point checked against the reference, timed, and stored as Parquet."""
    from .store import RunStore

    sets = parse_settings(settings)
    be = resolve_backend(backend)
    worlds = _worlds(world)
    check_options(policies=_split(policy), fabric=fabric, reps=reps, warmup=warmup, timeout=timeout)
    _check_profile(profile, be)
    sw, points = build_points(target, backend=be, fabric=fabric, impls=_split(impl), worlds=worlds, trace=trace,
                              reps=reps, warmup=warmup, profile=profile, policies=_split(policy), concurrent=concurrent,
                              settings=sets)
    if dry_run:
        t = Table("key", "op", "variant", "world", "fabric", "backend", "M", "N", "K", "model|moe/layer|routing/tokens")
        for p in points:
            t.add_row(p.key(), p.op, escape(p.variant), str(p.world), p.fabric, p.backend, str(p.M), str(p.N), str(p.K),
                      f"{p.model or p.moe or ''} {p.layer or p.routing or ''} {p.tokens or ''}".strip())
        out.print(t)
        out.print(f"{len(points)} points (dry run: nothing executed)")
        raise typer.Exit(0)
    total = len(points)
    store, points = _run_store(resume, sw, be, points, lambda: RunStore.create(output))
    raise typer.Exit(run_and_report(store, sw.name, points, be, total=total, as_json=as_json, timeout_s=timeout,
                                    isolate=isolate))


def _check_profile(profile: str | None, backend: str) -> None:
    if profile is None:
        return
    if backend != "sim":
        raise usage_error(f"--profile {profile}: simulator profiles apply to --backend sim only (backend here: {backend})")
    from .sim import profiles

    try:
        profiles.load(profile)
    except (KeyError, ValueError) as e:
        raise usage_error(f"--profile: {e.args[0]}") from None


@app.command()
def ablate(
    name: str = typer.Argument(..., help="queue-order | role-policy | local-first | chunk-size (sweeps/ablate/NAME.yaml)."),
    backend: str = typer.Option("auto", help="auto | gpu | cpu | sim."),
    world: Optional[List[str]] = typer.Option(None, "--world", help="World sizes, comma separated."),
    fabric: Optional[str] = typer.Option(None, help="Override the sweep's fabric."),
    output: Path = typer.Option(Path("results"), "-o", "--output", help="Directory under which the run directory "
                                "(ablate-NAME-<time>) is created; figures go to its plots/."),
    resume: Optional[Path] = typer.Option(None, help="Existing ablation run directory: skip points already ok, "
                                          "run the rest, plot."),
    trace: bool = typer.Option(True, "--trace/--no-trace", help="Record role timelines (for idle-window plots)."),
    timeout: float = typer.Option(600.0, help="Seconds one point may take before its workers are killed."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
):
    """Run an ablation sweep and plot it (RUN/plots)."""
    import datetime

    from . import plot
    from .spec import find_sweep
    from .store import RunStore

    path = find_sweep(f"ablate/{name}") or find_sweep(name)
    if path is None:
        raise usage_error(f"no ablation named {name!r} (expected sweeps/ablate/{name}.yaml)")
    sets = parse_settings(settings)
    be = resolve_backend(backend)
    worlds = _worlds(world)
    check_options(fabric=fabric, timeout=timeout)
    sw, points = build_points(str(path), backend=be, fabric=fabric, impls=None, worlds=worlds, trace=trace,
                              settings=sets)
    total = len(points)
    store, points = _run_store(resume, sw, be, points, lambda: RunStore.create(
        output, f"ablate-{path.stem}-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")))
    code = run_and_report(store, f"ablate {path.stem}", points, be, total=total, timeout_s=timeout)
    for f in plot.render(store.root):
        err.print(f"wrote {f}", markup=False)
    raise typer.Exit(code)


@app.command("trace")
def trace_cmd(
    op: str = typer.Argument(..., help="ag-gemm | gemm-rs"),
    M: int = typer.Option(8192, "-M"), N: int = typer.Option(8192, "-N"), K: int = typer.Option(8192, "-K"),
    world: int = typer.Option(8, "--world"),
    impl: str = typer.Option("kosmos", "--impl"),
    policy: str = typer.Option("self", "--policy"),
    backend: str = typer.Option("auto"),
    fabric: str = typer.Option("auto"),
    output: Path = typer.Option(Path("results"), "-o", "--output"),
    profiler: Optional[str] = typer.Option(None, "--profiler", help="torch | rocprofv3: also capture an external profile."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
):
    """Record one point's role timeline; writes Parquet, a Perfetto JSON and the plots (RUN/plots)."""
    import yaml

    from . import plot
    from .spec import SpecError, expand, parse_sweep
    from .store import RunStore, load_traces
    from .trace import to_perfetto

    sets = parse_settings(settings)
    be = resolve_backend(backend)
    check_options(policies=[policy], fabric=fabric)
    for dim, v in (("-M", M), ("-N", N), ("-K", K), ("--world", world)):
        if v < 1:
            raise usage_error(f"{dim}: {v}: expected an integer >= 1")
    data = {"op": op, "impls": [impl], "world": [world], "shapes": [{"M": M, "N": N, "K": K}],
            "kosmos": {"policy": [policy]}}
    try:
        sw = parse_sweep(data, "trace", "trace")
        points = expand(sw, backend=be, fabric=resolve_fabric(fabric, be, world), trace=True, settings=sets)
    except SpecError as e:
        raise usage_error(str(e)) from None
    if be == "sim":
        from .sim import profiles

        points = [p.replace(profile=profiles.default_for(p.fabric, p.world)) for p in points]
    store = RunStore.create(output, "trace-" + __import__("datetime").datetime.now().strftime("%Y%m%d-%H%M%S"))
    store.write_manifest({"backend": be, "points": len(points), "sweep_yaml": yaml.safe_dump(data), "sweep_name": "trace",
                          "op": op})
    code = run_and_report(store, f"trace {op}", points, be, total=len(points), resumable=False)
    if profiler:
        _external_profile(profiler, points[0], store)
    tr = load_traces(store.root)
    if len(tr):
        path = store.root / "trace.perfetto.json"
        to_perfetto(tr, path)
        out.print(f"perfetto trace: {path} (open in ui.perfetto.dev)", markup=False)
        for f in plot.render(store.root):
            err.print(f"wrote {f}")
    else:
        out.print("no role timeline was recorded for this point (see its status/error above)", markup=False)
    raise typer.Exit(code)


def _external_profile(profiler: str, p, store) -> None:
    """Run the point once more under an external profiler and store its output."""
    from . import trace as tr

    prof_dir = store.root / "profiles"
    prof_dir.mkdir(parents=True, exist_ok=True)
    if profiler == "torch":
        from . import harness
        from .impls import get_impl
        from .impls.base import RankCtx
        from .ops import get_op

        if p.backend == "sim" or harness.skip_reason(p) or p.fabric not in ("host", "local"):
            err.print("--profiler torch: runs single-process GPU points (host/local fabric) only; skipped")
            return
        ctx = RankCtx(0, p.world, 1, harness.device_for(p, 0), p.fabric, p.backend)
        inputs, _, _ = get_op(p.op).inputs(p, list(range(p.world)), ctx.device, harness.seed_for(p, 1))
        runner = get_impl(p.impl).prepare(p, ctx, inputs)
        path = tr.torch_profile(runner.run, prof_dir / f"{p.key()}.torch.json")
        runner.close()
        out.print(f"torch profiler trace: {path}", markup=False)
    elif profiler == "rocprofv3":
        ok, why = tr.rocprofv3_available()
        if not ok:
            err.print(f"--profiler rocprofv3: {why}")
            return
        cmd = [sys.executable, "-m", "kosmos_bench.cli", "trace", p.op, "-M", str(p.M), "-N", str(p.N), "-K", str(p.K),
               "--world", str(p.world), "--impl", p.impl, "--policy", p.policy or "self", "-o", str(prof_dir)]
        path = tr.run_under_rocprofv3(cmd, prof_dir)
        df = tr.ingest_rocprofv3(path)
        store.write_trace(f"{p.key()}-rocprofv3", df.assign(key=p.key()))
        out.print(f"rocprofv3 kernel trace: {path} ({len(df)} kernels)", markup=False)
    else:
        raise usage_error(f"--profiler: {profiler!r} is not one of torch, rocprofv3")


@app.command()
def report(
    runs: List[Path] = typer.Argument(None, help="Run directories (or a parent of several), or Parquet files of rows."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable rows."),
    compare: Optional[List[Path]] = typer.Option(None, "--compare", help="Two runs: before and after (give --compare twice)."),
):
    """Print the results of one or more runs (speedup vs nccl-seq, overlap efficiency, wrong)."""
    from . import report as rep

    if compare and len(compare) != 2:
        raise usage_error("--compare takes exactly two run directories (give it twice: --compare A --compare B)")
    runs = runs or []
    for r in list(runs) + list(compare or []):
        _check_run(r)
    if not runs and not compare:
        raise usage_error("give a run directory (e.g. results/<run-id>)")
    raise typer.Exit(rep.report(runs, as_json=as_json, compare=tuple(compare) if compare else None, console=out))


@app.command()
def compact(
    run: Path = typer.Argument(..., help="Run directory (or a parent of several runs)."),
    output: Path = typer.Option(..., "-o", "--output", help="The Parquet file to write (e.g. results/<name>.parquet)."),
):
    """Fold a run's rows and manifest into one Parquet file (small enough to commit; `report` reads it)."""
    from .store import compact as do_compact

    if not run.is_dir():
        raise usage_error(f"{run}: not a run directory")
    if output.suffix != ".parquet":
        raise usage_error(f"--output {output}: expected a .parquet file name")
    try:
        dest = do_compact(run, output)
    except FileNotFoundError as e:
        raise usage_error(str(e)) from None
    out.print(f"wrote {dest} ({dest.stat().st_size / 1024:.0f} KiB)", markup=False)


@app.command("plot")
def plot_cmd(
    run: Path = typer.Argument(..., help="Run directory, a parent of several runs (results/), or a compacted run (.parquet)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where figures and index.md go. Default: "
                                          "RUN/plots for a run directory or a parent of runs, NAME-plots/ beside a "
                                          "compacted NAME.parquet (under results/ these are ignored by git)."),
    key: Optional[str] = typer.Option(None, "--key", help="Point key for the role-timeline figure."),
):
    """Figures (PNG + SVG) and an index.md: speedups, overlap efficiency, role timelines, idle CDFs.
    Runs of several backends (gpu, sim, cpu) are never drawn together: each gets its own
    folder (plots/gpu/, plots/sim/, ...) under one index.md."""
    from . import plot

    _check_run(run)
    try:
        written = plot.render(run, output, key)
    except FileNotFoundError as e:
        raise usage_error(str(e)) from None
    for f in written:
        out.print(str(f), markup=False)


def _availability(impl, backend: str) -> tuple[bool, str]:
    """Whether `sweep --backend BACKEND` runs this implementation (the simulator models some
    implementations without their libraries or kernels), and why not."""
    if backend == "sim":
        from . import sim

        if impl.name in sim.IMPLS:
            return True, ""
        return False, f"needs --backend gpu (the simulator models {', '.join(sim.IMPLS)} only)"
    return impl.available(backend)


def _auto_backend() -> tuple[str, str]:
    """What --backend auto resolves to here, and why."""
    import torch

    if torch.cuda.is_available():
        return "gpu", f"{torch.cuda.device_count()} GPU(s) visible"
    return "sim", "no GPU visible: the simulator runs the points (labelled SIMULATED)"


@app.command("list")
def list_cmd(backend: str = typer.Option("auto", help="Report availability for this backend (auto: what "
                                         "`sweep` uses here, gpu if one is visible, else the simulator).")):
    """Ops, implementations (with availability), sweeps and models."""
    from .impls import IMPLS
    from .models import LAYER_OPS, MODELS, layer_shape
    from .ops import OPS
    from .spec import list_sweeps

    be = resolve_backend(backend)
    title = "implementations"
    if backend == "auto":
        _, why = _auto_backend()
        title = f"implementations: what `sweep` runs here (backend auto -> {be}: {why})"
    out.print(f"[bold]ops[/bold]: {', '.join(OPS)}")
    t = Table("implementation", "ops", "fabrics", f"runs (backend {be})", "why not", title=escape(title))
    for name, impl in IMPLS.items():
        ok, why = _availability(impl, be)
        yes = "yes, simulated" if ok and be == "sim" else "yes"
        t.add_row(name, ",".join(impl.ops) or "-", ",".join(impl.fabrics), yes if ok else "no", escape(why))
    out.print(t)
    t = Table("sweep", "file", title="sweeps")
    for f in list_sweeps():
        t.add_row(f.stem if f.parent.name == "sweeps" else f"{f.parent.name}/{f.stem}", str(f))
    out.print(t)
    t = Table("model", *LAYER_OPS, title="models (global M x N x K at 8192 tokens)")
    for m in MODELS.values():
        t.add_row(m.name, *["x".join(map(str, layer_shape(m, l, 8192))) for l in LAYER_OPS])
    out.print(t)


def _version(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return "not found"
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        return (text.strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
        return f"error: {e}"


@app.command()
def doctor():
    """What this machine has: GPUs, driver, toolchains, torch, NCCL, kernels, optional baselines."""
    import torch

    from .impls import IMPLS
    from .kernels import libs
    from .store import manifest

    m = manifest()
    t = Table("item", "value", title="kosmos-bench doctor")
    t.add_row("torch", f"{m['torch']} (cuda {m['cuda']}, hip {m['hip']})")
    t.add_row("GPUs", ", ".join(m["gpus"]) or "none (backend auto -> sim)")
    t.add_row("driver", str(m["driver"]))
    t.add_row("NCCL", str(m["nccl"]))
    t.add_row("nvcc", _version(["nvcc", "--version"]))
    hip = libs.hip_toolchain()
    t.add_row("hipcc", f"{hip[0]} ({hip[1]}; build --check --arch gfx90a)" if hip else "absent (no HIP compile-check here)")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        t.add_row("device 0", f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
    t.add_row("git", f"{m['git_sha']} dirty={m['git_dirty']}")
    t.add_row("source hash", f"{m['source_hash']} (names the code of a run whose .git is stale)")
    be, why = _auto_backend()
    t.add_row("backend auto", f"{be} ({why})")
    for name, impl in IMPLS.items():
        ok, why = _availability(impl, be)
        text = f"runs on backend auto ({be}{', simulated' if be == 'sim' else ''})" if ok else \
            f"not on backend auto ({be}): {escape(why)}"
        if be == "sim":  # the other backend a machine without a GPU has: real CPU ranks
            ok_cpu, why_cpu = impl.available("cpu")
            text += "; --backend cpu: " + ("runs (gloo ranks)" if ok_cpu else f"no ({escape(why_cpu)})")
        t.add_row(f"impl {name}", text)
    out.print(t)


@app.command()
def build(check: bool = typer.Option(False, "--check", help="Compile-check every kernel (nvcc; hipcc for gfx*), no GPU needed."),
          arch: Optional[str] = typer.Option(None, help="GPU arch, e.g. sm_90a, or gfx90a for the HIP check (default: the visible GPU's).")):
    """Build (or compile-check) the kernels; results are cached by source hash + arch. AMD arches (gfx*): --check only."""
    from . import kernels
    from .kernels import libs

    if arch and libs.is_hip(arch) and not check:
        raise usage_error(f"--arch {arch}: AMD GPUs are compile-checked only (add --check)")
    try:
        res = kernels.build(check_only=check, arch=arch)
    except libs.ToolchainMissing as e:  # the compiler this arch needs is not here: say so, exit 2
        raise usage_error(str(e))
    except kernels.BuildError as e:
        err.print(f"[red]build failed:[/red] {escape(str(e))}")
        raise typer.Exit(1)
    out.print(str(res), markup=False)


@app.command()
def calibrate(output: Path = typer.Option(Path("h200-host-pcie.calibrated.json"), "-o", "--output")):
    """Measure this GPU (GEMM tile rate, PCIe/copy bandwidth) and write a simulator profile."""
    import torch

    from . import calibrate as cal

    if not torch.cuda.is_available():
        raise usage_error("calibrate needs a GPU")
    prof = cal.calibrate(output)
    out.print(json.dumps(prof, indent=2, default=str), markup=False)
    out.print(f"wrote {output}", markup=False)


@app.command("validate-sim")
def validate_sim(run: Path = typer.Argument(..., help="A measured run directory, or a compacted run (.parquet)."),
                 profile: Optional[str] = typer.Option(None, help="Profile name or JSON path (default: per fabric).")):
    """Compare a measured run with the simulator's prediction of the same points."""
    from .sim import validate as val

    _check_run(run)
    df = val.validate_sim(run, profile=profile)
    out.print(df.to_string(index=False), markup=False)
    out.print(json.dumps(val.summary(df), default=str), markup=False)


def _given_value(param, args: list[str]) -> str | None:
    """The value given on the command line for option `param` (its last occurrence), if any."""
    value = None
    for o in getattr(param, "opts", None) or []:
        if not o.startswith("-"):
            continue
        for i, a in enumerate(args):
            if a == o and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(o + "="):
                value = a[len(o) + 1:]
    return value


def main(argv: list[str] | None = None) -> None:
    """The `kosmos-bench` entry point: a usage error is one line on stderr and exit 2."""
    try:  # typer >= 0.2x carries its own copy of click
        from typer._click import exceptions as click
    except ImportError:
        from click import exceptions as click

    try:
        code = app(args=argv, standalone_mode=False)
    except getattr(click, "NoArgsIsHelpError", ()) as e:  # `kosmos-bench` alone: the help, exit 2 as click does
        if e.ctx is not None:
            print(e.ctx.get_help())
        sys.exit(2)
    except click.UsageError as e:
        cmd = f"{e.ctx.command_path.split()[-1]}: " if e.ctx is not None and e.ctx.parent is not None else ""
        msg = e.format_message()
        value = _given_value(getattr(e, "param", None), sys.argv[1:] if argv is None else argv)
        if value is not None and "': " in msg:  # name the bad value itself
            msg = msg.replace("': ", f"' ({value!r}): ", 1)
        err.print(f"[red]error:[/red] {escape(cmd + msg)}")
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
