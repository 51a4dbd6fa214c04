"""Plot rendering on synthetic run directories (rows via RunStore, traces via write_trace)."""
from __future__ import annotations

import json

import pytest

from kosmos_bench.plot import FIGURES, render
from kosmos_bench.point import Point
from kosmos_bench.store import RunStore, load_rows, write_json
from kosmos_bench.trace import validate_perfetto
from kosmos_bench.trace.synth import synthetic_run, synthetic_trace

SHAPES = ({"M": 4096, "N": 8192, "K": 8192}, {"M": 8192, "N": 8192, "K": 4096})
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory):
    return synthetic_run(tmp_path_factory.mktemp("runs") / "synth", wgs=8, shapes=SHAPES)


def test_render_all_figures(synth_run, tmp_path):
    out = tmp_path / "plots"
    paths = render(synth_run, out)
    names = {p.name for p in paths}
    for f in FIGURES:
        assert f"{f}.png" in names and f"{f}.svg" in names, f
        assert (out / f"{f}.png").read_bytes()[:8] == PNG_MAGIC
        assert (out / f"{f}.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert paths[-1].name == "index.md"
    md = (out / "index.md").read_text()
    assert "*skipped" not in md
    for f in FIGURES:
        assert f"({f}.png)" in md
    assert "SYNTHETIC" in md and "SIMULATED" in md
    assert "geomean speedup over nccl-seq" in md and "kosmos[self]" in md
    assert "busy " in md and "idle windows" in md  # key numbers of the timeline and the CDF
    assert "## Role-timeline summaries in the rows" in md and "| kosmos[self] 4096×8192×8192 W=8 |" in md
    obj = json.loads((out / "timeline.perfetto.json").read_text())
    assert validate_perfetto(obj) == [] and obj["metadata"]["key"]


def test_render_default_out_dir_and_trace_key(synth_run):
    rows = load_rows(synth_run)
    key = rows.loc[rows["variant"] == "kosmos[fixed:2]", "key"].iloc[0]
    paths = render(synth_run, trace_key=key[:8], formats=("png",), only=("timeline",))
    assert all(p.parent == synth_run / "plots" for p in paths)
    md = (synth_run / "plots" / "index.md").read_text()
    assert f"point `{key}`: kosmos[fixed:2]" in md
    render(synth_run, synth_run / "p2", trace_key="nosuchkey", formats=("png",), only=("speedup", "timeline"))
    md = (synth_run / "p2" / "index.md").read_text()
    assert "*skipped: no trace for key 'nosuchkey'" in md and "(speedup.png)" in md


def test_render_sparse_run_skips_with_reasons(tmp_path):
    """No nccl-seq, no traces, no t_gemm/t_comm: every figure but ablation is skipped, with why."""
    store = RunStore(tmp_path / "sparse")
    store.root.mkdir()
    write_json(store.root / "manifest.json", {"command": "test"})
    for pol, t in (("self", 80.0), ("fixed:4", 95.0)):
        p = Point(op="ag-gemm", impl="kosmos", M=1024, N=1024, K=1024, world=2, policy=pol, queue_order="demand")
        store.write_row(p.as_row() | {"status": "ok", "t_median_us": t})
    store.write_row(Point(op="ag-gemm", impl="nccl-overlap", M=1024, N=1024, K=1024, world=2).as_row()
                    | {"status": "failed", "error": "boom"})
    paths = render(store.root, formats=("png",))
    md = (store.root / "plots" / "index.md").read_text()
    assert "no ok point has an nccl-seq baseline" in md
    assert "no ok point has t_gemm_us, t_comm_us" in md
    assert md.count("*skipped: no role timeline is stored in this run (`sweep --trace` stores them") == 3
    assert "summaries" not in md  # no row carries one: neither the skips nor a table mention them
    assert "(ablation.png)" in md and "role policy @ 1024×1024×1024: best self (1.00×)" in md
    assert {p.name for p in paths} == {"ablation.png", "index.md"}
    assert "1 failed" in md


def test_render_survives_a_broken_figure(synth_run, tmp_path, monkeypatch):
    import kosmos_bench.plot.figures as F

    def boom(df, run_dir):
        raise RuntimeError("kaputt")

    monkeypatch.setattr(F, "fig_overlap", boom)
    render(synth_run, tmp_path / "p", formats=("png",), only=("speedup", "overlap"))
    md = (tmp_path / "p" / "index.md").read_text()
    assert "drawing failed: RuntimeError: kaputt" in md and "(speedup.png)" in md


def test_render_timeline_from_write_trace(tmp_path):
    """A run whose only trace is written by hand with RunStore.write_trace (4 ranks shown as 2)."""
    store = RunStore(tmp_path / "one")
    store.root.mkdir()
    p = Point(op="ag-gemm", impl="kosmos", M=2048, N=2048, K=2048, world=4, policy="self", trace=True)
    store.write_row(p.as_row() | {"status": "ok", "t_median_us": 50.0})
    tr = synthetic_trace("self", world=4, ranks=[0, 1, 2, 3], wgs=6, bands_per_peer=2, tiles_per_band=2)
    store.write_trace(p.key(), tr.assign(key=p.key()))
    render(store.root, formats=("png",))
    md = (store.root / "plots" / "index.md").read_text()
    assert "(timeline.png)" in md and p.key() in md


def test_render_empty_run_raises(tmp_path, synth_run):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no result rows"):
        render(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown figure"):
        render(synth_run, tmp_path / "x", only=("pie",))


def test_render_a_compacted_run_with_the_concurrency_reference(synth_run, tmp_path):
    """plot reads a compacted run (.parquet; figures beside it) and marks t_concurrent_us."""
    from kosmos_bench.store import compact

    rows = load_rows(synth_run)
    conc = tmp_path / "conc"
    store = RunStore(conc)
    store.root.mkdir()
    write_json(store.root / "manifest.json", {"command": "test"})
    for r in rows.to_dict("records"):
        g, c = r.get("t_gemm_us"), r.get("t_comm_us")
        store.write_row(r | ({"t_concurrent_us": 1.02 * max(g, c)} if g and c else {}))
    f = compact(conc, tmp_path / "conc.parquet")
    paths = render(f, formats=("png",), only=("overlap",))
    assert all(p.parent == tmp_path / "conc-plots" for p in paths)
    md = (tmp_path / "conc-plots" / "index.md").read_text()
    assert "issued together (no dependency): median 0.98" in md


def test_gantt_moe_lanes_and_roles():
    """A MoE trace (roles of its own, concurrent lanes in a WG): every role its own colour, lanes
    side by side in the WG's row; its Perfetto export keeps one track per (WG, lane)."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from kosmos_bench.plot.figures import ROLE_COLORS, _gantt
    from kosmos_bench.trace import ROLE_CLASS, assign_lanes, perfetto_events

    rec = [(0, "ROUTER", 0, 10), (0, "DISPATCH", 5, 25), (0, "EXPERT", 20, 60), (0, "COMBINE", 30, 40), (1, "FOLD", 0, 50)]
    t = pd.DataFrame([{"rank": 0, "wg": w, "sm": w, "role": r, "item": i, "t0_ns": a * 1000, "t1_ns": b * 1000}
                      for i, (w, r, a, b) in enumerate(rec)])
    t["lane"] = assign_lanes(t)
    fig, ax = plt.subplots()
    _gantt(ax, t, 60.0, "WG")
    bars = [b for c in ax.containers for b in c]
    assert len(bars) == len(rec)
    assert all(name in ROLE_COLORS for name in ROLE_CLASS)  # no role drawn in the fallback black
    heights = {round(b.get_height(), 3) for b in bars}
    assert heights == {0.4}  # two lanes share the 0.8 row
    ys = sorted(round(b.get_y() + b.get_height() / 2, 3) for b in bars)
    assert ys == [-0.2, -0.2, 0.2, 0.2, 0.8]  # WG 0's lanes at -0.2 / +0.2; WG 1 (lane 0) at 1 - 0.2
    plt.close(fig)
    tracks = {(e["pid"], e["tid"]) for e in perfetto_events(t)["traceEvents"] if e["ph"] == "X"}
    assert tracks == {(0, 0), (0, 1), (0, 16)}


def test_timeline_lists_item_kinds(tmp_path):
    """A trace with item kinds (the MoE kernels') gets a line per kind under its timeline."""
    import pandas as pd

    from kosmos_bench.plot import figures as F
    from kosmos_bench.store import load_traces

    run = synthetic_run(tmp_path / "synth", wgs=4, shapes=SHAPES[:1])
    df = load_rows(run)
    key = F.choose_trace_key(df, run, None)
    tr = load_traces(run, key)
    tr["kind"] = tr["role"].map({"MOVE": "GATHER", "BUILD": "UP"}).fillna("OTHER")
    path = next(p for p in (run / "traces").glob(f"{key}*.parquet"))
    pd.DataFrame(tr).to_parquet(path)
    fig, lines, *_ = F.fig_timeline(df, run, key)
    kinds = [l for l in lines if " items, " in l]
    assert any(l.startswith("UP (BUILD): ") for l in kinds) and any(l.startswith("GATHER (MOVE): ") for l in kinds)
