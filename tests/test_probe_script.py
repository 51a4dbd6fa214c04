"""scripts/probe.py, the one probe driver: every --help runs on a CPU box, --set reaches the
points through the sweep parser, and scripts/ stays small (issue 28: <= 10 files)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
PROBE = SCRIPTS / "probe.py"
ROUTINES = ("timeline", "b2b", "copy", "tail")


def probe(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, env=env, timeout=120)


def test_driver_help_lists_every_routine():
    r = probe("--help")
    assert r.returncode == 0, r.stderr
    for name in ROUTINES:
        assert name in r.stdout


@pytest.mark.parametrize("routine", ROUTINES)
def test_routine_help(routine):
    r = probe(routine, "--help")
    assert r.returncode == 0, r.stderr
    assert "--set NAME=VALUE" in r.stdout and "--shape" in r.stdout


def test_unknown_routine_is_a_usage_error():
    r = probe("nope")
    assert r.returncode == 2 and "invalid choice" in r.stderr


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import probe as drv

    return drv


def test_set_pairs_reach_the_points(driver):
    from probes.b2b import variants
    from probes.common import points

    args = driver.parser().parse_args(["b2b", "--shape", "8192x57344x8192,64x128x32", "--set", "policy=fixed:16",
                                       "--set", "builder=sm90", "--set", "mover=ce", "--reps", "7"])
    ((name, extra),) = variants(["lf0: local_first=false"])
    pts = points(args, extra)
    assert name == "lf0" and [(p.M, p.N, p.K) for p in pts] == [(8192, 57344, 8192), (64, 128, 32)]
    for p in pts:
        assert (p.policy, p.builder, p.mover, p.local_first, p.fabric, p.world, p.reps) == \
            ("fixed:16", "sm90", "ce", False, "host", 8, 7)
    assert len({p.key() for p in pts}) == 2
    default = points(driver.parser().parse_args(["tail", "--shape", "64x128x32"]))
    assert default[0].key() != pts[1].key()  # the --set fields are part of the point


def test_bad_set_is_one_line(driver):
    from probes.common import points

    for bad in (["--set", "policy"], ["--set", "mover=warp"], ["--shape", "8x8"]):
        with pytest.raises(SystemExit) as e:
            points(driver.parser().parse_args(["tail", *bad]))
        assert str(e.value).startswith("probe.py: ") and "\n" not in str(e.value)


def test_bad_variant(driver):
    from probes.b2b import variants

    with pytest.raises(SystemExit, match="expected"):
        variants(["no-colon"])
    with pytest.raises(SystemExit, match="repeat"):
        variants(["a: policy=self", "a: policy=fixed:8"])


def test_timeline_and_tail_read_a_trace(driver, capsys):
    from kosmos_bench.trace.synth import synthetic_trace
    from probes.tail import landed_tail
    from probes.timeline import show

    tr = synthetic_trace("self", world=8, ranks=[0], wgs=16)
    s = show(tr, 5, "synthetic")
    out = capsys.readouterr().out
    assert s["kernel_us"] > 0 and "BUILD" in out and len([l for l in out.splitlines() if l[:7].strip().isdigit()]) == 5
    r = landed_tail(tr)
    assert r["landed_by"] == "MOVE" and 0 < r["landed_us"] <= r["span_us"]
    assert r["tail_us"] == pytest.approx(r["span_us"] - r["landed_us"]) and r["late_tiles"] >= 0


def test_a_routine_runs_on_the_cpu(tmp_path):
    """b2b end to end on the cpu backend (world 1, torch.matmul): points, runners, check, timing, --out."""
    out = tmp_path / "b2b.parquet"
    r = probe("b2b", "--backend", "cpu", "--fabric", "local", "--world", "1", "--op", "gemm", "--impl", "torch",
              "--shape", "64x128x32", "--reps", "2", "--warmup", "1", "--rounds", "1", "--variant", "a:",
              "--variant", "b:", "--out", str(out))
    assert r.returncode == 0, r.stderr
    import pandas as pd

    df = pd.read_parquet(out)
    assert list(df["variant"]) == ["a", "b"] and (df["wrong"] == 0).all() and (df["routine"] == "b2b").all()


def test_probes_use_no_environment_knobs():
    texts = {f.name: f.read_text() for f in SCRIPTS.rglob("*") if f.is_file() and f.suffix in (".py", ".sh", ".cu")}
    assert not [n for n, t in texts.items() if "KOSMOS_" in t], "scripts/ read configuration through --set, not KOSMOS_*"
    private = re.compile(r"\._[A-Za-z]")  # obj._name (a runner's or module's private attribute)
    assert not [n for n, t in texts.items() if n.endswith(".py") and private.search(t)], "scripts/ use public names only"


def test_scripts_stay_small():
    files = [f for f in SCRIPTS.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    assert len(files) <= 10, f"scripts/ holds {len(files)} files (at most 10): {sorted(map(str, files))}"
