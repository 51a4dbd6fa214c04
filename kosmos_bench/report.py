"""Reports the nccl-tests way: a header (config, devices, backend/fabric), one fixed-width row
per point, a footer with the verdict; ``--json`` for machines; ``--compare A B`` for
before/after.

Derived metrics live here, in one place (the harness calls `derive` too):

    speedup_vs_seq     = t_median_us(nccl-seq of the same op, dtype, M, N, K, world, fabric,
                         backend; same run when it has one) / t_median_us
    overlap_efficiency = max(t_gemm_us, t_comm_us) / t_median_us   (1.0 = perfect overlap:
                         the fused op takes as long as its longer half alone)
    eff_best           = the same against the problem's fastest GEMM alone and collective
                         alone among the rows at hand (each point times its own, interleaved
                         with its op, and those differ by up to ~5%: a point whose copy alone
                         ran slow would otherwise look better overlapped than it is)
    eff_concurrent     = t_concurrent_us / t_median_us, t_concurrent_us being the GEMM alone
                         and the collective alone issued together on two streams with no
                         dependency (GPU points): 1.0 = the op overlaps as well as the chip
                         lets two independent jobs share it (SMs, HBM, power budget)
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .point import MOE_OPS
from .store import load_manifest, load_rows

SEQ_IMPL = "nccl-seq"
# The op without communication (gemm) is measured against plain cuBLAS instead.
BASELINE_IMPL = {"gemm": "torch", "moe": "torch-moe", "moe-bwd": "torch-moe", "moe-step": "torch-moe"}


def baseline_impl(op) -> str:
    return BASELINE_IMPL.get(op, SEQ_IMPL)
# A row's speedup is measured against nccl-seq rows that agree on all of these.
MATCH_COLS = ["op", "dtype", "M", "N", "K", "world", "fabric", "backend", "moe", "routing", "experts"]
BAD_STATUSES = ("wrong", "failed", "timeout")

FABRIC_NOTES = {
    "host": "fabric=host: rank-0 view on ONE GPU; peers' data sits in pinned host memory and crosses PCIe",
    "local": "EMULATED ranks: fabric=local runs all W ranks on ONE GPU; timings are not multi-GPU results",
    "nvlink": "fabric=nvlink: one process per GPU, peers over NVLink (symmetric memory)",
    "gloo": "fabric=gloo: one CPU process per rank over gloo; a correctness path, not GPU timings",
}
BACKEND_NOTES = {
    "sim": "SIMULATED: backend=sim; times come from the discrete-event model, no GPU ran these points",
    "cpu": "backend=cpu: CPU processes (gloo); timings are not GPU numbers",
}


# ----------------------------------------------------------------------------- metrics
def overlap_efficiency(t_gemm_us, t_comm_us, t_fused_us):
    """max(t_gemm, t_comm) / t_fused; NaN where t_gemm or t_fused is missing or t_fused <= 0.

    A missing t_comm counts as 0 (no collective, e.g. world 1). Works on scalars and on
    array-likes (returns a float or a numpy array)."""
    g = np.asarray(pd.to_numeric(pd.Series(np.atleast_1d(t_gemm_us)), errors="coerce"), dtype=float)
    c = np.asarray(pd.to_numeric(pd.Series(np.atleast_1d(t_comm_us)), errors="coerce"), dtype=float)
    f = np.asarray(pd.to_numeric(pd.Series(np.atleast_1d(t_fused_us)), errors="coerce"), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(f > 0, np.maximum(g, np.nan_to_num(c, nan=0.0)) / f, np.nan)
    out = np.where(np.isnan(g), np.nan, out)
    return float(out[0]) if np.ndim(t_fused_us) == 0 else out


def _match_key(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    # map(str), not astype(str): the latter keeps NaN as a float in object columns
    return df[cols].apply(lambda c: c.map(str)).agg("|".join, axis=1)


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """Copy of `df` with `speedup_vs_seq` and `overlap_efficiency` (re)computed.

    The nccl-seq baseline of a row is the median t_median_us of the 'ok' nccl-seq rows that
    match it on MATCH_COLS, taken from the same run_id when that run has one, else from any
    run in `df`. Rows that are not 'ok' or have no baseline get NaN.
    """
    df = df.copy()
    if df.empty:
        for c in ("speedup_vs_seq", "overlap_efficiency", "eff_best", "eff_concurrent"):
            df[c] = pd.Series(dtype=float)
        return df
    for c in MATCH_COLS + ["run_id", "impl", "status"]:
        if c not in df.columns:
            df[c] = None
    t = pd.to_numeric(df["t_median_us"], errors="coerce") if "t_median_us" in df.columns else pd.Series(np.nan, index=df.index)
    ok = df["status"].astype(str) == "ok"
    if {"t_gemm_us", "t_comm_us"} <= set(df.columns):
        eff = pd.Series(overlap_efficiency(df["t_gemm_us"].to_numpy(), df["t_comm_us"].to_numpy(), t.to_numpy()), index=df.index)
        old = pd.to_numeric(df.get("overlap_efficiency"), errors="coerce") if "overlap_efficiency" in df.columns else eff
        df["overlap_efficiency"] = eff.where(eff.notna(), old).where(ok, np.nan)
    elif "overlap_efficiency" not in df.columns:
        df["overlap_efficiency"] = np.nan
    df["eff_best"] = best_alone_efficiency(df, t, ok)
    conc = pd.to_numeric(df["t_concurrent_us"], errors="coerce") if "t_concurrent_us" in df.columns else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        df["eff_concurrent"] = (conc / t).where(ok & (t > 0), np.nan).astype(float)
    k_any = _match_key(df, MATCH_COLS)
    k_run = k_any + "|" + df["run_id"].astype(str)
    is_base = df["impl"] == df["op"].map(baseline_impl)
    seq = ok & is_base & t.notna()
    base_run = t[seq].groupby(k_run[seq]).median()
    base_any = t[seq].groupby(k_any[seq]).median()
    base = k_run.map(base_run)
    base = base.where(base.notna(), k_any.map(base_any))
    with np.errstate(invalid="ignore", divide="ignore"):
        df["speedup_vs_seq"] = (base / t).where(ok & (t > 0), np.nan).astype(float)
    return df


# ------------------------------------------------------------------------------ text
_COLS = [  # (title, width, align)
    ("op", 8, "<"), ("variant", 40, "<"), ("world", 5, ">"), ("M", 7, ">"), ("N", 7, ">"), ("K", 7, ">"),
    ("time(us)", 10, ">"), ("TFLOP/s", 9, ">"), ("busbw(GB/s)", 11, ">"), ("speedup", 8, ">"),
    ("ovl-eff", 7, ">"), ("eff*", 5, ">"), ("eff-cc", 6, ">"), ("MHz op/gemm", 11, ">"), ("wrong", 6, ">"), ("status", 8, "<"),
]


def _isnum(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and not isinstance(v, str) and not pd.isna(v)


def _num(v, fmt: str, suffix: str = "") -> str:
    return (format(float(v), fmt) + suffix) if _isnum(v) else "-"


def _fit(s, width: int, align: str) -> str:
    """Pad to width; left-aligned text (names) is cut in the middle with '~' (a variant's varied
    settings, name=value, sit at its end); a number too wide for its column is written shorter
    (1e+09, 3.2e+17) rather than pushing the columns after it out of line."""
    text = str(s)
    if len(text) > width and align == "<":
        head = (width - 1) // 2
        text = text[:head] + "~" + text[len(text) - (width - 1 - head):]
    elif len(text) > width:
        try:
            v = float(text.rstrip("x"))
        except ValueError:
            v = None
        if v is not None:
            for digits in (3, 2, 1, 0):
                short = format(v, f".{digits}e").replace("e+0", "e+").replace("e-0", "e-") + text[len(text.rstrip("x")):]
                if len(short) <= width:
                    text = short
                    break
    return format(text, f"{align}{width}")


# op moe: what a MoE user reads (layer, tokens/s, fraction of the dense-GEMM compute bound, bytes
# rank 0 dispatches per call, tokens per expert max/mean, compile time of compiled baselines)
_MOE_COLS = [
    ("op", 8, "<"), ("variant", 30, "<"), ("world", 5, ">"), ("fabric", 6, "<"), ("preset", 15, "<"), ("T", 6, ">"),
    ("routing", 9, "<"), ("time(us)", 10, ">"), ("tokens/s", 9, ">"), ("TFLOP/s", 8, ">"), ("bound", 5, ">"),
    ("speedup", 8, ">"), ("disp(MB)", 8, ">"), ("tok/exp max/mean", 16, ">"), ("compile_s", 9, ">"),
    ("wrong", 6, ">"), ("status", 8, "<"),
]


def column_header(op: str | None = None) -> str:
    """The fixed-width column titles, '#'-prefixed like nccl-tests (op moe: its own columns)."""
    cols = _MOE_COLS if op in MOE_OPS else _COLS
    return ("#" + " ".join(_fit(t, w - (1 if i == 0 else 0), a) for i, (t, w, a) in enumerate(cols))).rstrip()


def _moe_row_text(row: dict) -> str:
    g = row.get
    t = g("t_median_us")
    mx, mean = g("tok_per_expert_max"), g("tok_per_expert_mean")
    disp = g("dispatch_bytes")
    vals = [
        g("op") or "moe", g("variant") or g("impl") or "-", int(g("world")) if _isnum(g("world")) else "-", g("fabric") or "-",
        g("moe") or "-", int(g("M")) if _isnum(g("M")) else "-", g("routing") or "-",
        _num(t, ".1f" if _isnum(t) and float(t) >= 1e4 else ".2f"), _num(g("tokens_per_s"), ".3g"),
        _num(g("tflops"), ".1f"), _num(g("frac_bound"), ".2f"), _num(g("speedup_vs_seq"), ".2f", "x"),
        _num(float(disp) / 1e6 if _isnum(disp) else None, ".1f"),
        f"{_num(mx, '.0f')}/{_num(mean, '.0f')}" if _isnum(mx) else "-", _num(g("compile_s"), ".1f"),
        int(g("wrong")) if _isnum(g("wrong")) else "-", g("status") or "-",
    ]
    return " ".join(_fit(v, w, a) for v, (_, w, a) in zip(vals, _MOE_COLS)).rstrip()


def _clocks(op, gemm) -> str:
    """SM clock of the op / of its GEMM alone (NVML), or '-': a power-limited GPU clocks them
    differently, which overlap efficiency alone does not show."""
    if not _isnum(op) and not _isnum(gemm):
        return "-"
    return f"{_num(op, '.0f')}/{_num(gemm, '.0f')}"


def row_text(row: dict) -> str:
    """One fixed-width line for a result row (a dict with RESULT_COLUMNS; derived ones may be missing)."""
    g = row.get
    if g("op") in MOE_OPS:
        line = _moe_row_text(row)
        err = g("error")
        if g("status") not in (None, "ok") and isinstance(err, str) and err:
            line += "  " + err.strip().splitlines()[0][:120]
        return line
    t = g("t_median_us")
    time_s = _num(t, ".1f" if _isnum(t) and float(t) >= 1e4 else ".2f")
    wrong = g("wrong")
    vals = [
        g("op") or "-", g("variant") or g("impl") or "-", g("world") if _isnum(g("world")) else "-",
        *(int(g(k)) if _isnum(g(k)) else "-" for k in ("M", "N", "K")),
        time_s, _num(g("tflops"), ".2f"), _num(g("busbw_gbs"), ".2f"), _num(g("speedup_vs_seq"), ".2f", "x"),
        _num(g("overlap_efficiency"), ".2f"), _num(g("eff_best"), ".2f"), _num(g("eff_concurrent"), ".2f"),
        _clocks(g("sm_mhz"), g("sm_mhz_gemm")),
        int(wrong) if _isnum(wrong) else "-", g("status") or "-",
    ]
    vals[2] = int(vals[2]) if _isnum(vals[2]) else vals[2]
    line = " ".join(_fit(v, w, a) for v, (_, w, a) in zip(vals, _COLS)).rstrip()
    err = g("error")
    if g("status") not in (None, "ok") and isinstance(err, str) and err:
        line += "  " + err.strip().splitlines()[0][:120]
    return line


def _uniq(values) -> list:
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if x not in out:
                out.append(x)
    return out


def points_summary(points) -> str:
    """One line describing a set of points (a DataFrame of rows, or a list of Points/dicts)."""
    if isinstance(points, pd.DataFrame):
        df = points
    else:
        df = pd.DataFrame([p if isinstance(p, dict) else p.as_row() for p in points])
    if df.empty:
        return "0 points"

    def vals(c):
        return ",".join(str(v) for v in _uniq(df[c].tolist())) if c in df.columns else "-"

    impls = df["impl"].value_counts(sort=False) if "impl" in df.columns else pd.Series(dtype=int)
    impl_s = ", ".join(f"{k} x{v}" for k, v in impls.items())
    return (f"{len(df)} points | op {vals('op')} | world {vals('world')} | dtype {vals('dtype')} | "
            f"backend {vals('backend')} | fabric {vals('fabric')} | impls: {impl_s}")


def header_text(manifest: dict, points_summary: str) -> str:
    """Header lines (each '# '-prefixed): command, devices and software, points, caveats.

    Backend/fabric caveats come from manifest['backend'/'backends'/'fabric'/'fabrics'] and
    from 'backend X' / 'backend=X' / 'fabric Y,Z' in points_summary.
    """
    m = manifest or {}
    gpus = m.get("gpus") or []
    if gpus:
        counts = pd.Series(gpus).value_counts()
        dev = ", ".join(f"{n}x {name}" for name, n in counts.items())
    else:
        dev = "no GPU"
    sw = [f"driver {m['driver']}" if m.get("driver") else None,
          f"CUDA {m['cuda']}" if m.get("cuda") else None,
          f"ROCm/HIP {m['hip']}" if m.get("hip") else None,
          f"torch {m['torch']}" if m.get("torch") else None,
          f"NCCL {m['nccl']}" if m.get("nccl") else None]
    git = m.get("git_sha")
    if git:
        sw.append(f"git {str(git)[:10]}" + (" (dirty)" if m.get("git_dirty") else ""))
    if m.get("source_hash"):
        sw.append(f"src {m['source_hash']}")
    lines = [f"# kosmos-bench | {m.get('command', '?')}",
             f"# host {m.get('host', '?')} | {m.get('time', '?')} | devices: {dev}",
             "# " + " | ".join(s for s in sw if s) if any(sw) else "# (no software versions in manifest)",
             f"# points: {points_summary}"]
    backends = _uniq([m.get("backend"), m.get("backends")])
    fabrics = _uniq([m.get("fabric"), m.get("fabrics")])
    for tok, found in (("backend", backends), ("fabric", fabrics)):
        for mt in re.finditer(rf"\b{tok}[= ]([\w,-]+)", points_summary):
            for v in mt.group(1).split(","):
                if v and v != "-" and v not in found:
                    found.append(v)
    if m.get("synthetic"):
        lines.append("# SYNTHETIC data (kosmos_bench.trace.synth): a demo of the analysis, not a measurement")
    for b in backends:
        if b in BACKEND_NOTES:
            lines.append("# " + BACKEND_NOTES[b])
    for f in fabrics:
        if f in FABRIC_NOTES:
            lines.append("# " + FABRIC_NOTES[f])
    return "\n".join(lines)


def verdict(df: pd.DataFrame) -> dict:
    """Counts per status and the exit code: 1 when any point was wrong, failed or timed out, or
    when nothing ran (every point skipped: `nothing_ran`, with the commonest reasons in
    `skip_reasons`), else 0."""
    st = df["status"].astype(str) if "status" in df.columns else pd.Series(dtype=str)
    v = {s: int((st == s).sum()) for s in ("ok", "wrong", "failed", "skipped", "timeout")}
    v["total"] = int(len(df))
    v["nothing_ran"] = v["total"] > 0 and v["skipped"] == v["total"]
    v["skip_reasons"] = skip_reasons(df) if v["nothing_ran"] else []
    v["exit_code"] = 1 if any(v[s] for s in BAD_STATUSES) or v["nothing_ran"] else 0
    return v


def skip_reasons(df: pd.DataFrame, top: int = 2) -> list[str]:
    """The commonest reasons of the skipped rows, '<n> x <reason>', most frequent first."""
    if "status" not in df.columns or "error" not in df.columns:
        return []
    err = df.loc[df["status"].astype(str) == "skipped", "error"].dropna().astype(str)
    counts = err.map(lambda e: (e.strip().splitlines() or [""])[0][:120]).value_counts()
    out = [f"{n} x {why}" for why, n in counts.head(top).items()]
    if len(counts) > top:
        out.append(f"{len(counts) - top} more reason(s)")
    return out


def geomean_speedups(df: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """variant -> (geometric-mean speedup over nccl-seq, number of points), nccl-seq excluded."""
    df = derive(df)
    out = {}
    s = pd.to_numeric(df["speedup_vs_seq"], errors="coerce")
    sel = s.notna() & (s > 0) & (df["impl"] != df["op"].map(baseline_impl))
    var = df["variant"].where(df["variant"].notna(), df["impl"]).astype(str)
    for v, g in s[sel].groupby(var[sel], sort=False):
        out[v] = (float(np.exp(np.log(g).mean())), int(len(g)))
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0]))


SPREAD_NOTE = 0.03  # alone times of one problem further apart than this across points get a note

# The alone times efficiencies divide by, and what makes two of them the same problem.
_ALONE = (("t_comm_us", ("op", "world", "fabric", "dtype", "comm_bytes"), "collective alone"),
          ("t_gemm_us", ("op", "world", "fabric", "dtype", "M", "N", "K"), "GEMM alone"))


def best_alone_efficiency(df: pd.DataFrame, t: pd.Series, ok: pd.Series) -> pd.Series:
    """max(fastest GEMM alone, fastest collective alone of the row's problem among the ok rows
    of df) / t: the efficiency against the best alone times measured (see alone_spread)."""
    best = {}
    for col, keys, _ in _ALONE:
        if col not in df.columns or not set(keys) <= set(df.columns):
            best[col] = pd.Series(np.nan, index=df.index)
            continue
        v = pd.to_numeric(df[col], errors="coerce").where(ok)
        key = _match_key(df, list(keys))
        best[col] = key.map(v.groupby(key).min())
    g, c = best["t_gemm_us"], best["t_comm_us"]
    return pd.Series(overlap_efficiency(g.to_numpy(), c.to_numpy(), t.to_numpy()), index=df.index).where(ok, np.nan)


def alone_spread(df: pd.DataFrame) -> list[str]:
    """Notes on the GEMM- and collective-alone times: each point measures its own, interleaved
    with its fused op, so the same problem is measured in several points; when two of them
    differ by more than SPREAD_NOTE, the largest such spread is named (overlap efficiencies
    inherit it: e.g. a copy alone timed after a long GEMM alone ran 5% slower)."""
    ok = df[df["status"].astype(str) == "ok"] if "status" in df.columns else df
    lines = []
    for col, keys, what in _ALONE:
        if col not in ok.columns or not set(keys) <= set(ok.columns):
            continue
        t = ok.assign(_t=pd.to_numeric(ok[col], errors="coerce")).dropna(subset=["_t"])
        if t.empty:
            continue
        g = t.groupby(list(keys))["_t"].agg(["min", "max", "count"])  # rows missing a key drop out
        g = g[(g["count"] > 1) & (g["min"] > 0)]
        if g.empty:
            continue
        i = int((g["max"] / g["min"]).to_numpy().argmax())
        worst, (lo, hi, n) = g.index[i], g.iloc[i]
        if hi / lo - 1 > SPREAD_NOTE:
            key = dict(zip(keys, worst if isinstance(worst, tuple) else (worst,)))
            shape = (f"{float(key['comm_bytes']) / 2 ** 20:g} MiB" if "comm_bytes" in key
                     else "x".join(str(int(key[k])) for k in ("M", "N", "K")))
            lines.append(f"# note: {what} of one problem ({shape}) measured {lo:.0f}-{hi:.0f} us "
                         f"(+{(hi / lo - 1) * 100:.1f}%) across {int(n)} points; ovl-eff uses each point's own, "
                         "eff* the fastest")
    return lines


def overlap_summary(df: pd.DataFrame) -> list[str]:
    """'# median eff* / eff-cc' per variant (derived rows), when any point has them: how well
    each variant overlaps, against the ideal and against the chip's own concurrency."""
    out = []
    for col, what in (("eff_best", "eff* (vs the fastest alone times)"),
                      ("eff_concurrent", "eff-cc (vs GEMM + collective issued together)")):
        if col not in df.columns:
            continue
        v = pd.to_numeric(df[col], errors="coerce")
        var = df["variant"].where(df["variant"].notna(), df["impl"]).astype(str) if "variant" in df.columns else df["impl"]
        med = v.groupby(var).median().dropna()
        if not med.empty:
            med = med.sort_values(ascending=False)
            out.append(f"# median {what}: " + " | ".join(f"{k} {m:.3f}" for k, m in med.items()))
    return out


def clock_limits(df: pd.DataFrame) -> list[str]:
    """A footer line naming what held the SM clock below its maximum (NVML's clock-event
    reasons while each op ran, the majority of its samples), per variant, when anything did:
    a point whose op ran under a power brake or thermal limit, not the average power cap, is
    slower for a reason overlap efficiency does not show."""
    if "clock_limit" not in df.columns:
        return []
    ok = df[(df["status"].astype(str) == "ok") & df["clock_limit"].notna() & (df["clock_limit"] != "none")]
    if ok.empty:
        return []
    parts = []
    for variant, g in ok.groupby(ok["variant"].astype(str), sort=True):
        counts = g["clock_limit"].astype(str).value_counts()
        parts.append(f"{variant}: " + ", ".join(f"{why} {n}" for why, n in counts.items()))
    return ["# clock held below max by (op, points): " + " | ".join(parts)]


# The end-to-end training-step speedups the paper reports for its fused kernels over NCCL + cuBLAS.
PAPER_E2E = (1.10, 1.28)
FABRIC_WORDS = {"host": "host fabric (one GPU, the rank-0 view: peers' shards and partial sums precomputed, "
                        "moved over PCIe; the peers' compute is not run)",
                "nvlink": "nvlink fabric", "local": "local fabric (emulated ranks on one GPU)",
                "gloo": "gloo (CPU processes)"}


def layer_summary(df: pd.DataFrame) -> list[str]:
    """Footer lines of op `layer` rows: per problem, each variant's step time, tokens/s, exposed
    communication share and speedup over nccl-seq, beside the paper's end-to-end range."""
    if "op" not in df.columns:
        return []
    ok = df[(df["op"].astype(str) == "layer") & (df["status"].astype(str) == "ok")]
    if ok.empty:
        return []
    lines = []
    for (M, N, K, W, fab), g in ok.groupby(["M", "N", "K", "world", "fabric"], sort=False):
        parts = []
        for _, r in g.sort_values("variant").iterrows():
            sp = r.get("speedup_vs_seq")
            exp = r.get("exposed_comm_share")
            parts.append(f"{r['variant']} {r['t_median_us'] / 1e3:.2f} ms, {r.get('tokens_per_s', float('nan')) / 1e3:.0f}k tok/s"
                         + (f", exposed comm {exp:.0%}" if _isnum(exp) else "")
                         + (f", {sp:.2f}x vs nccl-seq" if _isnum(sp) and r["impl"] != SEQ_IMPL else ""))
        lines.append(f"# layer T={int(M)} H={int(N)} F={int(K)} W={int(W)}: " + " | ".join(parts))
    fabs = sorted(set(ok["fabric"].astype(str)))
    lines.append(f"# layer speedups vs nccl-seq: the paper reports {PAPER_E2E[0]:.2f}-{PAPER_E2E[1]:.2f}x end to end "
                 f"(multi-GPU NVLink); these rows: {'; '.join(FABRIC_WORDS.get(f, f) for f in fabs)}")
    return lines


def footer_text(df: pd.DataFrame) -> str:
    """Footer lines: verdict counts, geometric-mean speedups per variant, best point, result.

    Speedups are (re)derived from the rows, so live sweeps may pass the rows as stored."""
    df = derive(df)
    v = verdict(df)
    lines = [f"# verdict: {v['ok']} ok, {v['wrong']} wrong, {v['failed']} failed, {v['skipped']} skipped"
             + (f", {v['timeout']} timeout" if v["timeout"] else "") + f"  ({v['total']} points)"]
    gm = geomean_speedups(df)
    if gm:
        lines.append("# geomean speedup vs nccl-seq (torch for op gemm, torch-moe for moe): " + " | ".join(f"{k} {s:.2f}x ({n})" for k, (s, n) in gm.items()))
        s = pd.to_numeric(df["speedup_vs_seq"], errors="coerce").where(df["impl"] != SEQ_IMPL)
        if s.notna().any():
            b = df.loc[s.idxmax()]
            lines.append(f"# best: {b.get('variant')} {s.max():.2f}x at {b.get('op')} "
                         f"M={int(b['M'])} N={int(b['N'])} K={int(b['K'])} world={int(b['world'])}")
    else:
        lines.append("# geomean speedup vs nccl-seq: - (no ok baseline matches these points)")
    if "busbw_gbs" in df.columns:
        bw = pd.to_numeric(df["busbw_gbs"], errors="coerce")[df["status"].astype(str) == "ok"]
        if bw.notna().any():
            lines.append(f"# avg busbw (ok points): {bw.mean():.2f} GB/s")
    lines += overlap_summary(df)
    lines += layer_summary(df)
    lines += alone_spread(df)
    lines += clock_limits(df)
    for col, what in (("trace_dropped", "trace records dropped (per-WG buffer overflow)"),
                      ("trace_clipped", "overlapping trace records clipped")):
        if col in df.columns:
            n = pd.to_numeric(df[col], errors="coerce").fillna(0)
            if (n > 0).any():
                lines.append(f"# WARNING: {int(n.sum())} {what} in {int((n > 0).sum())} point(s)")
    if v["nothing_ran"]:
        lines.append(f"# result: FAIL (nothing ran: all {v['total']} points skipped: "
                     f"{'; '.join(v['skip_reasons']) or 'no reason recorded'}; exit 1)")
    elif v["exit_code"]:
        bad = [f"{v[s]} {s}" for s in BAD_STATUSES if v[s]]
        lines.append(f"# result: FAIL ({', '.join(bad)}; exit 1)")
    else:
        lines.append("# result: PASS (exit 0)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ output
def _error(msg: str) -> None:
    """Errors go to stderr (stdout carries only the report)."""
    print(f"error: {msg}", file=sys.stderr, flush=True)


def _writer(console):
    if console is None:
        return lambda s: print(s, file=sys.stdout)
    if hasattr(console, "out"):  # rich.console.Console: no markup, no highlighting
        return lambda s: console.out(s, highlight=False)
    return lambda s: console.print(s)


_VARIANT_RANK = {SEQ_IMPL: 0, "nccl-overlap": 1, "torch-moe": 0, "torch-moe-compiled": 1, "torch-moe-overlap": 2}


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["_vr"] = df["impl"].map(lambda i: _VARIANT_RANK.get(i, 5 if i == "kosmos" else 3))
    # natural order of variants: fixed:8 before fixed:32
    nat = sorted(df["variant"].astype(str).unique(), key=lambda v: tuple(
        (0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", v)))
    df["_vn"] = df["variant"].astype(str).map({v: i for i, v in enumerate(nat)})
    cols = [c for c in ("op", "world", "M", "N", "K", "moe", "routing", "experts", "dtype", "fabric", "backend",
                        "_vr", "_vn") if c in df.columns]
    df = df.sort_values(cols, kind="stable", na_position="last").drop(columns=["_vr", "_vn"])
    return df.reset_index(drop=True)


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records", default_handler=str))


def _load(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    run_dir = Path(run_dir)
    df = load_rows(run_dir)
    manifest = load_manifest(run_dir)
    if not df.empty:
        if df["run_id"].isna().all():
            df["run_id"] = run_dir.name
        if "variant" in df.columns:
            df["variant"] = df["variant"].where(df["variant"].notna(), df["impl"])
    return df, manifest


def report(run_dirs: list[Path], *, as_json: bool = False, compare: tuple[Path, Path] | None = None,
           console=None) -> int:
    """Print the report of one or more run directories; returns the exit code.

    0: every point ok or skipped (and at least one ran); 1: some point wrong, failed or timed
    out, or every point skipped (nothing ran); 2: no result rows found (or a run directory that
    does not exist), said on stderr. With `compare=(A, B)` prints per-point
    before/after instead (`run_dirs` is then ignored) and returns B's exit code.
    """
    out = _writer(console)
    if compare is not None:
        return _compare(Path(compare[0]), Path(compare[1]), as_json=as_json, out=out)
    frames, manifests = [], {}
    expanded = []
    for d in map(Path, run_dirs):
        if not d.exists():
            _error(f"run directory {d} does not exist")
            return 2
        # A parent of several runs (results/) stands for each run under it.
        subs = [] if (d / "points").is_dir() else sorted(p.parent.parent for p in d.glob("*/points/*.parquet"))
        expanded += list(dict.fromkeys(subs)) or [d]
    for d in expanded:
        df, man = _load(d)
        if df.empty:
            _error(f"no result rows under {d} (expected {d}/points/*.parquet)")
            return 2
        df["run_dir"] = str(d)
        frames.append(df)
        manifests[str(d)] = man
    if not frames:
        _error("no run directories given")
        return 2
    all_df = derive(pd.concat(frames, ignore_index=True))
    code = verdict(all_df)["exit_code"]
    if as_json:
        obj = {"runs": [{"run_dir": d, "manifest": m} for d, m in manifests.items()],
               "rows": _records(_sorted(all_df)), "verdict": verdict(all_df),
               "geomean_speedup_vs_seq": {k: {"speedup": s, "points": n} for k, (s, n) in geomean_speedups(all_df).items()},
               "exit_code": code}
        out(json.dumps(obj, indent=1, default=str))
        return code
    for d, man in manifests.items():
        df = _sorted(all_df[all_df["run_dir"] == d])
        man = dict(man, backends=_uniq(df["backend"].tolist()), fabrics=_uniq(df["fabric"].tolist()))
        out(f"# run: {d}")
        out(header_text(man, points_summary(df)))
        out("#")
        moe = df["op"].astype(str).isin(MOE_OPS)
        for part, op in ((df[~moe], None), (df[moe], "moe")):  # moe rows under their own columns
            if len(part):
                out(column_header(op))
                for row in part.to_dict(orient="records"):
                    out(row_text(row))
        out(footer_text(df))
        out("")
    if len(manifests) > 1:
        out("# all runs together:")
        out(footer_text(all_df))
    return code


# ------------------------------------------------------------------------------ compare
_DESC = ["op", "variant", "world", "M", "N", "K", "dtype", "fabric", "backend", "moe", "routing", "experts"]
_CMP_COLS = [("op", 8, "<"), ("variant", 40, "<"), ("world", 5, ">"), ("M", 7, ">"), ("N", 7, ">"), ("K", 7, ">"),
             ("A time(us)", 11, ">"), ("B time(us)", 11, ">"), ("A/B", 7, ">"), ("A TFLOP/s", 9, ">"),
             ("B TFLOP/s", 9, ">"), ("A eff", 5, ">"), ("B eff", 5, ">"), ("B status", 8, "<")]


def match_runs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Pair rows of A and B: by key first, then by the descriptive columns for the rest.

    Returns one row per pair with suffixes _a / _b, and `match` = 'key' | 'config'."""
    a = a.copy()
    b = b.copy()
    a["_desc"] = _match_key(a, _DESC)
    b["_desc"] = _match_key(b, _DESC)
    by_key = a.merge(b.drop_duplicates("key"), on="key", suffixes=("_a", "_b"))
    by_key["key_a"] = by_key["key_b"] = by_key.pop("key")
    by_key["match"] = "key"
    ra = a[~a["key"].isin(by_key["key_a"])]
    rb = b[~b["key"].isin(by_key["key_b"])]
    by_desc = ra.merge(rb.drop_duplicates("_desc"), on="_desc", suffixes=("_a", "_b"))
    by_desc["match"] = "config"
    pairs = pd.concat([by_key, by_desc], ignore_index=True)
    for c in _DESC:
        if f"{c}_a" in pairs.columns:
            pairs[c] = pairs[f"{c}_a"]
    return pairs


def _compare(a_dir: Path, b_dir: Path, *, as_json: bool, out) -> int:
    for d in (a_dir, b_dir):
        if not d.exists():
            _error(f"run directory {d} does not exist")
            return 2
    (a, man_a), (b, man_b) = _load(a_dir), _load(b_dir)
    if a.empty or b.empty:
        _error(f"no result rows under {a_dir if a.empty else b_dir}")
        return 2
    a, b = derive(a), derive(b)
    pairs = match_runs(a, b)
    ta = pd.to_numeric(pairs["t_median_us_a"], errors="coerce")
    tb = pd.to_numeric(pairs["t_median_us_b"], errors="coerce")
    ok = (pairs["status_a"] == "ok") & (pairs["status_b"] == "ok") & (tb > 0)
    pairs["ratio"] = (ta / tb).where(ok, np.nan)  # > 1: B is faster
    only_a = int((~a["key"].isin(pairs["key_a"])).sum())
    only_b = int((~b["key"].isin(pairs["key_b"])).sum())
    code = verdict(b)["exit_code"]
    r = pairs["ratio"].dropna()
    gm = float(np.exp(np.log(r).mean())) if len(r) else float("nan")
    per_var = {v: float(np.exp(np.log(g).mean())) for v, g in r.groupby(pairs.loc[r.index, "variant"].astype(str))}
    summary = {"matched": int(len(pairs)), "compared": int(len(r)), "only_a": only_a, "only_b": only_b,
               "geomean_a_over_b": gm, "per_variant": per_var,
               "improved": int((r > 1.03).sum()), "regressed": int((r < 1 / 1.03).sum()), "exit_code": code}
    if as_json:
        keep = ["key_a", "key_b", "match", *_DESC, "t_median_us_a", "t_median_us_b", "ratio",
                "tflops_a", "tflops_b", "overlap_efficiency_a", "overlap_efficiency_b", "status_a", "status_b",
                "wrong_a", "wrong_b"]
        cols = [c for c in keep if c in pairs.columns]
        out(json.dumps({"a": str(a_dir), "b": str(b_dir), "pairs": _records(pairs[cols]), "summary": summary},
                       indent=1, default=str))
        return code
    out(f"# kosmos-bench compare | A = {a_dir} | B = {b_dir}")
    for tag, m in (("A", man_a), ("B", man_b)):
        git = m.get("git_sha")
        out(f"# {tag}: {m.get('time', '?')} | {', '.join(m.get('gpus') or ['no GPU'])} | "
            f"git {str(git)[:10] if git else '?'}{' (dirty)' if m.get('git_dirty') else ''} | "
            f"src {m.get('source_hash') or '?'} | {m.get('command', '?')}")
    out("# A/B = A time / B time: > 1 means B is faster; eff = overlap efficiency, max(GEMM alone, collective alone) / time")
    out("#" + " ".join(_fit(t, w - (1 if i == 0 else 0), al) for i, (t, w, al) in enumerate(_CMP_COLS)))
    for p in _sorted(pairs.assign(impl=pairs.get("impl_a"))).to_dict(orient="records"):
        vals = [p["op"], p["variant"], int(p["world"]), int(p["M"]), int(p["N"]), int(p["K"]),
                _num(p["t_median_us_a"], ".2f"), _num(p["t_median_us_b"], ".2f"), _num(p["ratio"], ".3f"),
                _num(p.get("tflops_a"), ".2f"), _num(p.get("tflops_b"), ".2f"),
                _num(p.get("overlap_efficiency_a"), ".2f"), _num(p.get("overlap_efficiency_b"), ".2f"), p["status_b"]]
        out(" ".join(_fit(v, w, al) for v, (_, w, al) in zip(vals, _CMP_COLS)).rstrip())
    out(f"# matched {summary['matched']} points ({summary['compared']} ok in both); only in A: {only_a}, only in B: {only_b}")
    if len(r):
        out(f"# geomean A/B: {gm:.3f}  (improved >3%: {summary['improved']}, regressed >3%: {summary['regressed']})")
        out("# per variant: " + " | ".join(f"{k} {v:.3f}" for k, v in sorted(per_var.items())))
    vb = verdict(b)
    out(f"# B verdict: {vb['ok']} ok, {vb['wrong']} wrong, {vb['failed']} failed, {vb['skipped']} skipped"
        f" -> exit {code}")
    return code
