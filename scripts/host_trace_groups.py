"""Per band-group timeline of a traced host-fabric ag-gemm run (sm90 builder): for each
traced point, builder busy fraction over time and, per demand-order group of remote bands,
when its first tile started and its last tile ended (us from the first trace record).

    python3 scripts/host_trace_groups.py RESULTS_RUN_DIR [--stream-k]

--stream-k: the schedule was built with streamed K-slices (the default for sm90 + ce with
KOSMOS_CE_SLICES > 1): its band groups end at one wave of tiles.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kosmos_bench import schedule as S
from kosmos_bench.kernels import ag_sm90


def main() -> None:
    root = Path(sys.argv[1])
    stream_k = "--stream-k" in sys.argv
    pts = pd.concat([pd.read_parquet(f) for f in sorted(root.glob("points/*.parquet"))])
    for f in sorted(root.glob("traces/*.parquet")):
        t = pd.read_parquet(f)
        row = pts[pts.key == t.key.iloc[0]].iloc[0]
        if row.op != "ag-gemm" or row.impl != "kosmos":
            continue
        M, N, K, W = int(row.M), int(row.N), int(row.K), int(row.world)
        wgs = int(row.get("num_wgs", 132) or 132)
        sch = S.build_schedule("ag-gemm", M, N, K, W, 0, BM=ag_sm90.BM, BN=ag_sm90.BN, num_wgs=wgs, fabric="host",
                               model=ag_sm90.schedule_model("host"), stream_k=stream_k)
        group_of = {key: g for g, grp in enumerate(sch.meta["remote_groups"]) for key in grp}
        tab = sch.builders.table
        b = t[t.role == "BUILD"].copy()
        t0, t1 = t.t0_ns.min(), t.t1_ns.max()
        b["group"] = [group_of.get((int(p), int(m) // ag_sm90.BM), -1)
                      for p, m in zip(tab[b.item.values, S.F["peer"]], tab[b.item.values, S.F["m0"]])]
        d = (b.t1_ns - b.t0_ns) / 1e3
        print(f"{M}x{N}x{K}: median {row.t_median_us:.0f} us, traced span {(t1 - t0) / 1e3:.0f}, GEMM alone "
              f"{row.t_gemm_us:.0f}, copy alone {row.t_comm_us:.0f}; tile q10/50/90 "
              f"{np.round(np.quantile(d, [0.1, 0.5, 0.9]), 1)} us")
        edges = np.linspace(t0, t1, 21)
        busy = [(np.minimum(b.t1_ns, c) - np.maximum(b.t0_ns, a)).clip(lower=0).sum() / ((c - a) * wgs)
                for a, c in zip(edges[:-1], edges[1:])]
        print("  busy per 5%: " + " ".join(f"{x:.2f}" for x in busy))
        g = b.groupby("group").agg(tiles=("item", "size"), start=("t0_ns", "min"), first_end=("t1_ns", "min"),
                                   end=("t1_ns", "max"))
        for c in ("start", "first_end", "end"):
            g[c] = ((g[c] - t0) / 1e3).round(0)
        g["bands"] = [len(sch.meta["remote_groups"][i]) if i >= 0 else sch.meta["m_tiles"] for i in g.index]
        print("  group (-1 = local): " + g.T.to_string().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
