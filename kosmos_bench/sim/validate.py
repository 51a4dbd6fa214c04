"""Compare a measured run with the simulator on the same points (`kosmos-bench validate-sim`).

For each measured row (backend 'gpu', status 'ok') the same point is simulated with a
profile (the given one, else the default for its fabric). KOSMOS rows that recorded the
mover count the kernel used (`num_movers`) are simulated with that k, so `predicted`
compares like with like. The error is relative to the measurement: (pred - meas) / meas.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..point import Point
from ..store import load_rows
from . import profiles, simulate_point
from .model import Unsupported

_POINT_FIELDS = [f.name for f in dataclasses.fields(Point)]
COLUMNS = ["key", "op", "impl", "variant", "fabric", "world", "M", "N", "K", "model", "layer", "tokens",
           "profile", "measured_us", "predicted_us", "rel_err", "abs_rel_err", "measured_gemm_us",
           "predicted_gemm_us", "gemm_rel_err", "measured_comm_us", "predicted_comm_us", "comm_rel_err",
           "num_movers", "note"]


def _clean(v):
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def point_of(row: dict) -> Point:
    """The Point a result row was measured at."""
    kw = {k: _clean(row.get(k)) for k in _POINT_FIELDS if k in row}
    for k in ("M", "N", "K", "world", "warmup", "reps", "seed", "chunk", "tokens"):
        if kw.get(k) is not None:
            kw[k] = int(kw[k])
    if kw.get("local_first") is not None:
        kw["local_first"] = bool(kw["local_first"])
    kw["trace"] = False
    kw = {k: v for k, v in kw.items() if v is not None or k in ("policy", "queue_order", "local_first", "chunk",
                                                                    "profile", "model", "layer", "tokens", "sweep")}
    return Point(**kw)


def _rel(pred, meas):
    if pred is None or meas is None or not meas or (isinstance(meas, float) and math.isnan(meas)):
        return None
    return (float(pred) - float(meas)) / float(meas)


def validate_sim(run_dir, profile: str | None = None) -> pd.DataFrame:
    """Per measured point: measured vs predicted time and relative error (COLUMNS)."""
    rows = load_rows(Path(run_dir))
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = rows[(rows["backend"] == "gpu") & (rows["status"] == "ok")]
    out = []
    for row in rows.to_dict("records"):
        p = point_of(row)
        rec = {c: _clean(row.get(c)) for c in ("key", "op", "impl", "variant", "fabric", "world", "M", "N", "K",
                                               "model", "layer", "tokens")}
        rec.update(measured_us=_clean(row.get("t_median_us")), measured_gemm_us=_clean(row.get("t_gemm_us")),
                   measured_comm_us=_clean(row.get("t_comm_us")))
        name = profile or profiles.default_for(p.fabric, p.world)
        rec["profile"] = name
        k = _clean(row.get("num_movers"))
        k = int(k) if k is not None and p.impl == "kosmos" and (p.policy or "self") != "self" else None
        try:
            prof = profiles.load(name)
            # the runner records the builder it ran; rows without one predate the sm90 builder
            ran = p.replace(builder="mma") if p.impl == "kosmos" and p.op != "gemm" and p.builder is None else p
            fields, _ = simulate_point(ran.replace(backend="sim", profile=None), prof, num_movers=k)
        except Unsupported as e:
            rec["note"] = f"not simulated: {e}"
            out.append(rec)
            continue
        rec.update(predicted_us=fields["t_median_us"], predicted_gemm_us=fields.get("t_gemm_us"),
                   predicted_comm_us=fields.get("t_comm_us"), num_movers=fields.get("num_movers"))
        rec["rel_err"] = _rel(rec["predicted_us"], rec["measured_us"])
        rec["abs_rel_err"] = abs(rec["rel_err"]) if rec["rel_err"] is not None else None
        rec["gemm_rel_err"] = _rel(rec["predicted_gemm_us"], rec["measured_gemm_us"])
        rec["comm_rel_err"] = _rel(rec["predicted_comm_us"], rec["measured_comm_us"])
        out.append(rec)
    df = pd.DataFrame(out)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    return df[COLUMNS]


def summary(df: pd.DataFrame) -> dict:
    """n, median and max |relative error| overall and per implementation, share within 15%."""
    d = df.dropna(subset=["abs_rel_err"]) if len(df) else df
    if not len(d):
        return {"n": 0, "not_simulated": int(len(df))}
    e = d["abs_rel_err"].astype(float)
    res = {
        "n": int(len(d)),
        "not_simulated": int(len(df) - len(d)),
        "median_abs_rel_err": float(e.median()),
        "max_abs_rel_err": float(e.max()),
        "mean_rel_err": float(d["rel_err"].astype(float).mean()),
        "within_15pct": float((e <= 0.15).mean()),
        "by_impl": {impl: {"n": int(len(g)), "median_abs_rel_err": float(g["abs_rel_err"].astype(float).median()),
                           "max_abs_rel_err": float(g["abs_rel_err"].astype(float).max())}
                    for impl, g in d.groupby("impl")},
    }
    for part in ("gemm", "comm"):
        col = d[f"{part}_rel_err"].dropna()
        if len(col):
            res[f"{part}_median_abs_rel_err"] = float(col.astype(float).abs().median())
    return res
