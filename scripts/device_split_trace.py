"""Where the end of a fused call goes, from one traced call (host fabric, sm90 + CE movers;
variant from the environment, e.g. KOSMOS_SPLIT_K): per remote demand group of the last few
(and the local/early work before them), the items' starts, durations and ends relative to the
call's last trace record, and how many CTAs are busy in the last 200 us. One fresh process per
variant via scripts/device_b2b_variants.sh (B2B_SCRIPT=device_split_trace.py B2B_LINES=12).

    B2B_TAG=s4 KOSMOS_SPLIT_K=4:4 python3 scripts/device_split_trace.py OUT [MxNxK,...]
Appends per-group rows to OUT/split_trace.parquet; the last groups' tiles (one row each) go to
OUT/split_trace_items-<tag>-<M>x<N>.parquet.
"""
from __future__ import annotations

import os

import numpy as np

from kosmos_bench import schedule as S
from kosmos_bench.impls.kosmos import KosmosImpl
from _host_point import append_rows, host_ce_point, script_args

GROUPS = int(os.environ.get("ST_GROUPS", "7"))


def whole_call(b, ctas: int, parts: int = 10) -> str:
    """The call from its first tile start to its last tile end in `parts` equal spans: the
    busy fraction of the CTAs (tile time / CTA time) and the median tile duration of the tiles
    that start in each; the own rows' end; tile time over CTA time for the whole call."""
    t0, t1 = b["s"].min(), b["e"].max()
    edges = np.linspace(t0, t1, parts + 1)
    s, e = b["s"].to_numpy(), b["e"].to_numpy()
    util, dur = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        util.append(np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None).sum() / (ctas * (hi - lo)))
        x = b[(b["s"] >= lo) & (b["s"] < hi)]["d"]
        dur.append(x.median() if len(x) else float("nan"))
    own = b[b["g"] < 0]["e"].max()
    total = (e - s).sum() / (ctas * (t1 - t0))
    return (f"span {t1 - t0:.0f} us, busy {total:.3f}, own rows end at {own - t0:.0f} us; per tenth busy "
            + " ".join(f"{u:.2f}" for u in util) + "; tile us " + " ".join(f"{d:.0f}" for d in dur))


def main() -> None:
    out, shapes, dev = script_args("/tmp/split-trace")
    tag = os.environ.get("B2B_TAG", "default")
    rows = []
    for M, N, K in shapes:
        p, ctx, inputs = host_ce_point(M, N, K, dev)
        runner = KosmosImpl().prepare(p, ctx, inputs)
        for _ in range(5):
            runner.run()
        runner.run_traced()
        tr = runner.run_traced()
        sch = runner.scheds[0]
        runner.close()
        b = tr[tr["role"] == "BUILD"].copy()
        t = sch.builders.table
        b["peer"] = t[b["item"].to_numpy(), S.F["peer"]]
        b["mt"] = t[b["item"].to_numpy(), S.F["m0"]] // sch.BM
        b["part"] = t[b["item"].to_numpy(), S.F["kind"]] == S.AG_PART
        end = tr["t1_ns"].max()
        b["s"] = (b["t0_ns"] - end) / 1e3
        b["e"] = (b["t1_ns"] - end) / 1e3
        b["d"] = b["e"] - b["s"]
        groups = sch.meta["remote_groups"]
        gid = {tuple(x): g for g, grp in enumerate(groups) for x in grp}
        b["g"] = [gid.get((pp, mm), -1) for pp, mm in zip(b["peer"], b["mt"])]
        for g in range(max(0, len(groups) - GROUPS), len(groups)):
            x = b[b["g"] == g]
            r = {"tag": tag, "M": M, "N": N, "K": K, "group": g - len(groups), "bands": len(groups[g]),
                 "items": len(x), "parts": int(x["part"].sum()), "start_min": x["s"].min(),
                 "start_med": x["s"].median(), "start_max": x["s"].max(), "dur_med": x["d"].median(),
                 "dur_max": x["d"].max(), "end_max": x["e"].max(), "ctas": x["wg"].nunique()}
            rows.append(r)
            print(f"{tag:8s} {M}x{N}x{K} g{r['group']:+d} ({r['bands']} bands, {r['items']} items, {r['parts']} parts, "
                  f"{r['ctas']} CTAs): start {r['start_min']:.0f}/{r['start_med']:.0f}/{r['start_max']:.0f}  "
                  f"dur {r['dur_med']:.1f} (max {r['dur_max']:.1f})  end {r['end_max']:.0f} us", flush=True)
        last = b[b["g"] >= len(groups) - GROUPS]
        last.assign(tag=tag, M=M, N=N, K=K).drop(columns=["rank"]).to_parquet(
            os.path.join(out, f"split_trace_items-{tag}-{M}x{N}.parquet"), index=False)  # the last groups' tiles
        busy = [int(((b["s"] <= -t_) & (b["e"] > -t_)).sum()) for t_ in range(200, -1, -20)]
        print(f"{tag:8s} {M}x{N}x{K} busy CTAs at -200..0 us step 20: {busy}", flush=True)
        print(f"{tag:8s} {M}x{N}x{K} whole call: {whole_call(b, runner.grid)}", flush=True)
        if os.environ.get("ST_ALL") == "1":  # every tile of the call, not only the last groups'
            b.assign(tag=tag, M=M, N=N, K=K).drop(columns=["rank"]).to_parquet(
                os.path.join(out, f"split_trace_all-{tag}-{M}x{N}.parquet"), index=False)
    append_rows(out, "split_trace.parquet", rows)


if __name__ == "__main__":
    main()
