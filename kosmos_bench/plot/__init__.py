"""Plots of a run directory: `render(run_dir)` -> PNG + SVG figures and an index.md.

Figures (each skipped, with the reason written to index.md, when the run lacks its data):
  speedup     speedup over nccl-seq per shape and implementation
  overlap     overlap efficiency vs comm/compute ratio (t_comm_us / t_gemm_us)
  timeline    role Gantt (WGs x time, per rank) of one traced point (+ its Perfetto JSON)
  timeline_policies  the same Gantt for self vs fixed:k vs predicted of one shape (rank 0)
  idle_cdf    idle-window CDF of self vs fixed:k (traced kosmos points of one shape)
  ablation    bars per value of queue_order / policy / local_first / chunk
"""
from __future__ import annotations

import json
import traceback
from pathlib import Path

from ..report import derive, geomean_speedups, header_text, points_summary, verdict
from ..store import load_manifest, load_rows

FIGURES = ("speedup", "overlap", "timeline", "timeline_policies", "idle_cdf", "ablation")
TITLES = {
    "speedup": "Speedup over nccl-seq",
    "overlap": "Overlap efficiency vs comm/compute ratio",
    "timeline": "Role timeline",
    "timeline_policies": "Role timelines by policy (same shape, same time scale)",
    "idle_cdf": "Idle-window CDF: self vs fixed roles",
    "ablation": "Ablations",
}


def _save(fig, out_dir: Path, name: str, formats) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = [out_dir / f"{name}.{fmt}" for fmt in formats]
    for p in paths:
        fig.savefig(p, dpi=130)
    plt.close(fig)
    return paths


def default_out_dir(run_dir: Path | str) -> Path:
    """Where `render` writes when not told: <run_dir>/plots for a run directory or a parent of
    several runs, <stem>-plots/ beside a compacted run (<stem>.parquet). Under the repository's
    results/ both are ignored by git (.gitignore), so plotting committed results adds nothing
    to commit."""
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.stem + "-plots") if run_dir.is_file() else run_dir / "plots"


def render(run_dir: Path, out_dir: Path | None = None, trace_key: str | None = None, *,
           formats: tuple[str, ...] = ("png", "svg"), only: tuple[str, ...] | None = None) -> list[Path]:
    """Write the figures of `run_dir` (PNG + SVG) and index.md into `out_dir`.

    run_dir: a run directory, a parent of several runs, or a compacted run (.parquet).
    out_dir defaults to default_out_dir(run_dir). trace_key (a key or a prefix of one) picks the
    point of the role timeline; default: the first traced kosmos point, policy self first.
    formats: image formats, the first is the one index.md shows; only: a subset of FIGURES.
    Rows of several backends (gpu, sim, cpu) are never drawn in one figure or under one
    header: each backend gets its own out_dir/<backend>/ (figures + index.md) and out_dir/index.md
    links them. Returns the written paths (index.md last). A figure that cannot be drawn is
    skipped and index.md says why; only a run directory with no rows at all raises
    (FileNotFoundError).
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(run_dir)
    rows = load_rows(run_dir)
    if rows.empty:
        raise FileNotFoundError(f"no result rows under {run_dir} (expected {run_dir}/points/*.parquet, "
                                "<run>/points/*.parquet or a compacted .parquet)")
    unknown = set(only or ()) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figure(s) {sorted(unknown)}; known: {', '.join(FIGURES)}")
    if "variant" in rows.columns:
        rows["variant"] = rows["variant"].where(rows["variant"].notna(), rows["impl"]).astype(str)
    backends = sorted(rows["backend"].dropna().astype(str).unique()) if "backend" in rows.columns else []
    if len(backends) <= 1:
        return _render_one(rows, run_dir, out_dir, trace_key, formats, only, _manifest_of(run_dir, rows))
    written: list[Path] = []
    md = [f"# kosmos-bench plots: `{run_dir.name}`", "",
          f"These runs hold points of {len(backends)} backends; a figure shows one backend, so each has its own "
          "page (numbers of different backends are not comparable: `sim` is a model, `cpu` runs gloo ranks):", ""]
    for b in backends:
        sub = rows[rows["backend"].astype(str) == b].reset_index(drop=True)
        paths = _render_one(sub, run_dir, out_dir / b, trace_key, formats, only, _manifest_of(run_dir, sub))
        written += paths
        v = verdict(sub)
        runs = sorted(sub["run_id"].dropna().astype(str).unique()) if "run_id" in sub.columns else []
        md.append(f"- [backend `{b}`]({b}/index.md): {v['total']} points from {len(runs)} run(s)"
                  + (f" ({', '.join(runs[:6])}{', ...' if len(runs) > 6 else ''})" if runs else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    index = out_dir / "index.md"
    index.write_text("\n".join(md) + "\n")
    return written + [index]


def _manifest_of(run_dir: Path, rows) -> dict:
    """The manifest describing `rows`: the run directory's own, or for a parent of several runs
    the manifest of the first run the rows come from (``runs`` naming all of them). A manifest
    of another backend than the rows' is not used (its devices would head the wrong points)."""
    run_ids = sorted(rows["run_id"].dropna().astype(str).unique()) if "run_id" in rows.columns else []
    subs = [run_dir / r for r in run_ids if run_dir.is_dir() and (run_dir / r / "manifest.json").is_file()]
    man = dict(load_manifest(subs[0] if subs else run_dir))
    if len(run_ids) > 1:
        man["runs"] = run_ids
    backends = set(rows["backend"].dropna().astype(str)) if "backend" in rows.columns else set()
    if man.get("backend") and backends and {str(man["backend"])} != backends:
        man = {"runs": run_ids} if run_ids else {}
    return man


def _render_one(rows, run_dir: Path, out_dir: Path, trace_key, formats, only, manifest: dict) -> list[Path]:
    from . import figures as F

    df = derive(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sections: list[str] = []
    for name in (f for f in FIGURES if only is None or f in only):
        try:
            if name == "timeline":
                fig, lines, key, tr, row = F.fig_timeline(df, run_dir, trace_key)
                from ..trace.perfetto import to_perfetto

                pj = to_perfetto(tr, out_dir / "timeline.perfetto.json",
                                 meta={"key": key, "point": F._point_title(row), "run": str(run_dir)})
                written.append(pj)
                lines.append(f"Perfetto trace of this point: [`{pj.name}`]({pj.name}) (open in https://ui.perfetto.dev)")
            else:
                fig, lines = getattr(F, f"fig_{name}")(df, run_dir)
        except F.Skip as e:
            sections.append(f"## {TITLES[name]}\n\n*skipped: {e}*\n")
            continue
        except Exception as e:  # noqa: BLE001 - one broken figure never sinks the others
            tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
            sections.append(f"## {TITLES[name]}\n\n*skipped: drawing failed: {type(e).__name__}: {e}* (`{tb}`)\n")
            continue
        paths = _save(fig, out_dir, name, formats)
        written += paths
        body = "\n".join(f"- {l}" for l in lines)
        also = " ".join(f"([{p.suffix[1:].upper()}]({p.name}))" for p in paths[1:])
        sections.append(f"## {TITLES[name]}\n\n![{TITLES[name]}]({paths[0].name})\n\n{body}\n\n{also}\n")

    v = verdict(df)
    gm = geomean_speedups(df)
    head = header_text(manifest, points_summary(df))
    md = [f"# kosmos-bench plots: `{run_dir.name}`", "", "```", head, "```", "",
          f"**Verdict:** {v['ok']} ok, {v['wrong']} wrong, {v['failed']} failed, {v['skipped']} skipped"
          + (f", {v['timeout']} timeout" if v["timeout"] else "") + f" ({v['total']} points).", ""]
    if gm:
        md += ["| variant | geomean speedup over nccl-seq | points |", "|---|---:|---:|"]
        md += [f"| {k} | {s:.2f}× | {n} |" for k, (s, n) in gm.items()]
        md.append("")
    md += sections
    md += _trace_table(df, run_dir)
    index = out_dir / "index.md"
    index.write_text("\n".join(md))
    written.append(index)
    return written


def _trace_table(df, run_dir: Path) -> list[str]:
    """Markdown table of the role-timeline columns (trace.summarize) the rows carry, saying
    which points also have a stored timeline (the figures are drawn from those)."""
    import pandas as pd

    from .figures import _traced_keys, natural_key

    cols = ["kernel_us", "busy_frac", "busy_frac_move", "busy_frac_build", "idle_windows", "idle_longest_us",
            "idle_p90_us", "first_build_us", "tail_after_move_us", "role_switches"]
    if "busy_frac" not in df.columns:
        return []
    d = df[pd.to_numeric(df["busy_frac"], errors="coerce").notna()]
    if d.empty:
        return []
    d = d.assign(_v=d["variant"].map(natural_key)).sort_values(["op", "M", "N", "K", "world", "_v"])

    def f(v, pct=False, count=False):
        v = pd.to_numeric(pd.Series([v]), errors="coerce").iloc[0]
        if pd.isna(v):
            return "-"
        if count:
            return str(int(v))
        return f"{v * 100:.1f}%" if pct else (f"{v:.1f}" if abs(v) < 1e5 else f"{v:.3g}")

    stored = {k.split("-")[0] for k in _traced_keys(d, run_dir)}
    n_stored = int(d["key"].astype(str).isin(stored).sum())
    out = ["## Role-timeline summaries in the rows", "",
           f"{len(d)} points carry a role-timeline summary (a simulated kosmos point always does; a GPU point when "
           f"traced); {n_stored} of them also have a stored timeline (traces/), from which the timeline figures "
           "are drawn (column `stored`).", "",
           "Fractions are of WG-time (every WG over its rank's kernel window); idle = no MOVE/BUILD/REDUCE "
           "(WAIT records and gaps). Times in us.", "",
           "| point | key | stored | kernel | busy | MOVE | BUILD | idle windows | longest idle | p90 idle | first BUILD | "
           "tail after MOVE | role switches |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d.to_dict(orient="records"):
        name = f"{r['variant']} {int(r['M'])}×{int(r['N'])}×{int(r['K'])} W={int(r['world'])}"
        has = "yes" if str(r["key"]) in stored else "no"
        out.append(f"| {name} | `{str(r['key'])[:8]}` | {has} | {f(r.get('kernel_us'))} | {f(r.get('busy_frac'), True)} | "
                   f"{f(r.get('busy_frac_move'), True)} | {f(r.get('busy_frac_build'), True)} | "
                   f"{f(r.get('idle_windows'), count=True)} | {f(r.get('idle_longest_us'))} | {f(r.get('idle_p90_us'))} | "
                   f"{f(r.get('first_build_us'))} | {f(r.get('tail_after_move_us'))} | {f(r.get('role_switches'), count=True)} |")
    return out + [""]


__all__ = ["render", "default_out_dir", "FIGURES"]
