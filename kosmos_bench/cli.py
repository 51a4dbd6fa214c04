"""kosmos-bench command line: sweep, ablate, trace, report, plot, list, doctor, build,
calibrate, validate-sim.

Data goes to stdout (rows, tables, --json), progress and diagnostics to stderr. Exit codes:
0 all points ok, 1 some point wrong/failed/timed out, 2 usage error.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
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


def build_points(target: str, *, backend: str, fabric: str | None, impls, worlds, trace: bool,
                 reps: int | None = None, warmup: int | None = None, profile: str | None = None,
                 policies=None, concurrent: bool | None = None):
    from .spec import SpecError, expand, load_sweep

    try:
        sw = load_sweep(target)
        points = []
        for w in worlds or sw.world:
            fab = resolve_fabric(fabric or sw.fabric, backend, w)
            points += expand(sw, backend=backend, fabric=fab, impls=impls, worlds=[w], trace=trace,
                             reps=reps, warmup=warmup, profile=profile, policies=policies, concurrent=concurrent)
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


def execute(points, store, *, as_json: bool, timeout_s: float, profiler: str | None = None,
            isolate: bool = False) -> int:
    """Run points (resume-filtered by the caller), writing each row as it lands."""
    from . import harness, launch, report

    rows = []

    def on_row(p, row, trace):
        if trace is not None and len(trace):
            store.write_trace(p.key(), trace)
            row["trace_file"] = f"traces/{p.key()}.parquet"
        store.write_row(row)
        rows.append(row)
        progress.advance(task)
        if as_json:
            out.print(json.dumps({k: v for k, v in row.items()}, default=str), markup=False)
        else:
            out.print(report.row_text(row), markup=False)

    def on_start(p):
        progress.update(task, description=f"{p.op} {p.variant} W={p.world} {p.M}x{p.N}x{p.K}")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("starting", total=len(points))
        sim_points = [p for p in points if p.backend == "sim"]
        real_points = [p for p in points if p.backend != "sim"]
        for p in sim_points:
            on_start(p)
            on_row(p, *harness.run_sim_point(p))
        if real_points:
            if launch.under_torchrun():
                launch.run_points_torchrun(real_points, on_start, on_row)
            else:
                launch.run_points(real_points, on_start, on_row, timeout_s, isolate=isolate)
    bad = [r for r in rows if r.get("status") in BAD_STATUSES]
    return 1 if bad else 0


@app.command()
def sweep(
    target: str = typer.Argument(..., help="An op name (runs sweeps/<op>.yaml) or a sweep file / sweep name."),
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementations, comma separated (default: the sweep's)."),
    world: Optional[List[str]] = typer.Option(None, "--world", help="World sizes, comma separated (default: the sweep's)."),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="kosmos policies: self, fixed:<k>, predicted."),
    backend: str = typer.Option("auto", help="auto | gpu | cpu | sim (auto: gpu if one is visible, else the simulator)."),
    fabric: Optional[str] = typer.Option(None, help="nvlink | local | host | gloo (default: the sweep's, auto-resolved)."),
    profile: Optional[str] = typer.Option(None, help="Simulator hardware profile (backend sim)."),
    output: Path = typer.Option(Path("results"), "-o", "--output", help="Directory under which the run directory is created."),
    resume: Optional[Path] = typer.Option(None, help="Existing run directory: skip points already ok, append the rest."),
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
    from . import report
    from .store import RunStore

    be = resolve_backend(backend)
    worlds = [int(w) for w in _split(world) or []] or None
    if worlds is not None and any(w < 1 for w in worlds):
        raise usage_error("--world: world sizes must be >= 1")
    sw, points = build_points(target, backend=be, fabric=fabric, impls=_split(impl), worlds=worlds, trace=trace,
                              reps=reps, warmup=warmup, profile=profile, policies=_split(policy), concurrent=concurrent)
    if dry_run:
        t = Table("key", "op", "variant", "world", "fabric", "backend", "M", "N", "K", "model/layer/tokens")
        for p in points:
            t.add_row(p.key(), p.op, escape(p.variant), str(p.world), p.fabric, p.backend, str(p.M), str(p.N), str(p.K),
                      f"{p.model or ''} {p.layer or ''} {p.tokens or ''}".strip())
        out.print(t)
        out.print(f"{len(points)} points (dry run: nothing executed)")
        raise typer.Exit(0)
    if resume is not None:
        if not resume.is_dir():
            raise usage_error(f"--resume: {resume} is not a run directory")
        store = RunStore(resume)
        done = store.done_keys()
        todo = [p for p in points if p.key() not in done]
        err.print(f"resume {resume}: {len(points) - len(todo)} points already ok, {len(todo)} to run")
        points = todo
    else:
        store = RunStore.create(output)
    store.write_manifest({"sweep": sw.source, "backend": be, "points": len(points)})
    fabrics = sorted({p.fabric for p in points})
    note = ""
    if be == "sim":
        note = " — SIMULATED (no GPU here): times come from a hardware model, not measurements"
    elif "host" in fabrics or "local" in fabrics:
        note = " — single-GPU emulated fabric (host: rank-0 view, peers over PCIe; local: emulated ranks)"
    if not as_json:
        out.print(report.header_text(store.manifest(), f"{sw.name}: {len(points)} points, backend={be}, "
                                     f"fabric={','.join(fabrics)}{note}"), markup=False)
        out.print(report.column_header(), markup=False)
    code = execute(points, store, as_json=as_json, timeout_s=timeout, isolate=isolate)
    if not as_json:
        out.print(report.footer_text(store.rows()), markup=False)
        out.print(f"results: {store.root}", markup=False)
    raise typer.Exit(code)


@app.command()
def ablate(
    name: str = typer.Argument(..., help="queue-order | role-policy | local-first | chunk-size (sweeps/ablate/NAME.yaml)."),
    backend: str = typer.Option("auto", help="auto | gpu | cpu | sim."),
    world: Optional[List[str]] = typer.Option(None, "--world", help="World sizes, comma separated."),
    fabric: Optional[str] = typer.Option(None, help="Override the sweep's fabric."),
    output: Path = typer.Option(Path("results"), "-o", "--output"),
    trace: bool = typer.Option(True, "--trace/--no-trace", help="Record role timelines (for idle-window plots)."),
    timeout: float = typer.Option(600.0),
):
    """Run an ablation sweep and plot it."""
    from . import plot
    from .spec import find_sweep
    from .store import RunStore

    path = find_sweep(f"ablate/{name}") or find_sweep(name)
    if path is None:
        raise usage_error(f"no ablation named {name!r} (expected sweeps/ablate/{name}.yaml)")
    be = resolve_backend(backend)
    worlds = [int(w) for w in _split(world) or []] or None
    sw, points = build_points(str(path), backend=be, fabric=fabric, impls=None, worlds=worlds, trace=trace)
    store = RunStore.create(output, f"ablate-{name}-" + __import__("datetime").datetime.now().strftime("%Y%m%d-%H%M%S"))
    store.write_manifest({"sweep": sw.source, "backend": be, "points": len(points)})
    code = execute(points, store, as_json=False, timeout_s=timeout)
    for f in plot.render(store.root):
        err.print(f"wrote {f}")
    out.print(f"results: {store.root}", markup=False)
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
):
    """Record one point's role timeline; writes Parquet, a Perfetto JSON and the plots."""
    import yaml

    from . import plot
    from .spec import SpecError, expand, parse_sweep
    from .store import RunStore, load_traces
    from .trace import to_perfetto

    be = resolve_backend(backend)
    data = {"op": op, "impls": [impl], "world": [world], "shapes": [{"M": M, "N": N, "K": K}],
            "kosmos": {"policy": [policy]}}
    try:
        sw = parse_sweep(data, "trace", "trace")
        points = expand(sw, backend=be, fabric=resolve_fabric(fabric, be, world), trace=True)
    except SpecError as e:
        raise usage_error(str(e)) from None
    if be == "sim":
        from .sim import profiles

        points = [p.replace(profile=profiles.default_for(p.fabric, p.world)) for p in points]
    store = RunStore.create(output, "trace-" + __import__("datetime").datetime.now().strftime("%Y%m%d-%H%M%S"))
    store.write_manifest({"backend": be, "points": len(points), "sweep_yaml": yaml.safe_dump(data)})
    code = execute(points, store, as_json=False, timeout_s=600)
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
    run: Path = typer.Argument(..., help="Run directory, or a compacted run (.parquet)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where figures go (default RUN/plots)."),
    key: Optional[str] = typer.Option(None, "--key", help="Point key for the role-timeline figure."),
):
    """Figures (PNG + SVG) and an index.md: speedups, overlap efficiency, role timelines, idle CDFs."""
    from . import plot

    _check_run(run)
    for f in plot.render(run, output, key):
        out.print(str(f), markup=False)


@app.command("list")
def list_cmd(backend: str = typer.Option("auto", help="Report availability for this backend.")):
    """Ops, implementations (with availability), sweeps and models."""
    from .impls import IMPLS
    from .models import LAYER_OPS, MODELS, layer_shape
    from .ops import OPS
    from .spec import list_sweeps

    be = resolve_backend(backend)
    out.print(f"[bold]ops[/bold]: {', '.join(OPS)}")
    t = Table("implementation", "ops", "fabrics", f"available ({be})", "why not", title="implementations")
    for name, impl in IMPLS.items():
        ok, why = impl.available(be)
        t.add_row(name, ",".join(impl.ops) or "-", ",".join(impl.fabrics), "yes" if ok else "no", escape(why))
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
    be = "gpu" if torch.cuda.is_available() else "cpu"
    for name, impl in IMPLS.items():
        ok, why = impl.available(be)
        t.add_row(f"impl {name}", "available" if ok else f"unavailable: {escape(why)}")
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


def main():
    app()


if __name__ == "__main__":
    main()
