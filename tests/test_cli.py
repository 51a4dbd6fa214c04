"""The CLI end to end on the cpu backend (real gloo ranks): sweep -> store -> report, exit codes."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kosmos_bench.store import load_rows


def kb(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "kosmos_bench.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def _run_dir(out: Path) -> Path:
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return d


ONE = """op: ag-gemm
impls: [nccl-seq]
world: [2]
shapes: [{M: 64, N: 32, K: 24}]
timing: {warmup: 1, reps: %d}
"""


def test_sweep_report_resume(tmp_path):
    out = tmp_path / "res"
    r = kb("sweep", "smoke", "--backend", "cpu", "-o", out)
    assert r.returncode == 0, r.stdout + r.stderr
    run = _run_dir(out)
    df = load_rows(run)
    assert len(df) == 8 and set(df.status) == {"ok"} and (df.wrong == 0).all()
    assert (df.fabric == "gloo").all() and set(df.world) == {2, 3}
    assert "nccl-overlap" in r.stdout and str(run) in r.stdout
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["backend"] == "cpu" and "sweep smoke" in manifest["command"]

    rep = kb("report", run)
    assert rep.returncode == 0, rep.stderr
    assert "nccl-seq" in rep.stdout
    js = kb("report", run, "--json")
    doc = json.loads(js.stdout)
    assert doc["exit_code"] == 0 and len(doc["rows"]) == 8

    # A run killed after some points: remove two finished rows, resume runs exactly those.
    files = sorted((run / "points").glob("*.parquet"))
    for f in files[:2]:
        f.unlink()
    res = kb("sweep", "smoke", "--backend", "cpu", "--resume", run)
    assert res.returncode == 0, res.stderr
    assert "6 points already ok, 2 to run" in res.stderr
    assert len(load_rows(run)) == 8


def test_json_rows(tmp_path):
    f = tmp_path / "one.yaml"
    f.write_text(ONE % 2)
    r = kb("sweep", f, "--backend", "cpu", "--json", "-o", tmp_path / "res")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["wrong"] == 0


def test_timeout_is_a_row_and_exit_1(tmp_path):
    f = tmp_path / "slow.yaml"
    f.write_text(ONE % 1_000_000)
    r = kb("sweep", f, "--backend", "cpu", "--timeout", "3", "-o", tmp_path / "res")
    assert r.returncode == 1, r.stdout + r.stderr
    df = load_rows(_run_dir(tmp_path / "res"))
    assert list(df.status) == ["timeout"] and "no result within 3 s" in df.error[0]


def test_dry_run_lists_points():
    r = kb("sweep", "ag-gemm", "--backend", "sim", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "points (dry run: nothing executed)" in r.stdout
    assert "kosmos[self]" in r.stdout and "kosmos[predicted]" in r.stdout  # not eaten as markup


@pytest.mark.parametrize("args,needle", [
    (["sweep", "no-such-op"], "no such sweep file or sweep name"),
    (["sweep", "smoke", "--backend", "tpu"], "--backend: 'tpu' is not one of"),
    (["sweep", "smoke", "--backend", "cpu", "--impl", "nccl-magic"], "unknown implementation(s) nccl-magic"),
    (["report", "/nonexistent"], "not a run directory"),
    (["compact", "/nonexistent", "-o", "x.parquet"], "not a run directory"),
    (["validate-sim", "/nonexistent"], "not a run directory or a .parquet file"),
    (["plot", "/nonexistent"], "not a run directory or a .parquet file"),
])
def test_usage_errors_exit_2(args, needle):
    r = kb(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr


def test_malformed_sweep_file_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("op: ag-gemm\nworld: [2]\nshapes: [{M: 8, N: 4}]\n")
    r = kb("sweep", f, "--backend", "cpu")
    assert r.returncode == 2
    assert "bad.yaml: shapes[0]: expected a mapping with exactly M, N, K" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_list_and_doctor():
    r = kb("list", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    for name in ("nccl-seq", "nccl-overlap", "kosmos", "symm-mem", "llama3-405b", "ag-gemm"):
        assert name in r.stdout
    d = kb("doctor")
    assert d.returncode == 0, d.stderr
    assert "torch" in d.stdout and "nvcc" in d.stdout


def test_build_check_for_amd_says_where_hipcc_is_missing(monkeypatch):
    from typer.testing import CliRunner

    from kosmos_bench.cli import app
    from kosmos_bench.kernels import libs

    def missing():
        raise libs.ToolchainMissing("hipcc (the HIP compiler) was not found on PATH or in /opt/rocm/bin: ...")

    monkeypatch.setattr(libs, "hipcc", missing)
    r = CliRunner().invoke(app, ["build", "--check", "--arch", "gfx90a"])
    assert r.exit_code == 2 and "hipcc (the HIP compiler) was not found" in r.output
    r = CliRunner().invoke(app, ["build", "--arch", "gfx90a"])  # AMD: compile-check only
    assert r.exit_code == 2 and "add --check" in r.output
