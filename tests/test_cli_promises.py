"""The CLI keeps its promises (issue 29): each test is one row of the issue's table, run as a
user would, the real command in a subprocess (exit code, stderr, the files left behind).
The simulator backend keeps them fast and GPU-free."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kosmos_bench.point import Point
from kosmos_bench.store import RunStore, load_rows, write_json

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def kb(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kosmos_bench.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=_env())


def run_dir(out: Path) -> Path:
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return d


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr containing every needle."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert r.stdout == ""
    return lines[0]


def sweep_file(tmp_path: Path, name: str = "tiny", *, op: str = "ag-gemm", impls=("kosmos", "nccl-seq"),
               shapes=((256, 256, 128), (512, 256, 128)), world: int = 2, policy=("self",)) -> Path:
    f = tmp_path / f"{name}.yaml"
    shp = ", ".join(f"{{M: {m}, N: {n}, K: {k}}}" for m, n, k in shapes)
    f.write_text(f"op: {op}\nimpls: [{', '.join(impls)}]\nworld: [{world}]\nshapes: [{shp}]\n"
                 f"kosmos: {{policy: [{', '.join(policy)}]}}\ntiming: {{warmup: 1, reps: 2}}\n")
    return f


def data_rows(stdout: str) -> list[str]:
    return [l for l in stdout.splitlines() if l.startswith(("ag-gemm ", "gemm-rs ", "gemm "))]


# -- row 1: --policy fixed:abc, fixed:-3, fixed:0, greedy -> exit 2, one line naming the value
@pytest.mark.parametrize("bad", ["fixed:abc", "fixed:-3", "fixed:0", "greedy"])
def test_bad_policy_is_a_usage_error(tmp_path, bad):
    out = tmp_path / "res"
    r = kb("sweep", sweep_file(tmp_path), "--backend", "sim", "--policy", bad, "-o", out)
    one_line_error(r, "--policy", repr(bad))
    assert not out.exists()  # nothing was run or written


def test_bad_policy_of_trace_is_a_usage_error(tmp_path):
    r = kb("trace", "ag-gemm", "-M", 256, "-N", 256, "-K", 128, "--world", 2, "--backend", "sim",
           "--policy", "greedy", "-o", tmp_path / "res")
    one_line_error(r, "--policy", "'greedy'")
    assert not (tmp_path / "res").exists()


# -- row 2: --fabric ib; --reps -5; --timeout 0 (and friends) -> exit 2 (the README promises it)
@pytest.mark.parametrize("args,needles", [
    (["--fabric", "ib"], ["--fabric", "'ib'"]),
    (["--reps", "-5"], ["--reps", "-5"]),
    (["--timeout", "0"], ["--timeout", "0"]),
    (["--warmup", "0"], ["--warmup", "0"]),
    (["--world", "0"], ["--world", "0"]),
    (["--world", "two"], ["--world", "'two'"]),
    (["--reps", "abc"], ["--reps", "'abc'"]),
    (["--profile", "no-such-gpu"], ["--profile", "no-such-gpu"]),
])
def test_bad_option_values_are_usage_errors(tmp_path, args, needles):
    out = tmp_path / "res"
    r = kb("sweep", sweep_file(tmp_path), "--backend", "sim", *args, "-o", out)
    one_line_error(r, *needles)
    assert not out.exists()


def test_bad_option_values_of_ablate_are_usage_errors(tmp_path):
    one_line_error(kb("ablate", "queue-order", "--backend", "sim", "--fabric", "ib", "-o", tmp_path), "'ib'")
    one_line_error(kb("ablate", "queue-order", "--backend", "sim", "--timeout", "-1", "-o", tmp_path), "--timeout")
    assert list(tmp_path.iterdir()) == []


# -- row 3: --world 1000, every point skipped -> not a pass: non-zero exit, says why
def test_nothing_ran_is_not_a_pass(tmp_path):
    out = tmp_path / "res"
    r = kb("sweep", sweep_file(tmp_path), "--backend", "sim", "--world", "1000", "-o", out)
    assert r.returncode == 1, r.stdout + r.stderr
    (res,) = [l for l in r.stdout.splitlines() if l.startswith("# result:")]
    assert res.startswith("# result: FAIL (nothing ran: all 4 points skipped: ") and res.endswith("; exit 1)"), res
    assert "2 x M=256 is not divisible by world=1000" in res and "2 x M=512 is not divisible by world=1000" in res
    assert "PASS" not in r.stdout
    run = run_dir(out)
    assert set(load_rows(run).status) == {"skipped"}  # the rows say why, too
    rep = kb("report", run)  # report of the run agrees
    assert rep.returncode == 1 and "nothing ran" in rep.stdout


# -- row 4: one truncated .parquet in a run directory, then report / plot / --resume
def test_damaged_parquet_warns_and_the_good_rows_are_used(tmp_path):
    f = sweep_file(tmp_path, shapes=((256, 256, 128), (512, 256, 128), (768, 256, 128)))
    out = tmp_path / "res"
    assert kb("sweep", f, "--backend", "sim", "-o", out).returncode == 0
    run = run_dir(out)
    files = sorted((run / "points").glob("*.parquet"))
    assert len(files) == 6
    bad = files[2]
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])  # a torn copy

    rep = kb("report", run)
    assert rep.returncode == 0, rep.stderr
    assert f"warning: {bad}: unreadable" in rep.stderr and "Traceback" not in rep.stderr
    assert len(rep.stderr.strip().splitlines()) == 1
    assert "# verdict: 5 ok" in rep.stdout and len(data_rows(rep.stdout)) == 5

    pl = kb("plot", run)
    assert pl.returncode == 0, pl.stderr
    assert f"warning: {bad}: unreadable" in pl.stderr and "Traceback" not in pl.stderr
    assert "5 ok" in (run / "plots" / "index.md").read_text()

    res = kb("sweep", f, "--backend", "sim", "--resume", run)
    assert res.returncode == 0, res.stderr
    assert "5 points already ok, 1 to run" in res.stderr
    assert len(data_rows(res.stdout)) == 1
    assert len(load_rows(run)) == 6 and kb("report", run).stderr == ""  # the damaged point was measured again


def test_damaged_manifest_warns(tmp_path):
    out = tmp_path / "res"
    assert kb("sweep", sweep_file(tmp_path), "--backend", "sim", "-o", out).returncode == 0
    run = run_dir(out)
    (run / "manifest.json").write_text('{"command": "kosmos-bench sw')
    rep = kb("report", run)
    assert rep.returncode == 0 and f"warning: {run / 'manifest.json'}: unreadable" in rep.stderr
    assert "Traceback" not in rep.stderr


# -- row 5: plot on an empty directory -> one-line error, exit 2
def test_plot_of_an_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(kb("plot", tmp_path / "empty"), "no result rows under")
    assert list((tmp_path / "empty").iterdir()) == []  # no plots/ left behind


# -- row 6: report error text goes to stderr
def test_report_errors_go_to_stderr(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(kb("report", tmp_path / "empty"), "error: no result rows under")
    one_line_error(kb("report", tmp_path / "nope"), "not a run directory")
    one_line_error(kb("report", "--compare", tmp_path / "empty", "--compare", tmp_path / "empty"), "no result rows")


# -- row 7: plot results/ never mixes backends in one figure or header; outputs ignored by git
def _gpu_run(root: Path) -> Path:
    store = RunStore(root / "gpu-run")
    store.root.mkdir(parents=True)
    write_json(store.root / "manifest.json", {"command": "kosmos-bench sweep x", "gpus": ["NVIDIA H200"],
                                              "backend": "gpu", "torch": "2.11", "cuda": "13.0", "host": "box"})
    for impl, t in (("nccl-seq", 100.0), ("kosmos", 80.0)):
        p = Point(op="ag-gemm", impl=impl, M=4096, N=4096, K=4096, world=8, fabric="host", backend="gpu",
                  policy="self" if impl == "kosmos" else None)
        store.write_row(p.as_row() | {"status": "ok", "wrong": 0, "t_median_us": t, "t_gemm_us": 60.0, "t_comm_us": 50.0})
    return store.root


def test_plot_of_a_parent_splits_backends(tmp_path):
    parent = tmp_path / "results"
    _gpu_run(parent)
    assert kb("sweep", sweep_file(tmp_path), "--backend", "sim", "-o", parent).returncode == 0
    r = kb("plot", parent)
    assert r.returncode == 0, r.stderr
    plots = parent / "plots"
    top = (plots / "index.md").read_text()
    assert "[backend `gpu`](gpu/index.md)" in top and "[backend `sim`](sim/index.md)" in top
    gpu, sim = (plots / "gpu" / "index.md").read_text(), (plots / "sim" / "index.md").read_text()
    assert "NVIDIA H200" in gpu and "SIMULATED" not in gpu and "backend gpu" in gpu and "backend sim" not in gpu
    # (a sim run's manifest names the machine it ran on, which may hold a GPU: no device-name check here)
    assert "SIMULATED" in sim and "backend sim" in sim and "backend gpu" not in sim
    assert (plots / "gpu" / "speedup.png").exists() and (plots / "sim" / "speedup.png").exists()
    assert not list(plots.glob("*.png"))  # no figure of both


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_plot_outputs_under_results_are_ignored_by_git():
    from kosmos_bench.plot import default_out_dir

    targets = [ROOT / "results",  # kosmos-bench plot results/
               ROOT / "results" / "20261204-120000",  # a run the user made
               ROOT / "results" / "issue4-h200-20261204b",  # a committed result set
               ROOT / "results" / "issue4-h200-20261204b" / "run52-a1-host-ce.parquet"]  # a committed compacted run
    for t in targets:
        f = default_out_dir(t) / "speedup.png"
        r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(f.relative_to(ROOT))])
        assert r.returncode == 0, f"{f} is not ignored by git"


# -- row 8: --resume of a run made by another sweep -> refused, nothing rewritten
def test_resume_of_another_sweeps_run_is_refused(tmp_path):
    out = tmp_path / "res"
    g = sweep_file(tmp_path, "rs", op="gemm-rs", impls=("nccl-seq",), shapes=((256, 256, 128),))
    assert kb("sweep", g, "--backend", "sim", "-o", out).returncode == 0
    run = run_dir(out)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    a = sweep_file(tmp_path, "ag", impls=("nccl-seq",), shapes=((256, 256, 128),))
    one_line_error(kb("sweep", a, "--backend", "sim", "--resume", run), "was made by sweep rs (op gemm-rs)",
                   "not by sweep ag (op ag-gemm)")
    one_line_error(kb("sweep", g, "--backend", "cpu", "--resume", run), "ran on backend sim, not cpu")
    one_line_error(kb("sweep", g, "--backend", "sim", "--resume", tmp_path), "is not a run directory")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # manifest and rows untouched
    assert kb("sweep", g, "--backend", "sim", "--resume", run).returncode == 0  # its own sweep may resume it


# -- row 9: Ctrl-C during a sweep -> "interrupted: N of M points saved in DIR; resume with ..."
def test_ctrl_c_says_what_is_saved_and_how_to_resume(tmp_path):
    from kosmos_bench.spec import expand, load_sweep

    n = len(expand(load_sweep("ag-gemm"), backend="sim", fabric="nvlink"))  # the main job's points
    out = tmp_path / "res"
    # The sim runs 72 points in seconds: a one-page stderr pipe read without read-ahead makes the
    # sweep block on its progress lines long before the end, so the interrupt always lands mid-run.
    p = subprocess.Popen([sys.executable, "-m", "kosmos_bench.cli", "sweep", "ag-gemm", "--backend", "sim", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env=_env(), cwd=tmp_path,
                         # a test run started in the background inherits SIGINT ignored, and Python
                         # then installs no KeyboardInterrupt handler: give the sweep the default back
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if sys.platform == "linux":
        import fcntl

        fcntl.fcntl(p.stderr.fileno(), 1031, 4096)  # F_SETPIPE_SZ
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stderr.readline().decode()  # raw file: byte by byte, nothing read ahead
        seen.append(line)
        if line.startswith(f"progress: 2/{n}") or not line:
            break
    assert seen[-1].startswith(f"progress: 2/{n}"), "".join(seen)
    p.send_signal(signal.SIGINT)
    stdout, stderr = (b.decode() for b in p.communicate(timeout=120))
    assert p.returncode == 130, stdout + stderr
    run = run_dir(out)
    saved = len(list((run / "points").glob("*.parquet")))
    assert 2 <= saved < n
    m = re.search(rf"^interrupted: (\d+) of {n} points saved in (\S+); resume with: (.+)$", stderr, re.M)
    assert m, stderr
    assert int(m.group(1)) == saved and m.group(2) == str(run) and "Traceback" not in stderr
    assert m.group(3) == f"kosmos-bench sweep ag-gemm --backend sim --resume {run}"
    assert len(data_rows(stdout)) == saved  # every saved row was printed
    # the command it names finishes the run
    res = kb(*m.group(3).split()[1:], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{saved} points already ok, {n - saved} to run" in res.stderr and len(load_rows(run)) == n


# -- row 10: stderr not a TTY (CI, 2>log) -> plain progress lines
def test_progress_lines_when_stderr_is_not_a_tty(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:  # 2>log
        r = subprocess.run([sys.executable, "-m", "kosmos_bench.cli", "sweep", sweep_file(tmp_path), "--backend", "sim",
                            "-o", tmp_path / "res"], stdout=subprocess.PIPE, stderr=f, text=True, env=_env())
    assert r.returncode == 0
    lines = log.read_text().splitlines()
    assert [l.split(" points,")[0] for l in lines] == [f"progress: {i}/4" for i in range(1, 5)], lines
    assert all(re.search(r"elapsed: ag-gemm \S+ W=2 \d+x256x128: ok \d", l) for l in lines), lines


# -- row 11: the sweep's own table shows speedup and eff*, as report derives them
def test_sweep_table_shows_speedup_and_eff(tmp_path):
    out = tmp_path / "res"
    r = kb("sweep", sweep_file(tmp_path, impls=("kosmos", "nccl-seq", "nccl-overlap")), "--backend", "sim", "-o", out)
    assert r.returncode == 0, r.stderr
    rows = data_rows(r.stdout)
    assert len(rows) == 6
    for line in rows:
        tok = line.split()
        assert re.fullmatch(r"\d+\.\d\dx", tok[9]), line  # speedup
        assert re.fullmatch(r"\d\.\d\d", tok[11]), line  # eff*
    rep = kb("report", run_dir(out))
    assert sorted(rows) == sorted(data_rows(rep.stdout))  # the same numbers report prints


# -- row 12: ablate stdout has the sweep's header and verdict (SIMULATED label on the sim)
def test_ablate_prints_header_and_verdict(tmp_path):
    qo = tmp_path / "queue-order.yaml"  # sweeps/ablate/queue-order.yaml at small shapes
    qo.write_text("op: ag-gemm\nimpls: [kosmos, nccl-seq]\nworld: [2]\nshapes: [{M: 256, N: 256, K: 128}]\n"
                  "kosmos: {policy: [self], queue_order: [demand, fifo, reverse, random]}\ntiming: {warmup: 1, reps: 2}\n")
    out = tmp_path / "res"
    r = kb("ablate", qo, "--backend", "sim", "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# kosmos-bench | ")
    assert "# SIMULATED: backend=sim" in r.stdout and "SIMULATED (no GPU here)" in r.stdout
    assert "#op      variant" in r.stdout and len(data_rows(r.stdout)) == 5
    assert "# verdict: 5 ok, 0 wrong, 0 failed, 0 skipped" in r.stdout and "# result: PASS (exit 0)" in r.stdout
    run = run_dir(out)
    assert run.name.startswith("ablate-queue-order-") and (run / "plots" / "ablation.png").exists()


# -- row 13: plot index.md consistent about traces
def test_plot_index_is_consistent_about_traces(tmp_path):
    f = sweep_file(tmp_path, policy=("self", "fixed:2"))
    for name, extra in (("plain", []), ("traced", ["--trace"])):
        assert kb("sweep", f, "--backend", "sim", *extra, "-o", tmp_path / name).returncode == 0
        run = run_dir(tmp_path / name)
        assert kb("plot", run).returncode == 0
        md = (run / "plots" / "index.md").read_text()
        summaries = re.search(r"^(\d+) points carry a role-timeline summary .*?; (\d+) of them also have a stored "
                              r"timeline", md, re.M)
        assert summaries, md
        n, stored = map(int, summaries.groups())
        assert n == 4  # the kosmos points (the simulator summarises each)
        if name == "plain":
            assert stored == 0 and "| no |" in md and "| yes |" not in md
            assert "*skipped: no role timeline is stored in this run" in md
            assert "the role-timeline summaries of 4 points are in the table at the end" in md
            assert "the run has no traces" not in md
        else:
            assert stored == 4 and "| yes |" in md and "| no |" not in md
            assert "(timeline.png)" in md and "*skipped: no role timeline" not in md


# -- row 14: ablation.png readable (title inside the figure, legend not over the bars)
def test_ablation_figure_is_readable(tmp_path):
    import matplotlib.pyplot as plt

    from kosmos_bench.plot import figures as F
    from kosmos_bench.report import derive
    from kosmos_bench.trace.synth import synthetic_run

    for shapes in (({"M": 4096, "N": 8192, "K": 8192},),
                   ({"M": 4096, "N": 8192, "K": 8192}, {"M": 8192, "N": 8192, "K": 4096})):
        run = synthetic_run(tmp_path / f"synth{len(shapes)}", wgs=4, shapes=shapes)
        df = derive(load_rows(run))
        df["variant"] = df["variant"].astype(str)
        fig, _ = F.fig_ablation(df, run)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        box = fig.bbox
        title = fig._suptitle.get_window_extent(r)
        assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1, (title, box)
        for ax in fig.axes:
            t = ax.title.get_window_extent(r)
            assert box.x0 <= t.x0 and t.x1 <= box.x1
            assert ax.get_legend() is None  # no legend inside a panel
        (leg,) = fig.legends
        lb = leg.get_window_extent(r)
        assert box.y0 <= lb.y0 and lb.x0 >= box.x0 and lb.x1 <= box.x1
        for ax in fig.axes:
            assert not lb.overlaps(ax.get_window_extent(r)), "the legend covers a panel"
        plt.close(fig)


# -- row 15: list / doctor without a GPU say what `auto` will do
def test_list_and_doctor_say_what_auto_does():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU wording (backend auto -> sim)")
    r = kb("list")
    assert r.returncode == 0, r.stderr
    assert "backend auto -> sim" in r.stdout and "runs (backend sim)" in r.stdout
    kos = [l for l in r.stdout.splitlines() if l.startswith("│ kosmos ")]
    assert kos and "yes, simulated" in kos[0], r.stdout
    assert "available (sim)" not in r.stdout
    d = kb("doctor")
    assert d.returncode == 0, d.stderr
    assert re.search(r"│ backend auto\s+│ sim \(no GPU visible", d.stdout), d.stdout
    kos = [l for l in d.stdout.splitlines() if "impl kosmos" in l]
    assert kos and "runs on backend auto (sim, simulated)" in kos[0], d.stdout
    assert "backend=cpu" not in kos[0].split(";")[0]


# -- row 16: M = 10^9 on the simulator: refused (skipped with the reason), table in line
def test_shape_beyond_the_profile_memory_is_refused(tmp_path):
    f = sweep_file(tmp_path, impls=("nccl-seq", "kosmos"), shapes=((10 ** 9, 8192, 8192),), world=8)
    r = kb("sweep", f, "--backend", "sim", "-o", tmp_path / "res", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr  # nothing ran
    rows = data_rows(r.stdout)
    assert len(rows) == 2
    header = next(l for l in r.stdout.splitlines() if l.startswith("#op"))
    col = header.index("status")
    for line in rows:
        assert line[col:].startswith("skipped  needs 18,432 GB per GPU"), line  # the columns stay in line
        assert "profile h200-nvlink-x8 has 141 GB" in line
    df = load_rows(run_dir(tmp_path / "res"))
    assert set(df.status) == {"skipped"} and df.t_median_us.isna().all()


def test_memory_check_counts_what_a_gpu_holds():
    from kosmos_bench import sim

    p = Point(op="ag-gemm", impl="nccl-seq", M=8192, N=8192, K=8192, world=8, fabric="nvlink", backend="sim")
    # gathered A 8192x8192, B_r 8192x1024, C_r 8192x1024, bf16
    assert sim.memory_bytes(p) == 2 * (8192 * 8192 + 2 * 8192 * 1024)
    assert sim.memory_bytes(p.replace(fabric="local")) == 8 * sim.memory_bytes(p)  # all ranks on one GPU
    rs = p.replace(op="gemm-rs")  # A_r, B_r, the partial M x N, band r
    assert sim.memory_bytes(rs) == 2 * (8192 * 1024 * 2 + 8192 * 8192 + 1024 * 8192)
    prof = sim.profiles.load("h200-nvlink-x8")
    sim.check_memory(p, prof)  # fits
    with pytest.raises(sim.Unsupported, match="has 141 GB"):
        sim.check_memory(p.replace(M=10 ** 9), prof)
    sim.check_memory(p.replace(M=10 ** 9), {**prof, "memory_GB": None})  # a profile without the figure: no check


# -- the README's exit-code paragraph says what the tests above check
def test_readme_exit_code_paragraph():
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"Exit codes: .*?(?=A point that cannot run)", text)
    assert m, "README: the exit-code paragraph moved"
    para = m.group(0)
    for needle in ("**0** every point ok", "**1** a point wrong, failed or timed out", "nothing ran",
                   "**2** usage errors", "one line on stderr", "**130** interrupted", "--resume"):
        assert needle in para, (needle, para)
