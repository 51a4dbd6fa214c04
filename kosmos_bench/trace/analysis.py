"""Role timelines: clean-up, decode, idle windows and the per-point summary columns.

A trace is a tidy table, one row per (WG, role interval) (``store.TRACE_COLUMNS``):

    rank   int   logical rank the WG belongs to
    wg     int   workgroup (CUDA thread block) index within its rank
    sm     int   SM the WG ran on (-1 when unknown)
    role   str   MOVE | BUILD | REDUCE | WAIT   (external profilers: KERNEL)
    item   int   queue item id (band / tile / slot), -1 for WAIT
    t0_ns  int   begin, globaltimer ns
    t1_ns  int   end, globaltimer ns (t1_ns >= t0_ns)

Definitions used everywhere (tests check them on hand-built timelines):

* The **kernel window** of a rank is [min t0_ns, max t1_ns] over all of that rank's records.
  Every WG of the rank is accounted over the whole window, so a WG that starts late or
  finishes early is idle for the difference.
* **Useful** roles are MOVE, BUILD and REDUCE. A WG is **idle** wherever it runs no useful
  record: explicit WAIT records and gaps between records are both idle, and adjacent ones
  merge into one **idle window** (a maximal idle interval of one WG).
* Fractions are of WG-time: sum over WGs of their rank's window length.

Kernels whose roles have their own names (the MoE kernels: ROUTER, EXPERT, GATHER, ...) map
them to the three classes through ROLE_CLASS. Their WGs run several agents at once (math
warps, the loader's sequence items, mover warps), so a WG's records may overlap: such traces
carry a ``lane`` column (`assign_lanes`), records of one lane never overlap, and a WG is busy
wherever ANY lane runs a useful record (the union). The per-class fractions sum their records'
durations, so with lanes they can add up to more than busy_frac.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

ROLES = ("MOVE", "BUILD", "REDUCE", "WAIT")
USEFUL_ROLES = ("MOVE", "BUILD", "REDUCE")
# Integer codes of the roles in the kernel's raw trace records (see `decode`).
ROLE_CODES = {0: "MOVE", 1: "BUILD", 2: "REDUCE", 3: "WAIT"}
BASE_COLUMNS = ["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"]
# The class (MOVE / BUILD / REDUCE / WAIT) of every role a kernel writes; the MoE kernels'
# ROLE_CODES (kernels/moe_sm90.py, moe_bwd_sm90.py) name roles of their own.
ROLE_CLASS = {r: r for r in ROLES} | {
    "ROUTER": "BUILD", "EXPERT": "BUILD", "EXPERT_DGRAD": "BUILD", "EXPERT_WGRAD": "BUILD", "SHARED": "BUILD",
    "DISPATCH": "MOVE", "GATHER": "MOVE", "COMBINE": "MOVE", "FOLD": "REDUCE",
}


def role_class(roles: pd.Series) -> pd.Series:
    """Each role's class (MOVE / BUILD / REDUCE / WAIT; other names, e.g. KERNEL, stay as they are)."""
    return roles.map(lambda r: ROLE_CLASS.get(r, r))


def assign_lanes(df: pd.DataFrame) -> np.ndarray:
    """Lane of every record (aligned with df's rows): the fewest lanes per (rank, wg) such that
    no two records of one lane overlap (greedy by start time: the first lane free by then)."""
    lanes = np.zeros(len(df), dtype=np.int64)
    if df.empty:
        return lanes
    order = np.lexsort((df["t0_ns"].to_numpy(), df["wg"].to_numpy(), df["rank"].to_numpy()))
    rk, wg = df["rank"].to_numpy()[order], df["wg"].to_numpy()[order]
    t0, t1 = df["t0_ns"].to_numpy()[order], df["t1_ns"].to_numpy()[order]
    ends: list[int] = []
    for n, i in enumerate(order):
        if n == 0 or rk[n] != rk[n - 1] or wg[n] != wg[n - 1]:
            ends = []
        lane = next((j for j, e in enumerate(ends) if e <= t0[n]), len(ends))
        if lane == len(ends):
            ends.append(0)
        ends[lane] = t1[n]
        lanes[i] = lane
    return lanes


def _track_cols(df: pd.DataFrame) -> list[str]:
    return ["rank", "wg", "lane"] if "lane" in df.columns else ["rank", "wg"]


def clean(trace_df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Sorted copy with no overlap on any (rank, wg) track, plus the number of records changed.

    Records are sorted by (rank, wg[, lane], t0_ns, t1_ns); a record that starts before the
    previous record of the same WG (and lane, where the trace has lanes) ends is clipped to
    start there, and records left with no duration are dropped. A well-formed kernel trace
    comes back unchanged with count 0.
    """
    if trace_df.empty:
        return trace_df.reset_index(drop=True).copy(), 0
    tracks = _track_cols(trace_df)
    df = trace_df.sort_values(tracks + ["t0_ns", "t1_ns"], kind="stable").reset_index(drop=True)
    t0 = df["t0_ns"].to_numpy(dtype=np.int64).copy()
    t1 = df["t1_ns"].to_numpy(dtype=np.int64)
    track = (df["rank"].to_numpy(dtype=np.int64) << 40) + (df["wg"].to_numpy(dtype=np.int64) << 8)
    if "lane" in df.columns:
        track += df["lane"].to_numpy(dtype=np.int64)
    new_track = np.ones(len(df), dtype=bool)
    new_track[1:] = track[1:] != track[:-1]
    # Latest end so far within the track, shifted by one record (where t0 may start).
    prev_end = np.full(len(df), np.iinfo(np.int64).min, dtype=np.int64)
    bounds = list(np.flatnonzero(new_track)) + [len(df)]
    for a, b in zip(bounds[:-1], bounds[1:]):  # one numpy call per WG track
        prev_end[a + 1:b] = np.maximum.accumulate(t1[a:b])[:-1]
    clipped = t0 < prev_end
    t0 = np.where(clipped, prev_end, t0)
    keep = t1 > t0
    changed = int(clipped.sum() + (~keep & ~clipped).sum())
    df["t0_ns"] = t0
    df = df[keep].reset_index(drop=True)
    return df, changed


# One kernel trace record as csrc/kosmos/trace.cuh writes it (KosmosTraceRecord, 24 bytes).
TRACE_RECORD_DTYPE = np.dtype([("t0", "<u8"), ("t1", "<u8"), ("item", "<i4"), ("role", "<u2"), ("sm", "<u2")])


def decode(records: np.ndarray, counts: np.ndarray, *, rank=0, sms: np.ndarray | None = None,
           role_codes: dict[int, str] = ROLE_CODES) -> tuple[pd.DataFrame, int]:
    """Raw per-WG trace buffers -> (trace DataFrame, dropped record count).

    records: either TRACE_RECORD_DTYPE array (num_wg, capacity) (the kernel's buffer, e.g.
             ``np.frombuffer(buf, TRACE_RECORD_DTYPE).reshape(grid, cap)``), or an int64
             array (num_wg, capacity, 4) of (t0_ns, t1_ns, role_code, item); the first
             min(counts[w], capacity) records of WG w are valid.
    counts:  int array (num_wg,); records each WG *tried* to write (> capacity = overflow,
             the excess was dropped by the kernel and is counted, never decoded).
    rank:    int, or int array (num_wg,) giving each WG's rank (emulated ranks share a grid);
             'wg' is then numbered from 0 within each rank, in grid order.
    sms:     int array (num_wg,), the SM of each WG (structured records carry their own).
    The dropped count is also stored in df.attrs['dropped'] (summarize reports it).
    Unknown role codes raise ValueError naming the code.
    """
    records = np.asarray(records)
    counts = np.asarray(counts, dtype=np.int64)
    structured = records.dtype.names is not None
    if structured:
        missing = {"t0", "t1", "item", "role"} - set(records.dtype.names)
        if records.ndim != 2 or missing:
            raise ValueError(f"structured trace records must be (num_wg, capacity) with fields t0, t1, item, role; "
                             f"got shape {records.shape}, missing {sorted(missing)}")
    elif records.ndim != 3 or records.shape[2] < 4:
        raise ValueError(f"trace records must be (num_wg, capacity, 4), got shape {records.shape}")
    num_wg, cap = records.shape[:2]
    if counts.shape != (num_wg,):
        raise ValueError(f"counts must be ({num_wg},), got {counts.shape}")
    valid = np.minimum(np.maximum(counts, 0), cap)
    dropped = int(np.maximum(counts - cap, 0).sum())
    mask = np.arange(cap)[None, :] < valid[:, None]
    g_idx = np.broadcast_to(np.arange(num_wg)[:, None], (num_wg, cap))[mask]
    rec = records[mask]
    if structured:
        t0, t1, codes, item = rec["t0"], rec["t1"], rec["role"].astype(np.int64), rec["item"]
    else:
        t0, t1, codes, item = rec[:, 0], rec[:, 1], rec[:, 2].astype(np.int64), rec[:, 3]
    unknown = sorted(set(np.unique(codes).tolist()) - set(role_codes))
    if unknown:
        raise ValueError(f"unknown role code(s) {unknown} in trace; known: {role_codes}")
    if sms is not None:
        sm = np.asarray(sms, dtype=np.int64)[g_idx]
    elif structured and "sm" in records.dtype.names:
        sm = rec["sm"].astype(np.int64)
    else:
        sm = np.full(len(rec), -1, dtype=np.int64)
    ranks = np.broadcast_to(np.asarray(rank, dtype=np.int64), (num_wg,))
    first_of_rank = {}
    for g, r in enumerate(ranks.tolist()):
        first_of_rank.setdefault(r, g)
    wg_local = np.arange(num_wg) - np.array([first_of_rank[r] for r in ranks.tolist()])
    lut = np.array([role_codes.get(i, "?") for i in range(max(role_codes) + 1)], dtype=object)
    df = pd.DataFrame({
        "rank": ranks[g_idx].astype(np.int64),
        "wg": wg_local[g_idx].astype(np.int64),
        "sm": sm,
        "role": lut[codes],
        "item": np.asarray(item).astype(np.int64),
        "t0_ns": np.asarray(t0).astype(np.int64),
        "t1_ns": np.asarray(t1).astype(np.int64),
    })
    df.attrs["dropped"] = dropped
    return df, dropped


def decode_launch(raw: bytes, counts: np.ndarray, grid: int, cap: int, *, rank, role_codes: dict[int, str],
                  kinds: tuple[str, ...] | None = None) -> tuple[pd.DataFrame, int]:
    """One traced launch's buffer (KosmosTraceRecord [grid][cap] as bytes) -> (trace, dropped).

    rank: int or per-WG array (emulated ranks share a grid); kinds: the kernel's item kinds when
    an item's high byte holds its kind (the MoE kernels: a ``kind`` column, the item its low 24
    bits). Times start at the launch's first record; ``lane`` separates the records a WG's
    concurrent agents (scheduler, math warps, movers) write at once (`assign_lanes`).
    """
    rec = np.frombuffer(raw, dtype=TRACE_RECORD_DTYPE, count=grid * cap).reshape(grid, cap)
    df, dropped = decode(rec, np.asarray(counts, dtype=np.int64), rank=rank, role_codes=role_codes)
    if kinds is not None:
        names = np.array(list(kinds) + ["?"] * (256 - len(kinds)), dtype=object)  # "?": a kind this table lacks
        df["kind"] = names[(df["item"].to_numpy() >> 24) & 0xFF] if len(df) else []
        df["item"] &= 0xFFFFFF
        df = df[["rank", "wg", "sm", "role", "item", "kind", "t0_ns", "t1_ns"]]
    if len(df):
        t_min = int(df["t0_ns"].min())
        df["t0_ns"] -= t_min
        df["t1_ns"] -= t_min
    df["lane"] = assign_lanes(df)
    return df, dropped


def _windows_of_rank(df: pd.DataFrame) -> tuple[int, int]:
    return int(df["t0_ns"].min()), int(df["t1_ns"].max())


def idle_windows(trace_df: pd.DataFrame) -> pd.DataFrame:
    """Maximal idle intervals of every WG: columns rank, wg, t0_ns, t1_ns, dur_ns.

    Idle = inside its rank's kernel window and running no useful (MOVE/BUILD/REDUCE class)
    record on any lane; WAIT records and gaps merge. Sorted by (rank, wg, t0_ns).
    """
    cols = ["rank", "wg", "t0_ns", "t1_ns", "dur_ns"]
    if trace_df.empty:
        return pd.DataFrame(columns=cols)
    df, _ = clean(trace_df)
    win = df.groupby("rank").agg(w0=("t0_ns", "min"), w1=("t1_ns", "max"))
    tracks = df[["rank", "wg"]].drop_duplicates()
    u = df[role_class(df["role"]).isin(USEFUL_ROLES)].sort_values(["rank", "wg", "t0_ns"], kind="stable")
    rk = u["rank"].to_numpy(dtype=np.int64)
    wg = u["wg"].to_numpy(dtype=np.int64)
    s = u["t0_ns"].to_numpy(dtype=np.int64)
    e = u["t1_ns"].to_numpy(dtype=np.int64)
    w0 = win["w0"].reindex(rk).to_numpy(dtype=np.int64)
    w1 = win["w1"].reindex(rk).to_numpy(dtype=np.int64)
    first = np.ones(len(u), dtype=bool)
    first[1:] = (rk[1:] != rk[:-1]) | (wg[1:] != wg[:-1])
    last = np.ones(len(u), dtype=bool)
    last[:-1] = first[1:]
    # The latest end of the WG's earlier useful records (lanes overlap: a running maximum).
    reach = np.empty(len(u), dtype=np.int64)
    bounds = list(np.flatnonzero(first)) + [len(u)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        reach[a:b] = np.maximum.accumulate(e[a:b])
    prev_end = np.where(first, w0, np.concatenate([[0], reach[:-1]]))
    # Gaps before each useful record, after the last one of each WG, and whole windows of
    # WGs that ran no useful record at all.
    busy = set(zip(rk.tolist(), wg.tolist()))
    lazy = tracks[[(r, w) not in busy for r, w in zip(tracks["rank"], tracks["wg"])]]
    parts = [
        (rk, wg, prev_end, s),
        (rk[last], wg[last], reach[last], w1[last]),
        (lazy["rank"].to_numpy(dtype=np.int64), lazy["wg"].to_numpy(dtype=np.int64),
         win["w0"].reindex(lazy["rank"]).to_numpy(dtype=np.int64), win["w1"].reindex(lazy["rank"]).to_numpy(dtype=np.int64)),
    ]
    res = pd.DataFrame({
        "rank": np.concatenate([p[0] for p in parts]), "wg": np.concatenate([p[1] for p in parts]),
        "t0_ns": np.concatenate([p[2] for p in parts]), "t1_ns": np.concatenate([p[3] for p in parts]),
    }).astype("int64")
    res["dur_ns"] = res["t1_ns"] - res["t0_ns"]
    res = res[res["dur_ns"] > 0].sort_values(["rank", "wg", "t0_ns"]).reset_index(drop=True)
    return res[cols]


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def kind_summary(trace_df: pd.DataFrame) -> pd.DataFrame:
    """Per item kind (traces with a ``kind`` column: the MoE kernels), ordered by first start:
    role, items, busy_ms_per_wg (the kind's record time over every WG of the trace),
    us_per_item, first_ms / last_ms (its first start and last end, from its rank's first record)."""
    cols = ["kind", "role", "items", "busy_ms_per_wg", "us_per_item", "first_ms", "last_ms"]
    if trace_df.empty or "kind" not in trace_df.columns:
        return pd.DataFrame(columns=cols)
    w0 = trace_df.groupby("rank")["t0_ns"].transform("min")
    df = trace_df.assign(dur=trace_df["t1_ns"] - trace_df["t0_ns"], s=trace_df["t0_ns"] - w0, e=trace_df["t1_ns"] - w0)
    n_wg = df[["rank", "wg"]].drop_duplicates().shape[0]
    g = df.groupby(["kind", "role"], sort=False).agg(items=("dur", "size"), total=("dur", "sum"), first=("s", "min"),
                                                     last=("e", "max")).reset_index()
    g["busy_ms_per_wg"] = g["total"] / n_wg / 1e6
    g["us_per_item"] = g["total"] / g["items"] / 1e3
    g["first_ms"], g["last_ms"] = g["first"] / 1e6, g["last"] / 1e6
    return g.sort_values("first_ms", kind="stable").reset_index(drop=True)[cols]


def summarize(trace_df: pd.DataFrame) -> dict:
    """Idle-window and role columns of ONE point's trace, ready to join its result row.

    Times in us; fractions of WG-time (see the module docstring). Keys:
      kernel_us                 longest rank kernel window
      busy_frac, busy_frac_move, busy_frac_build, busy_frac_reduce, wait_frac, idle_frac
      idle_windows, idle_total_us (summed over WGs), idle_longest_us, idle_p50_us, idle_p90_us
      first_build_us            kernel start -> first BUILD begin (max over ranks)
      tail_after_move_us        last MOVE end -> kernel end (max over ranks)
      role_switches             changes between useful roles along each WG, summed over WGs
      role_switches_per_wg      the same, mean per WG
      wg_busy_frac_min/_mean/_max   per-WG busy fraction, aggregated
      wgs_move, wgs_build, wgs_reduce  WGs (all ranks) that ran at least one such record
      trace_ranks, trace_wgs, trace_records, trace_clipped
      trace_dropped             only when trace_df.attrs['dropped'] is set (see `decode`)
    An empty trace gives {'trace_records': 0}.
    """
    if trace_df is None or trace_df.empty:
        return {"trace_records": 0}
    dropped = trace_df.attrs.get("dropped")
    df, clipped = clean(trace_df)
    df = df.assign(dur=df["t1_ns"] - df["t0_ns"], cls=role_class(df["role"]))
    win = df.groupby("rank").agg(w0=("t0_ns", "min"), w1=("t1_ns", "max"))
    win["len"] = win["w1"] - win["w0"]
    wgs_per_rank = df.groupby("rank")["wg"].nunique()
    wg_time = float((win["len"] * wgs_per_rank).sum())

    role_ns = df.groupby("cls")["dur"].sum()
    iw = idle_windows(df)
    idle_us = iw["dur_ns"].to_numpy(dtype=np.float64) / 1e3 if len(iw) else np.zeros(0)
    frac = (lambda ns: ns / wg_time) if wg_time else (lambda ns: float("nan"))

    out: dict = {
        "kernel_us": float(win["len"].max()) / 1e3,
        "busy_frac": frac(wg_time - float(idle_us.sum() * 1e3)),  # the union of the lanes' useful records
    }
    for r in ("MOVE", "BUILD", "REDUCE"):
        out[f"busy_frac_{r.lower()}"] = frac(float(role_ns.get(r, 0)))
    out["wait_frac"] = frac(float(role_ns.get("WAIT", 0)))
    out["idle_frac"] = frac(float(idle_us.sum() * 1e3))
    out.update({
        "idle_windows": int(len(idle_us)),
        "idle_total_us": float(idle_us.sum()),
        "idle_longest_us": float(idle_us.max()) if len(idle_us) else 0.0,
        "idle_p50_us": _pct(idle_us, 50),
        "idle_p90_us": _pct(idle_us, 90),
    })

    first_build, tail = [], []
    for rank, rdf in df.groupby("rank"):
        w0, w1 = win.loc[rank, "w0"], win.loc[rank, "w1"]
        b = rdf.loc[rdf["cls"] == "BUILD", "t0_ns"]
        if len(b):
            first_build.append((b.min() - w0) / 1e3)
        m = rdf.loc[rdf["cls"] == "MOVE", "t1_ns"]
        if len(m):
            tail.append((w1 - m.max()) / 1e3)
    out["first_build_us"] = float(max(first_build)) if first_build else float("nan")
    out["tail_after_move_us"] = float(max(tail)) if tail else float("nan")

    useful = df[df["cls"].isin(USEFUL_ROLES)]  # sorted by track (rank, wg[, lane]) and t0
    tk = useful[_track_cols(useful)].to_numpy()
    same = (tk[1:] == tk[:-1]).all(axis=1) if len(tk) else np.zeros(0, dtype=bool)
    cls = useful["cls"].to_numpy()
    switches = int((same & (cls[1:] != cls[:-1])).sum())
    n_wg = int(wgs_per_rank.sum())
    out["role_switches"] = switches
    out["role_switches_per_wg"] = switches / n_wg if n_wg else float("nan")

    all_wgs = df[["rank", "wg"]].drop_duplicates().set_index(["rank", "wg"]).index
    denom = np.array([win.loc[r, "len"] for r, _ in all_wgs], dtype=float)
    idle_wg = iw.groupby(["rank", "wg"])["dur_ns"].sum().reindex(all_wgs, fill_value=0).to_numpy(dtype=float)
    wg_frac = (denom - idle_wg) / np.where(denom > 0, denom, np.nan)
    out["wg_busy_frac_min"] = float(np.nanmin(wg_frac))
    out["wg_busy_frac_mean"] = float(np.nanmean(wg_frac))
    out["wg_busy_frac_max"] = float(np.nanmax(wg_frac))
    for r in USEFUL_ROLES:
        out[f"wgs_{r.lower()}"] = int(df.loc[df["cls"] == r, ["rank", "wg"]].drop_duplicates().shape[0])
    out.update({
        "trace_ranks": int(len(win)),
        "trace_wgs": n_wg,
        "trace_records": int(len(trace_df)),
        "trace_clipped": int(clipped),
    })
    if dropped is not None:  # known only when the decoder set trace_df.attrs['dropped']
        out["trace_dropped"] = int(dropped)
    return out
