"""Report: derived metrics, fixed-width rows, header caveats, verdict/exit codes, --json, --compare."""
from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest

from kosmos_bench.point import Point
from kosmos_bench.report import (column_header, derive, footer_text, header_text, overlap_efficiency, points_summary,
                                 report, row_text)
from kosmos_bench.store import RunStore, write_json


def row(impl="kosmos", t=80.0, *, status="ok", wrong=0, policy=None, M=4096, N=4096, K=4096, world=8,
        fabric="host", backend="gpu", g=60.0, c=50.0, error=None, **kw):
    if impl == "kosmos" and policy is None:
        policy = "self"
    if impl == "kosmos":
        kw.setdefault("queue_order", "demand")
    p = Point(op="ag-gemm", impl=impl, M=M, N=N, K=K, world=world, fabric=fabric, backend=backend, policy=policy, **kw)
    return p.as_row() | {"status": status, "error": error, "wrong": wrong if status != "skipped" else None,
                         "t_median_us": t if status in ("ok", "wrong") else None, "t_gemm_us": g, "t_comm_us": c,
                         "tflops": 2.0 * M * N * K / (t * 1e-6) / 1e12, "busbw_gbs": 123.4}


def make_run(root, rows, manifest=None, run_id="run"):
    store = RunStore(root / run_id)
    store.root.mkdir(parents=True)
    write_json(store.root / "manifest.json", manifest or {"command": "kosmos-bench sweep test", "gpus": ["NVIDIA H200"],
                                                         "torch": "2.11", "cuda": "13.0", "git_sha": "abcdef1234567",
                                                         "git_dirty": True, "host": "box", "time": "t"})
    for r in rows:
        store.write_row(r)
    return store.root


def test_overlap_efficiency_formula():
    assert overlap_efficiency(60.0, 50.0, 80.0) == pytest.approx(0.75)
    assert overlap_efficiency(10.0, 90.0, 100.0) == pytest.approx(0.9)
    assert math.isnan(overlap_efficiency(None, 50.0, 80.0)) and math.isnan(overlap_efficiency(60.0, 50.0, 0.0))
    assert overlap_efficiency(60.0, None, 80.0) == pytest.approx(0.75)  # no collective (world 1)
    arr = overlap_efficiency([60.0, 1.0], [50.0, 3.0], [80.0, 4.0])
    assert list(arr) == pytest.approx([0.75, 0.75])


def test_derive_speedup_matches_same_shape_and_run():
    df = pd.DataFrame([row("nccl-seq", 100.0), row("kosmos", 80.0), row("nccl-overlap", 125.0),
                       row("kosmos", 50.0, M=8192),  # no baseline of this shape
                       row("kosmos", 40.0, status="failed", error="boom"),
                       row("kosmos", 20.0, fabric="local")])  # different fabric: no baseline
    df["run_id"] = "r"
    d = derive(df)
    assert list(d["speedup_vs_seq"][:3]) == pytest.approx([1.0, 1.25, 0.8])
    assert d["speedup_vs_seq"][3:].isna().all()
    assert d["overlap_efficiency"][1] == pytest.approx(60 / 80) and math.isnan(d["overlap_efficiency"][4])


def test_derive_baseline_from_other_run():
    a, b = row("nccl-seq", 100.0), row("kosmos", 50.0)
    df = pd.DataFrame([a | {"run_id": "A"}, b | {"run_id": "B"}, row("nccl-seq", 200.0) | {"run_id": "B", "M": 1}])
    assert derive(df)["speedup_vs_seq"][1] == pytest.approx(2.0)


def test_row_text_fixed_width():
    d = derive(pd.DataFrame([row("nccl-seq", 100.0) | {"run_id": "r"}, row("kosmos", 80.0) | {"run_id": "r"}]))
    hdr = column_header()
    lines = [row_text(r) for r in d.to_dict(orient="records")]
    assert hdr.startswith("#op") and "time(us)" in hdr and "speedup" in hdr and "ovl-eff" in hdr
    assert "1.25x" in lines[1] and " 0.75 " in lines[1] and "kosmos[self]" in lines[1]
    # Columns line up: every row ends its time column where the header's does.
    end = hdr.index("time(us)") + len("time(us)")
    for line in lines:
        assert line[end - 1] != " " and line[end] == " "
    failed = row_text(row("kosmos", status="failed", error="CUDA error: out of memory\nmore"))
    assert "failed" in failed and failed.endswith("CUDA error: out of memory") and " - " in failed
    clocked = row_text(row("kosmos", 80.0) | {"sm_mhz": 1350.4, "sm_mhz_gemm": 1425.0})
    assert " 1350/1425 " in clocked and " - " in lines[1]  # no clock sampled: '-'
    assert row_text(row("kosmos", 80.0) | {"sm_mhz": 1350.0, "sm_mhz_gemm": None}).count("1350/-") == 1
    long = row_text(row("kosmos", policy="fixed:16", queue_order="random", local_first=False, chunk=8))
    assert "~" in long and len(long.split("  ")[0]) <= len(hdr)


def test_header_caveats():
    h = header_text({"gpus": ["NVIDIA H200"] * 2, "driver": "570", "git_sha": "0123456789abc", "git_dirty": True,
                     "source_hash": "feedc0ffee12", "backend": "sim", "command": "kosmos-bench sweep x"},
                    "3 points | fabric local")
    assert "2x NVIDIA H200" in h and "git 0123456789 (dirty) | src feedc0ffee12" in h and "driver 570" in h
    assert "SIMULATED" in h and "EMULATED" in h
    assert all(line.startswith("#") for line in h.splitlines())
    h2 = header_text({}, "x: 2 points, backend=gpu, fabric=host")
    assert "fabric=host" in h2 and "SIMULATED" not in h2 and "no GPU" in h2
    assert "backend sim" in points_summary([Point(op="ag-gemm", impl="nccl-seq", M=8, N=8, K=8, world=2, backend="sim")])


def test_footer_geomean_and_verdict():
    df = pd.DataFrame([row("nccl-seq", 100.0), row("kosmos", 80.0), row("nccl-seq", 100.0, M=8192),
                       row("kosmos", 125.0, M=8192), row("kosmos", status="skipped", policy="fixed:4")])
    df["run_id"] = "r"
    f = footer_text(df)
    assert "4 ok, 0 wrong, 0 failed, 1 skipped" in f
    assert "kosmos[self] 1.00x (2)" in f  # geomean of 1.25 and 0.8
    assert "PASS" in f and "WARNING" not in f
    df["trace_dropped"] = [None, 12, None, 3, None]
    assert "WARNING: 15 trace records dropped (per-WG buffer overflow) in 2 point(s)" in footer_text(df)


def test_footer_notes_alone_times_of_one_problem_that_disagree():
    """Each point times its own GEMM and collective alone; the same problem measured > 3%
    apart across points gets a note naming the largest spread (ok rows only)."""
    df = pd.DataFrame([row("nccl-seq", 100.0, g=60.0, c=50.0), row("kosmos", 80.0, g=66.0, c=51.0),
                       row("nccl-overlap", 90.0, g=61.0, c=50.5, M=8192),
                       row("kosmos", 85.0, g=99.0, c=99.0, M=8192, status="failed")])
    df["run_id"] = "r"
    df["comm_bytes"] = [1 << 20, 1 << 20, 2 << 20, 2 << 20]
    f = footer_text(df)
    assert "# note: GEMM alone of one problem (4096x4096x4096) measured 60-66 us (+10.0%) across 2 points" in f
    assert "collective alone" not in f  # 50 vs 51 us: 2%, within the note's threshold
    df.loc[1, "t_comm_us"] = 55.0
    assert "collective alone of one problem (1 MiB) measured 50-55 us (+10.0%) across 2 points" in footer_text(df)
    df.loc[1, ["t_gemm_us", "t_comm_us"]] = [61.0, 50.0]
    assert "# note" not in footer_text(df)


def test_eff_best_uses_the_problems_fastest_alone_times():
    """eff* divides by the fastest GEMM alone / collective alone of the same problem among the
    ok rows: a point whose own copy alone ran slow does not look better overlapped."""
    df = pd.DataFrame([row("nccl-overlap", 100.0, g=60.0, c=90.0), row("kosmos", 100.0, g=66.0, c=95.0),
                       row("kosmos", 100.0, g=40.0, c=92.0, M=8192),  # another GEMM, the same copy
                       row("nccl-seq", 60.0, g=30.0, c=10.0, status="failed")])  # not ok: never the best
    df["run_id"] = "r"
    df["comm_bytes"] = [1 << 20, 1 << 20, 1 << 20, 1 << 20]
    d = derive(df)
    assert list(d["overlap_efficiency"][:3]) == pytest.approx([0.90, 0.95, 0.92])
    assert list(d["eff_best"][:3]) == pytest.approx([0.90, 0.90, 0.90])
    assert math.isnan(d["eff_best"][3])
    line = row_text(d.to_dict(orient="records")[1])
    assert " 0.95  0.90 " in line and "eff*" in column_header()


def test_report_ok_exit_0(tmp_path, capsys):
    run = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0), row("nccl-overlap", 90.0),
                              row("kosmos", status="skipped", policy="fixed:4", error="kosmos: no kernel")])
    assert report([run]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "fabric=host" in out and "1.25x" in out
    assert "3 ok, 0 wrong, 0 failed, 1 skipped" in out and "kosmos: no kernel" in out
    # nccl-seq is listed first for its shape
    body = [l for l in out.splitlines() if l.startswith("ag-gemm")]
    assert body[0].split()[1] == "nccl-seq" and body[1].split()[1] == "nccl-overlap"


@pytest.mark.parametrize("status,code", [("wrong", 1), ("failed", 1), ("timeout", 1), ("skipped", 0)])
def test_report_exit_codes(tmp_path, status, code, capsys):
    run = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0, status=status, wrong=7, error="x")])
    assert report([run]) == code
    assert ("FAIL" in capsys.readouterr().out) == bool(code)


def test_report_empty_or_missing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report([tmp_path / "empty"]) == 2
    assert report([tmp_path / "nope"]) == 2
    cap = capsys.readouterr()
    assert "does not exist" in cap.err and "no result rows" in cap.err and cap.out == ""  # errors on stderr


def test_report_json_and_rich_console(tmp_path):
    from rich.console import Console

    run = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0, status="wrong", wrong=3)])
    buf = io.StringIO()
    assert report([run], as_json=True, console=Console(file=buf, width=200)) == 1
    obj = json.loads(buf.getvalue())
    assert obj["verdict"]["wrong"] == 1 and obj["exit_code"] == 1 and len(obj["rows"]) == 2
    assert obj["runs"][0]["manifest"]["gpus"] == ["NVIDIA H200"]
    seq = [r for r in obj["rows"] if r["impl"] == "nccl-seq"][0]
    assert seq["speedup_vs_seq"] == 1.0
    buf = io.StringIO()
    report([run], console=Console(file=buf, width=80))
    assert "1 wrong" in buf.getvalue() and "FAIL" in buf.getvalue()


def test_report_several_runs(tmp_path, capsys):
    a = make_run(tmp_path, [row("nccl-seq", 100.0)], run_id="a")
    b = make_run(tmp_path, [row("kosmos", 50.0)], run_id="b")
    assert report([a, b]) == 0
    out = capsys.readouterr().out
    assert "all runs together" in out and "2.00x" in out  # b's kosmos uses a's baseline
    assert report([tmp_path]) == 0  # the parent stands for both runs
    out = capsys.readouterr().out
    assert f"# run: {a}" in out and f"# run: {b}" in out


def test_compare(tmp_path, capsys):
    a = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0), row("kosmos", 70.0, M=8192)], run_id="a")
    b = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 40.0), row("kosmos", 10.0, M=16384)], run_id="b")
    assert report([], compare=(a, b)) == 0
    out = capsys.readouterr().out
    assert "A/B" in out and "2.000" in out and "1.000" in out and "A eff" in out and "B eff" in out
    assert "matched 2 points" in out and "only in A: 1, only in B: 1" in out
    assert report([], compare=(a, b), as_json=True) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["summary"]["geomean_a_over_b"] == pytest.approx(2 ** 0.5)
    assert obj["summary"]["improved"] == 1 and obj["summary"]["regressed"] == 0
    # A re-run whose key changed (other reps) still pairs by configuration; B wrong -> exit 1.
    c = make_run(tmp_path, [row("kosmos", 90.0, reps=50, status="wrong", wrong=2)], run_id="c")
    assert report([], compare=(a, c)) == 1
    assert "matched 1 points" in capsys.readouterr().out


def test_report_reads_a_compacted_parquet_file_and_eff_concurrent(tmp_path, capsys):
    """A run compacted into one Parquet file (how small results are committed) reports like its
    directory; eff_concurrent = t_concurrent_us / t_median_us, shown as eff-cc."""
    from kosmos_bench.store import load_rows

    run = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0) | {"t_concurrent_us": 72.0}])
    f = tmp_path / "run.parquet"
    load_rows(run).to_parquet(f)
    assert report([f]) == 0
    out = capsys.readouterr().out
    assert "1.25x" in out and "eff-cc" in out
    kos = [l for l in out.splitlines() if l.startswith("ag-gemm") and "kosmos" in l][0]
    assert " 0.90 " in kos  # 72 / 80
    assert "# median eff-cc (vs GEMM + collective issued together): kosmos[self] 0.900" in out
    d = derive(load_rows(f))
    assert d.loc[d["impl"] == "kosmos", "eff_concurrent"].item() == pytest.approx(0.9)
    assert d.loc[d["impl"] == "nccl-seq", "eff_concurrent"].isna().all()


def test_footer_names_what_held_the_clock_per_variant(tmp_path, capsys):
    run = make_run(tmp_path, [row("nccl-seq", 100.0) | {"clock_limit": "none"},
                              row("kosmos", 80.0) | {"clock_limit": "sw_power_cap", "power_w": 699.0},
                              row("kosmos", 70.0, M=8192) | {"clock_limit": "sw_power_cap+hw_power_brake"},
                              row("kosmos", 60.0, M=16384)])
    assert report([run]) == 0
    out = capsys.readouterr().out
    assert ("# clock held below max by (op, points): kosmos[self]: sw_power_cap 1, "
            "sw_power_cap+hw_power_brake 1") in out
    quiet = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0) | {"clock_limit": "none"}], run_id="q")
    assert report([quiet]) == 0
    assert "clock held" not in capsys.readouterr().out


def test_compact_keeps_rows_and_manifest(tmp_path, capsys):
    from kosmos_bench.store import compact, load_manifest, load_rows

    run = make_run(tmp_path, [row("nccl-seq", 100.0), row("kosmos", 80.0)])
    f = compact(run, tmp_path / "c.parquet")
    assert load_manifest(f)["gpus"] == ["NVIDIA H200"] and load_manifest(run) == load_manifest(f)
    assert len(load_rows(f)) == 2
    assert report([f]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out
    # `sweep -o DIR` writes DIR/<run-id>/: compacting DIR keeps that run's manifest
    parent = tmp_path / "sweep-out"
    parent.mkdir()
    sub = make_run(parent, [row("kosmos", 70.0)], run_id="20261203-170000")
    assert load_manifest(parent) == load_manifest(sub)
    assert load_manifest(compact(parent, tmp_path / "p.parquet"))["git_sha"] == "abcdef1234567"
    make_run(parent, [row("kosmos", 71.0)], run_id="20261203-180000")
    assert load_manifest(parent)["runs"] == ["20261203-170000", "20261203-180000"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no result rows"):
        compact(tmp_path / "empty", tmp_path / "e.parquet")
