"""The figures of a run, one function each. Every function takes the derived rows (and the
run directory for traces), draws on a fresh matplotlib Figure, and returns
(figure, key-number lines for index.md) or raises `Skip(reason)` when the run lacks the data.
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - before pyplot, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..point import MOE_OPS  # noqa: E402
from ..report import SEQ_IMPL  # noqa: E402
from ..store import load_traces, trace_files  # noqa: E402
from ..trace.analysis import idle_windows, kind_summary, summarize  # noqa: E402

ROLE_COLORS = {"MOVE": "#1f77b4", "BUILD": "#2ca02c", "REDUCE": "#ff7f0e", "WAIT": "#d62728", "KERNEL": "#9467bd"}
ROLE_LABELS = {"MOVE": "MOVE (mover: copy a chunk)", "BUILD": "BUILD (builder: GEMM tile)",
               "REDUCE": "REDUCE (sum partials)", "WAIT": "WAIT (nothing ready)", "KERNEL": "kernel"}
# The MoE kernels' roles (ROLE_CLASS gives their class): shades of their class's colour.
ROLE_COLORS |= {"ROUTER": "#8c564b", "EXPERT": "#2ca02c", "EXPERT_DGRAD": "#2ca02c", "EXPERT_WGRAD": "#98df8a",
                "SHARED": "#17becf", "DISPATCH": "#aec7e8", "GATHER": "#aec7e8", "COMBINE": "#1f77b4", "FOLD": "#ff7f0e"}
ROLE_LABELS |= {"ROUTER": "ROUTER (router tile, top-k)", "EXPERT": "EXPERT (expert GEMM tile)",
                "EXPERT_DGRAD": "EXPERT_DGRAD (expert dgrad tile)", "EXPERT_WGRAD": "EXPERT_WGRAD (expert wgrad tile)",
                "SHARED": "SHARED (shared-expert tile)", "DISPATCH": "DISPATCH (rows to their experts)",
                "GATHER": "GATHER (output-gradient rows)", "COMBINE": "COMBINE (expert rows back)",
                "FOLD": "FOLD (sum over the choices)"}
KNOBS = {"policy": "self", "queue_order": "demand", "local_first": True, "chunk": 1}
KNOB_TITLES = {"policy": "role policy", "queue_order": "queue order", "local_first": "local-first", "chunk": "chunk (bands of BM rows)"}


class Skip(Exception):
    """This figure cannot be drawn from this run; the message says why."""


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].astype(str) == "ok"]


def _knob_str(v, k: str) -> str:
    """Canonical text of a knob value (Parquet turns 1 into 1.0 and True into 'True')."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        v = KNOBS[k]
    if k == "local_first":
        return "True" if str(v).lower() in ("true", "1", "1.0", "on", "yes") else "False"
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _knob(df: pd.DataFrame, k: str) -> pd.Series:
    s = df[k] if k in df.columns else pd.Series([None] * len(df), index=df.index)
    return pd.Series([_knob_str(v, k) for v in s.tolist()], index=df.index, dtype=object)


def is_default_kosmos(df: pd.DataFrame) -> pd.Series:
    """True for rows that are not an ablation (queue_order, local_first, chunk at defaults)."""
    m = pd.Series(True, index=df.index)
    for k in ("queue_order", "local_first", "chunk"):
        m &= _knob(df, k) == _knob_str(None, k)
    return m


def shape_label(row, multi: dict[str, bool]) -> str:
    """'M×N×K' (or 'model layer'), plus op / world / fabric / backend when the run mixes them."""
    if isinstance(row.get("moe"), str) and row.get("moe"):  # op moe: preset, tokens, routing
        s = f"{row['moe']}\nT={int(row['M'])} {row.get('routing') or ''}".strip()
    elif isinstance(row.get("model"), str) and row.get("model"):
        s = f"{row['model']} {row.get('layer') or ''}".strip() + f"\n{int(row['M'])}×{int(row['N'])}×{int(row['K'])}"
    else:
        s = f"{int(row['M'])}×{int(row['N'])}×{int(row['K'])}"
    extra = [str(row[c]) for c in ("op",) if multi.get(c)]
    extra += [f"W={int(row['world'])}" for c in ("world",) if multi.get(c)]
    extra += [str(row[c]) for c in ("fabric", "backend", "dtype") if multi.get(c)]
    return s + (("\n" + " ".join(extra)) if extra else "")


def _multi(df: pd.DataFrame) -> dict[str, bool]:
    return {c: c in df.columns and df[c].astype(str).nunique() > 1 for c in ("op", "world", "fabric", "backend", "dtype")}


def _shape_cols(df):
    return [c for c in ("op", "M", "N", "K", "world", "dtype", "fabric", "backend") if c in df.columns]


def natural_key(v) -> tuple:
    """'kosmos[fixed:8]' before 'kosmos[fixed:32]'."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(v)))


def _variant_order(vs, self_first: bool = False) -> list[str]:
    def rank(v):
        if v == "nccl-overlap":
            return (0, natural_key(v))
        if v.startswith("kosmos[self"):
            return (1 if self_first else 3, natural_key(v))
        if v.startswith("kosmos[predicted"):
            return (2 if self_first else 1.5, natural_key(v))
        if v.startswith("kosmos"):
            return (2.5 if self_first else 2, natural_key(v))
        return (1, natural_key(v))
    return sorted(set(vs), key=rank)


def _df_palette(df: pd.DataFrame) -> dict[str, str]:
    """One colour per variant of the whole run, so every figure colours a variant alike."""
    return _palette(sorted(df["variant"].dropna().astype(str).unique(), key=natural_key))


def _palette(variants: list[str]) -> dict[str, str]:
    cmap = plt.get_cmap("tab10")
    fixed = {"nccl-seq": "#000000", "nccl-overlap": "#7f7f7f", "kosmos[self]": "#2ca02c", "kosmos[predicted]": "#9467bd"}
    out, i = {}, 0
    for v in variants:
        if v in fixed:
            out[v] = fixed[v]
        else:
            while i < 40 and cmap(i % 10)[:3] in [matplotlib.colors.to_rgb(c) for c in fixed.values()]:
                i += 1
            out[v] = matplotlib.colors.to_hex(cmap(i % 10))
            i += 1
    return out


def fig_speedup(df: pd.DataFrame, run_dir: Path):
    d = _ok(df)
    base = "torch-moe" if set(d["op"].astype(str)) <= set(MOE_OPS) else SEQ_IMPL  # report.BASELINE_IMPL
    d = d[(d["impl"] != base) & d["speedup_vs_seq"].notna()]
    d = d[(d["impl"] != "kosmos") | is_default_kosmos(d)]
    if d.empty:
        raise Skip("no ok point has an nccl-seq baseline of the same shape (speedup needs both)")
    multi = _multi(d)
    d = d.assign(shape=[shape_label(r, multi) for r in d.to_dict(orient="records")])
    shapes = list(dict.fromkeys(d.sort_values(_shape_cols(d))["shape"]))
    variants = _variant_order(d["variant"])
    pal = _df_palette(df)
    piv = d.groupby(["shape", "variant"])["speedup_vs_seq"].median().unstack("variant").reindex(index=shapes, columns=variants)
    width = min(20.0, max(7.0, 0.7 * len(shapes) + 0.3 * len(shapes) * len(variants) + 2.5))
    fig, ax = plt.subplots(figsize=(width, 5.2), layout="constrained")
    x = np.arange(len(shapes))
    w = 0.8 / len(variants)
    for i, v in enumerate(variants):
        vals = piv[v].to_numpy(dtype=float)
        bars = ax.bar(x - 0.4 + w * (i + 0.5), np.nan_to_num(vals), w, label=v, color=pal[v])
        if len(shapes) * len(variants) <= 40:
            ax.bar_label(bars, labels=[f"{y:.2f}" if np.isfinite(y) else "" for y in vals], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", lw=1, ls="--", label=f"{base} (= 1)")
    crowded = len(shapes) > 5
    ax.set_xticks(x, shapes, fontsize=8 if not crowded else 7, rotation=35 if crowded else 0,
                  ha="right" if crowded else "center", rotation_mode="anchor")
    ax.set_ylabel(f"speedup over {base} (×, higher is better)")
    ax.set_xlabel("MoE layer" if base != SEQ_IMPL else "GEMM shape M×N×K (global)")
    ax.set_title(f"{', '.join(map(str, d['op'].unique()))}: speedup over {base}"
                 + (" (collective, then GEMM)" if base == SEQ_IMPL else ""))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_ylim(0, max(1.2, float(np.nanmax(piv.to_numpy(dtype=float))) * 1.15))
    gm = d.groupby("variant")["speedup_vs_seq"].apply(lambda s: float(np.exp(np.log(s).mean())))
    lines = [f"geometric-mean speedup over {base}: " + ", ".join(f"{v} **{gm[v]:.2f}×**" for v in variants if v in gm)]
    best = d.loc[d["speedup_vs_seq"].idxmax()]
    lines.append(f"best point: {best['variant']} {best['speedup_vs_seq']:.2f}× at {best['shape'].replace(chr(10), ' ')}")
    return fig, lines


def fig_overlap(df: pd.DataFrame, run_dir: Path):
    d = _ok(df)
    d = d[(d["impl"] != "kosmos") | is_default_kosmos(d)]
    tg = pd.to_numeric(d["t_gemm_us"], errors="coerce")
    tc = pd.to_numeric(d["t_comm_us"], errors="coerce")
    # eff* (report.best_alone_efficiency) when derived: the points' own alone times disagree
    # by a few % on some fabrics, the problem's fastest is the honest denominator
    eff = pd.to_numeric(d["eff_best"], errors="coerce") if "eff_best" in d.columns else d["overlap_efficiency"]
    d = d.assign(ratio=tc / tg, overlap_efficiency=eff.where(eff.notna(), d["overlap_efficiency"]))
    d = d[d["ratio"].notna() & (d["ratio"] > 0) & d["overlap_efficiency"].notna()]
    if d.empty:
        raise Skip("no ok point has t_gemm_us, t_comm_us and a time (the GEMM-alone and collective-alone runs)")
    variants = _variant_order(list(d["variant"].unique()))
    pal = _df_palette(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    markers = "os^Dv<>Ph*"
    for i, v in enumerate([SEQ_IMPL] + [v for v in variants if v != SEQ_IMPL] if SEQ_IMPL in variants else variants):
        g = d[d["variant"] == v].sort_values("ratio")
        if g.empty:
            continue
        ax.plot(g["ratio"], g["overlap_efficiency"], marker=markers[i % len(markers)], ls="none", ms=7,
                color=pal.get(v, "black"), label=v, alpha=0.8)
    lo, hi = float(d["ratio"].min()), float(d["ratio"].max())
    r = np.geomspace(min(lo, 0.1) / 1.5, max(hi, 10) * 1.5, 200)
    ax.plot(r, np.maximum(r, 1) / (1 + r), color="grey", ls=":", lw=1.2, label="no overlap: max/(gemm+comm)")
    # the same efficiency of GEMM alone + collective alone issued together, no dependency
    # (t_concurrent_us): how much overlap the chip itself allows at each problem
    ref = d["overlap_efficiency"] / pd.to_numeric(d.get("eff_concurrent"), errors="coerce") \
        if "eff_concurrent" in d.columns else pd.Series(np.nan, index=d.index)
    if ref.notna().any():
        ax.plot(d["ratio"][ref.notna()], ref.dropna(), marker="x", ls="none", ms=6, color="black", alpha=0.6,
                label="GEMM + collective together, no dependency")
    ax.axhline(1.0, color="black", ls="--", lw=1, label="perfect overlap")
    ax.set_xscale("log")
    ax.set_xlim(r[0], r[-1])
    ax.set_ylim(0, max(1.1, float(d["overlap_efficiency"].max()) * 1.05))
    ax.set_xlabel("comm / compute ratio  t_comm_us / t_gemm_us  (collective alone / GEMM alone, log)")
    ax.set_ylabel("overlap efficiency  max(t_gemm, t_comm) / t_fused\n(fastest alone times of the problem)")
    ax.set_title("Overlap efficiency vs comm/compute ratio (1 = as fast as the longer half)")
    ax.legend(fontsize=8, loc="lower right")
    med = d.groupby("variant")["overlap_efficiency"].median()
    lines = ["median overlap efficiency: " + ", ".join(f"{v} {med[v]:.2f}" for v in variants if v in med),
             f"comm/compute ratios covered: {lo:.2g} – {hi:.2g}"]
    if ref.notna().any():
        lines.append(f"GEMM alone + collective alone issued together (no dependency): median {ref.median():.2f}, "
                     f"range {ref.min():.2f} – {ref.max():.2f} of the same ideal")
    return fig, lines


def _traced_keys(df: pd.DataFrame, run_dir: Path) -> list[str]:
    """Names of the stored role timelines (traces/<key>[-profiler].parquet) of the points in df."""
    keys = set(df["key"].astype(str)) if "key" in df.columns else set()
    return sorted(s for s in (p.stem for p in trace_files(run_dir)) if s.split("-")[0] in keys)


def no_timeline_reason(df: pd.DataFrame, run_dir: Path) -> str:
    """Why no role-timeline figure can be drawn, consistent with the summary table of index.md
    (the rows carry per-point summaries even where no timeline is stored)."""
    n = int(pd.to_numeric(df["busy_frac"], errors="coerce").notna().sum()) if "busy_frac" in df.columns else 0
    if Path(run_dir).is_file():
        why = "a compacted run (.parquet) keeps the rows, not the role timelines (plot the run directory for this figure)"
    else:
        why = "no role timeline is stored in this run (`sweep --trace` stores them under traces/)"
    if n:
        why += f"; the role-timeline summaries of {n} points are in the table at the end"
    return why


def choose_trace_key(df: pd.DataFrame, run_dir: Path, trace_key: str | None) -> str:
    keys = _traced_keys(df, run_dir)
    if trace_key is not None:
        hits = [k for k in keys if k.startswith(trace_key)]
        if not hits:
            raise Skip(f"no trace for key {trace_key!r} under {run_dir} (traced keys: {', '.join(keys[:8]) or 'none'})")
        return hits[0]
    if not keys:
        raise Skip(no_timeline_reason(df, run_dir))
    d = df[df["key"].isin(keys)]
    if d.empty:  # e.g. only external-profiler traces ('<key>-rocprofv3')
        return keys[0]
    d = d.assign(_self=~d["variant"].astype(str).str.startswith("kosmos[self]"),
                 _kos=d["impl"] != "kosmos", _ok=d["status"] != "ok")
    d = d.sort_values(["_ok", "_kos", "_self"] + _shape_cols(d), kind="stable")
    return str(d.iloc[0]["key"])


def _row_of(df, key) -> dict:
    r = df[df["key"] == key]
    return r.iloc[0].to_dict() if len(r) else {"variant": "?", "key": key}


def _point_title(row: dict) -> str:
    try:
        return (f"{row.get('variant')} {row.get('op')} M={int(row['M'])} N={int(row['N'])} K={int(row['K'])} "
                f"W={int(row['world'])} ({row.get('fabric')}, {row.get('backend')})")
    except (KeyError, TypeError, ValueError):
        return str(row.get("variant"))


def _gantt(ax, t: pd.DataFrame, span_us: float, ylabel: str) -> None:
    """Draw one rank's records: a row per WG, bars coloured by role, time from its first record."""
    t0 = int(t["t0_ns"].min())
    wgs = sorted(t["wg"].unique())
    ypos = {w: i for i, w in enumerate(wgs)}
    row_h = 0.8 if len(wgs) <= 40 else 1.0
    n_lanes = int(t["lane"].max()) + 1 if "lane" in t.columns and len(t) else 1  # concurrent agents split the row
    for role, g in t.groupby("role"):
        lane = g["lane"].to_numpy() if n_lanes > 1 else 0
        y = g["wg"].map(ypos).to_numpy() + (lane - (n_lanes - 1) / 2) * row_h / n_lanes
        s = (g["t0_ns"].to_numpy() - t0) / 1e3
        w = (g["t1_ns"] - g["t0_ns"]).to_numpy() / 1e3
        # rasterized: a real trace has 10^4-10^5 bars; keeps the SVG small
        ax.barh(y, w, left=s, height=row_h / n_lanes, color=ROLE_COLORS.get(role, "black"), linewidth=0,
                label=ROLE_LABELS.get(role, role), rasterized=len(g) > 2000)
    ax.set_ylim(len(wgs) - 0.5, -0.5)
    step = max(1, len(wgs) // 16)
    ax.set_yticks(range(0, len(wgs), step), [str(wgs[i]) for i in range(0, len(wgs), step)], fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlim(0, span_us)
    ax.grid(axis="x", alpha=0.3)


def _role_legend(fig, axes) -> None:
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    known = list(ROLE_LABELS.values())
    order = sorted(range(len(labels)), key=lambda i: known.index(labels[i]) if labels[i] in known else 9)
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center", ncol=4, fontsize=8)


def _rows_height(n_wg: int) -> float:
    """Inches for a Gantt panel of n_wg rows: readable rows when few, compact when 100+."""
    return max(1.3, 0.12 * n_wg) if n_wg <= 40 else min(5.0, 4.0 + 0.01 * n_wg)


def _span_us(t: pd.DataFrame) -> float:
    return (int(t["t1_ns"].max()) - int(t["t0_ns"].min())) / 1e3


def fig_timeline(df: pd.DataFrame, run_dir: Path, trace_key: str | None = None, max_ranks: int = 2):
    key = choose_trace_key(df, run_dir, trace_key)
    tr = load_traces(run_dir, key)
    if tr.empty:
        raise Skip(f"trace {key} is empty")
    row = _row_of(df, key)
    ranks = sorted(tr["rank"].unique())[:max_ranks]
    n_wg = [tr.loc[tr["rank"] == r, "wg"].nunique() for r in ranks]
    height = min(14.0, 1.2 + sum(_rows_height(n) for n in n_wg))
    fig, axes = plt.subplots(len(ranks), 1, figsize=(11, height), squeeze=False, layout="constrained",
                             height_ratios=[max(1, n) for n in n_wg], sharex=True)
    span_us = max((int(tr.loc[tr["rank"] == r, "t1_ns"].max()) - int(tr.loc[tr["rank"] == r, "t0_ns"].min())) / 1e3
                  for r in ranks)
    for ax, rk in zip(axes[:, 0], ranks):
        _gantt(ax, tr[tr["rank"] == rk], span_us, f"rank {rk}: WG")
    axes[-1, 0].set_xlabel("time since the rank's first record (us); white = idle gap")
    _role_legend(fig, axes[:, 0])
    total_ranks = tr["rank"].nunique()
    shown = "" if total_ranks <= len(ranks) else f" (ranks {', '.join(map(str, ranks))} of {total_ranks})"
    fig.suptitle(f"Role timeline: {_point_title(row)}{shown}", fontsize=10, x=0.01, ha="left")
    s = summarize(tr)
    lines = [f"point `{key}`: {_point_title(row)}",
             f"busy {s['busy_frac'] * 100:.1f}% of WG-time (MOVE {s['busy_frac_move'] * 100:.1f}%, "
             f"BUILD {s['busy_frac_build'] * 100:.1f}%, REDUCE {s['busy_frac_reduce'] * 100:.1f}%), "
             f"idle {s['idle_frac'] * 100:.1f}% in {s['idle_windows']} windows (longest {s['idle_longest_us']:.1f} us, "
             f"p90 {s['idle_p90_us']:.1f} us)",
             f"kernel {s['kernel_us']:.1f} us; first BUILD after {s['first_build_us']:.1f} us; "
             f"tail after last MOVE {s['tail_after_move_us']:.1f} us; {s['role_switches']} role switches"]
    lines += [f"{k.kind} ({k.role}): {k.items} items, {k.busy_ms_per_wg:.3f} ms per WG, {k.us_per_item:.1f} us each, "
              f"{k.first_ms:.3f}-{k.last_ms:.3f} ms" for k in kind_summary(tr).itertuples()]
    return fig, lines, key, tr, row


def _policy_group(df: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """Traced, non-ablation kosmos rows of the shape with the most traced policies."""
    keys = set(_traced_keys(df, run_dir))
    if not keys:
        raise Skip(no_timeline_reason(df, run_dir))
    d = df[df["key"].isin(keys) & (df["impl"] == "kosmos")]
    d = d[is_default_kosmos(d)]
    if d.empty:
        raise Skip("no traced kosmos point (run the sweep with --trace and the kosmos impl)")
    groups = [g for _, g in d.groupby(_shape_cols(d), dropna=False, sort=True)]
    best = max(groups, key=lambda g: g["policy"].nunique())  # first (smallest) shape on ties
    if best["policy"].nunique() < 2:
        raise Skip("no shape has traces of two or more policies (e.g. self and fixed:k)")
    return best


def fig_timeline_policies(df: pd.DataFrame, run_dir: Path, max_variants: int = 4):
    best = _policy_group(df, run_dir)
    variants = _variant_order(best["variant"], self_first=True)
    if len(variants) > max_variants:  # self, predicted, then the smallest and largest fixed:k
        fixed = [v for v in variants if "fixed" in v]
        keep = [v for v in variants if "fixed" not in v][:2] + fixed[:1] + fixed[-1:]
        variants = [v for v in variants if v in keep][:max_variants]
    traces = {}
    for v in variants:
        key = best.loc[best["variant"] == v, "key"].iloc[0]
        tr = load_traces(run_dir, key)
        tr = tr[tr["rank"] == tr["rank"].min()]
        if len(tr):
            traces[v] = tr
    if len(traces) < 2:
        raise Skip("fewer than two of the traced policies have records")
    span = max(_span_us(t) for t in traces.values())
    n_wg = [t["wg"].nunique() for t in traces.values()]
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, min(16.0, 1.4 + sum(_rows_height(n) for n in n_wg))),
                             squeeze=False, sharex=True, layout="constrained", height_ratios=[max(1, n) for n in n_wg])
    lines = []
    for ax, (v, t) in zip(axes[:, 0], traces.items()):
        s = summarize(t)
        _gantt(ax, t, span, f"{v}\nWG")
        ax.set_title(f"{v}: kernel {s['kernel_us']:.1f} us, busy {s['busy_frac'] * 100:.0f}%, "
                     f"idle windows {s['idle_windows']} (longest {s['idle_longest_us']:.1f} us)", fontsize=8, loc="left")
        lines.append(f"{v}: kernel {s['kernel_us']:.1f} us, busy {s['busy_frac'] * 100:.1f}%, "
                     f"MOVE {s['busy_frac_move'] * 100:.1f}% / BUILD {s['busy_frac_build'] * 100:.1f}%, "
                     f"first BUILD {s['first_build_us']:.1f} us, tail after last MOVE {s['tail_after_move_us']:.1f} us")
    axes[-1, 0].set_xlabel("time since the kernel's first record (us), same scale in every panel")
    _role_legend(fig, axes[:, 0])
    r = best.iloc[0].to_dict()
    fig.suptitle(f"Role timelines by policy (rank {int(next(iter(traces.values()))['rank'].iloc[0])}): {r['op']} "
                 f"M={int(r['M'])} N={int(r['N'])} K={int(r['K'])} W={int(r['world'])} ({r.get('fabric')}, {r.get('backend')})",
                 fontsize=10, x=0.01, ha="left")
    return fig, lines


def fig_idle_cdf(df: pd.DataFrame, run_dir: Path):
    best = _policy_group(df, run_dir)
    variants = _variant_order(best["variant"])
    pal = _df_palette(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    lines = []
    for v in variants:
        key = best.loc[best["variant"] == v, "key"].iloc[0]
        iw = idle_windows(load_traces(run_dir, key))
        if iw.empty:
            lines.append(f"{v}: no idle windows")
            continue
        us = np.sort(iw["dur_ns"].to_numpy(dtype=float) / 1e3)
        y = np.arange(1, len(us) + 1) / len(us)
        ax.step(us, y, where="post", color=pal[v], lw=1.6,
                label=f"{v}: {len(us)} windows, total {us.sum():.0f} WG-us, p50 {np.median(us):.2f} us")
        lines.append(f"{v}: {len(us)} idle windows, total {us.sum():.1f} WG-us, p50 {np.median(us):.2f} us, "
                     f"p90 {np.percentile(us, 90):.2f} us, longest {us.max():.2f} us")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("idle-window length (us, log): a WG running no MOVE/BUILD/REDUCE")
    ax.set_ylabel("fraction of idle windows ≤ x")
    r = best.iloc[0].to_dict()
    ax.set_title(f"Idle-window CDF, {r['op']} M={int(r['M'])} N={int(r['N'])} K={int(r['K'])} W={int(r['world'])}: "
                 f"self vs fixed roles", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig, lines


def fig_ablation(df: pd.DataFrame, run_dir: Path):
    d = _ok(df)
    d = d[d["impl"] == "kosmos"]
    if d.empty:
        raise Skip("no ok kosmos point")
    panels = []
    shape_cols = _shape_cols(d)
    for knob in KNOBS:
        others = [k for k in KNOBS if k != knob]
        kv = {k: _knob(d, k) for k in KNOBS}
        dd = d.assign(**{f"_{k}": kv[k] for k in KNOBS})
        gcols = shape_cols + [f"_{k}" for k in others]
        groups = [g for _, g in dd.groupby(gcols, dropna=False) if g[f"_{knob}"].nunique() > 1]
        if groups:
            panels.append((knob, groups))
    if not panels:
        raise Skip("no shape was run with two or more values of queue_order, policy, local_first or chunk")
    multi = _multi(d)
    labels = list(dict.fromkeys(_group_label(g, knob, multi) for knob, groups in panels for g in groups))
    cmap = plt.get_cmap("tab10")
    colors = {lab: cmap(i % 10) for i, lab in enumerate(labels)}  # a shape has one colour in every panel
    # wide enough for the title and the tick labels; the shapes' legend goes below the panels, never over bars
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8.0, 4.8 * len(panels)), 5.4), squeeze=False,
                             layout="constrained")
    lines = []
    for ax, (knob, groups) in zip(axes[0], panels):
        use_speedup = all(g["speedup_vs_seq"].notna().all() for g in groups)
        values = list(dict.fromkeys(v for g in groups for v in _sort_knob(knob, g[f"_{knob}"].unique())))
        w = 0.8 / len(groups)
        top = 1.0
        for gi, g in enumerate(groups):
            t = pd.to_numeric(g["t_median_us"], errors="coerce")
            if use_speedup:
                y = g["speedup_vs_seq"].astype(float)
            else:  # relative to the knob's default value (or the fastest when it is absent)
                ref = t[g[f"_{knob}"] == _knob_str(None, knob)]
                y = (ref.median() if len(ref) else t.min()) / t
            ser = pd.Series(y.to_numpy(), index=g[f"_{knob}"].to_numpy()).groupby(level=0).median().reindex(values)
            lab = _group_label(g, knob, multi)
            bars = ax.bar(np.arange(len(values)) - 0.4 + w * (gi + 0.5), ser.to_numpy(), w, label=lab,
                          color=colors[lab])
            if len(values) * len(groups) <= 24:
                ax.bar_label(bars, labels=[f"{v:.2f}" if np.isfinite(v) else "" for v in ser.to_numpy()], fontsize=7,
                             padding=1)
            if np.isfinite(ser.to_numpy(dtype=float)).any():
                top = max(top, float(np.nanmax(ser.to_numpy(dtype=float))))
            bestv = ser.idxmax()
            lines.append(f"{KNOB_TITLES[knob]} @ {lab}: best {bestv} ({ser.max():.2f}×), "
                         + ", ".join(f"{k} {v:.2f}×" for k, v in ser.items() if np.isfinite(v)))
        ax.axhline(1.0, color="black", ls="--", lw=1)
        ax.set_ylim(0, top * 1.12)  # room for the value labels above the tallest bar
        ticks = [{"True": "on", "False": "off"}.get(v, v) if knob == "local_first" else v for v in values]
        ax.set_xticks(range(len(values)), ticks, rotation=20 if len(values) > 4 else 0)
        ax.set_xlabel(KNOB_TITLES[knob])
        ax.set_ylabel("speedup over nccl-seq (×)" if use_speedup else f"speedup over {knob}={KNOBS[knob]} (×)")
        ax.set_title(f"Ablation: {KNOB_TITLES[knob]}", fontsize=10)
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(3, len(handles)),
               fontsize=8, title="shape", title_fontsize=8)
    fig.suptitle("KOSMOS ablations: higher is better (other knobs at their values in the run)", fontsize=10)
    return fig, lines


def _group_label(g: pd.DataFrame, knob: str, multi: dict) -> str:
    """A bar group's legend label: its shape, plus the other knobs where they are not at their defaults."""
    extra = [f"{k}={g[f'_{k}'].iloc[0]}" for k in KNOBS if k != knob and g[f"_{k}"].iloc[0] != _knob_str(None, k)]
    return shape_label(g.iloc[0].to_dict(), multi).replace("\n", " ") + (f" ({', '.join(extra)})" if extra else "")


def _sort_knob(knob, vals):
    if knob == "policy":
        def k(v):
            if v == "self":
                return (0, 0)
            if v == "predicted":
                return (2, 0)
            try:
                return (1, int(str(v).split(":")[1]))
            except (IndexError, ValueError):
                return (3, 0)
        return sorted(vals, key=k)
    if knob == "chunk":
        return sorted(vals, key=lambda v: float(v) if str(v).replace(".", "").isdigit() else 1e9)
    if knob == "queue_order":
        order = ["demand", "fifo", "reverse", "random"]
        return sorted(vals, key=lambda v: order.index(v) if v in order else 9)
    return sorted(vals, key=lambda v: str(v) != "True")
