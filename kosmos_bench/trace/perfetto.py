"""Chrome trace-event JSON export of role timelines (opens in ui.perfetto.dev and chrome://tracing).

One process per rank ("rank r"), one thread (track) per WG ("WG w · SM s"), one complete
("ph": "X") slice per record, named by its role so every viewer colours roles consistently
(plus the legacy "cname" colour for chrome://tracing). Slices never overlap on a track:
records are clipped first (`analysis.clean`). A trace with lanes (the MoE kernels' concurrent
agents) gets a track per (WG, lane). Timestamps are microseconds from the earliest
record of the trace, at ns resolution.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .analysis import clean

# chrome://tracing reserved colour names (Perfetto colours by slice name instead).
CNAME = {
    "MOVE": "rail_load",              # blue
    "BUILD": "thread_state_running",  # green
    "REDUCE": "thread_state_iowait",  # orange
    "WAIT": "grey",
    "KERNEL": "generic_work",
}


def perfetto_events(trace_df: pd.DataFrame, meta: dict | None = None) -> dict:
    """The trace-event JSON object (see module docstring) as a dict."""
    df, clipped = clean(trace_df)
    events: list[dict] = []
    if df.empty:
        return {"traceEvents": events, "displayTimeUnit": "ns", "metadata": dict(meta or {}, clipped=clipped)}
    origin = int(df["t0_ns"].min())
    has_names = "kernel_name" in df.columns
    lanes = "lane" in df.columns
    if not lanes:
        df = df.assign(lane=0)
    _tid = (lambda wg, lane: int(wg) * 16 + int(lane)) if lanes else (lambda wg, lane: int(wg))  # noqa: E731
    for rank in sorted(df["rank"].unique()):
        pid = int(rank)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        rdf = df[df["rank"] == rank]
        for wg, sm, lane in rdf[["wg", "sm", "lane"]].drop_duplicates(["wg", "lane"]).itertuples(index=False):
            label = f"WG {int(wg)}" + (f" · lane {int(lane)}" if lanes else "") + (f" · SM {int(sm)}" if int(sm) >= 0 else "")
            tid = _tid(wg, lane)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    cols = ["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns", "lane"] + (["kernel_name"] if has_names else [])
    for rec in df[cols].itertuples(index=False):
        t0 = int(rec.t0_ns) - origin
        t1 = int(rec.t1_ns) - origin
        name = str(rec.role)
        args = {"item": int(rec.item), "sm": int(rec.sm)}
        if has_names:
            name = str(rec.kernel_name) if rec.role == "KERNEL" else name
            args["kernel_name"] = str(rec.kernel_name)
        events.append({
            "ph": "X", "name": name, "cat": str(rec.role), "pid": int(rec.rank), "tid": _tid(rec.wg, rec.lane),
            # us with ns resolution; exact ns integers are kept in args for tools that want them.
            "ts": t0 / 1e3, "dur": (t1 - t0) / 1e3, "cname": CNAME.get(str(rec.role), "generic_work"),
            "args": args | {"t0_ns": t0, "t1_ns": t1},
        })
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "metadata": dict(meta or {}, clipped=clipped, origin_ns=origin)}


def to_perfetto(trace_df: pd.DataFrame, path: Path | str, meta: dict | None = None) -> Path:
    """Write the trace as Chrome trace-event JSON to `path`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = perfetto_events(trace_df, meta)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":"), default=str))
    tmp.replace(path)
    return path


def validate_perfetto(obj: dict) -> list[str]:
    """Problems found in a trace-event object (empty list = valid): structure and overlaps."""
    problems = []
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return ["top level must be an object with a 'traceEvents' list"]
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, ev in enumerate(obj["traceEvents"]):
        ph = ev.get("ph")
        if ph not in ("X", "M"):
            problems.append(f"event {i}: unexpected phase {ph!r}")
            continue
        for k in ("name", "pid", "tid"):
            if k not in ev:
                problems.append(f"event {i}: missing {k!r}")
        if ph == "X":
            if not isinstance(ev.get("ts"), (int, float)) or not isinstance(ev.get("dur"), (int, float)):
                problems.append(f"event {i}: ts/dur must be numbers")
                continue
            if ev["dur"] <= 0:
                problems.append(f"event {i}: non-positive duration {ev['dur']}")
            t0 = round(ev["ts"] * 1e3)
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((t0, t0 + round(ev["dur"] * 1e3)))
    for (pid, tid), iv in tracks.items():
        iv.sort()
        for (a0, a1), (b0, b1) in zip(iv[:-1], iv[1:]):
            if b0 < a1:
                problems.append(f"pid {pid} tid {tid}: slice at {b0} ns overlaps one ending at {a1} ns")
                break
    return problems
