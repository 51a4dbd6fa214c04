"""Role-timeline analysis on hand-built timelines with known answers; decode; Perfetto; ingest."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kosmos_bench.trace import (TRACE_RECORD_DTYPE, clean, decode, idle_windows, ingest_rocprofv3, perfetto_events, rocprofv3_available,
                                run_under_rocprofv3, summarize, to_perfetto, torch_profile, validate_perfetto)
from kosmos_bench.trace.synth import synthetic_trace

DATA = Path(__file__).parent / "data"
US = 1000  # ns per us: the hand-built timelines are written in us


def tl(records, rank=0, base_us=0):
    """[(wg, role, item, t0_us, t1_us)] -> trace DataFrame (times in ns)."""
    return pd.DataFrame([{"rank": rank, "wg": w, "sm": 10 + w, "role": r, "item": i,
                          "t0_ns": (base_us + a) * US, "t1_ns": (base_us + b) * US} for w, r, i, a, b in records])


# Rank 0, two WGs, kernel window [0, 100] us:
#   WG0: MOVE 0-30 | WAIT 30-40 | BUILD 40-70 | (gap) 70-80 | BUILD 80-100
#   WG1: (gap) 0-10 | BUILD 10-50 | MOVE 50-60 | WAIT 60-100
HAND = [(0, "MOVE", 3, 0, 30), (0, "WAIT", -1, 30, 40), (0, "BUILD", 0, 40, 70), (0, "BUILD", 1, 80, 100),
        (1, "BUILD", 2, 10, 50), (1, "MOVE", 4, 50, 60), (1, "WAIT", -1, 60, 100)]


def test_idle_windows_hand_built():
    iw = idle_windows(tl(HAND))
    got = [(int(r.wg), r.t0_ns // US, r.t1_ns // US) for r in iw.itertuples()]
    assert got == [(0, 30, 40), (0, 70, 80), (1, 0, 10), (1, 60, 100)]
    assert list(iw["dur_ns"] // US) == [10, 10, 10, 40]


def test_summarize_hand_built():
    s = summarize(tl(HAND))
    wg_time = 200.0  # 2 WGs x 100 us
    expect = {
        "kernel_us": 100.0,
        "busy_frac": (40 + 90) / wg_time, "busy_frac_move": 40 / wg_time, "busy_frac_build": 90 / wg_time,
        "busy_frac_reduce": 0.0, "wait_frac": 50 / wg_time, "idle_frac": 70 / wg_time,
        "idle_windows": 4, "idle_total_us": 70.0, "idle_longest_us": 40.0,
        "idle_p50_us": 10.0, "idle_p90_us": 10 + 0.7 * 30,  # linear interpolation of [10, 10, 10, 40]
        "first_build_us": 10.0, "tail_after_move_us": 40.0,
        "role_switches": 2, "role_switches_per_wg": 1.0,
        "wg_busy_frac_min": 0.5, "wg_busy_frac_mean": 0.65, "wg_busy_frac_max": 0.8,
        "wgs_move": 2, "wgs_build": 2, "wgs_reduce": 0,
        "trace_ranks": 1, "trace_wgs": 2, "trace_records": 7, "trace_clipped": 0,
    }
    for k, v in expect.items():
        tol = 1e-9 * max(1.0, abs(v))
        assert abs(s[k] - v) <= tol, (k, s[k], v)
    assert s["busy_frac"] + s["idle_frac"] == pytest.approx(1.0)


def test_summarize_per_rank_windows_and_idle_wg():
    # Rank 1 runs on another clock (starts at 5000 us) and has a WG that never works.
    r1 = tl([(0, "BUILD", 0, 20, 60), (0, "MOVE", 1, 60, 80), (1, "WAIT", -1, 0, 80)], rank=1, base_us=5000)
    s = summarize(pd.concat([tl(HAND), r1], ignore_index=True))
    assert s["kernel_us"] == 100.0  # max of the two ranks' windows (100, 80)
    assert s["first_build_us"] == 20.0  # max over ranks of (10, 20)
    assert s["tail_after_move_us"] == 40.0  # max over ranks of (40, 0)
    assert s["trace_ranks"] == 2 and s["trace_wgs"] == 4
    # WG-time 2*100 + 2*80 = 360; rank 1 idle: WG0 0-20 (20), WG1 all 80.
    assert s["idle_total_us"] == pytest.approx(70 + 20 + 80)
    assert s["idle_frac"] == pytest.approx(170 / 360)
    assert s["wg_busy_frac_min"] == 0.0 and s["idle_longest_us"] == 80.0


def test_clean_clips_overlaps_and_drops_empty():
    df = tl([(0, "BUILD", 0, 0, 50), (0, "WAIT", -1, 10, 40), (0, "MOVE", 1, 45, 70), (0, "BUILD", 2, 70, 70)])
    out, changed = clean(df)
    assert [(r.role, r.t0_ns // US, r.t1_ns // US) for r in out.itertuples()] == [("BUILD", 0, 50), ("MOVE", 50, 70)]
    assert changed == 3  # WAIT inside BUILD dropped, MOVE clipped, zero-length BUILD dropped
    s = summarize(df)
    assert s["trace_clipped"] == 3 and s["busy_frac"] == pytest.approx(1.0)


def test_empty_trace():
    assert summarize(pd.DataFrame(columns=["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"])) == {"trace_records": 0}
    assert idle_windows(pd.DataFrame(columns=["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"])).empty


def test_decode_with_overflow():
    cap = 3
    rec = np.zeros((2, cap, 4), dtype=np.int64)
    rec[0, :2] = [[100, 200, 0, 5], [200, 300, 1, 7]]
    rec[1, :3] = [[110, 150, 3, -1], [150, 400, 1, 8], [400, 420, 2, 9]]
    df, dropped = decode(rec, np.array([2, 5]), rank=3, sms=np.array([4, 9]))
    assert dropped == 2 and df.attrs["dropped"] == 2
    assert list(df["role"]) == ["MOVE", "BUILD", "WAIT", "BUILD", "REDUCE"]
    assert list(df["wg"]) == [0, 0, 1, 1, 1] and list(df["sm"]) == [4, 4, 9, 9, 9]
    assert (df["rank"] == 3).all() and list(df["item"]) == [5, 7, -1, 8, 9]
    assert summarize(df)["trace_dropped"] == 2
    rec[0, 0, 2] = 7
    with pytest.raises(ValueError, match="unknown role code"):
        decode(rec, np.array([2, 3]))
    assert "trace_dropped" not in summarize(tl(HAND))  # unknown unless a decoder says


def test_decode_kernel_record_layout():
    """The 24-byte KosmosTraceRecord of csrc/kosmos/trace.cuh; two emulated ranks in one grid."""
    grid, cap = 4, 2
    raw = np.zeros((grid, cap), dtype=TRACE_RECORD_DTYPE)
    assert TRACE_RECORD_DTYPE.itemsize == 24
    raw[0, 0] = (10, 20, 5, 0, 7)    # rank 0, wg 0: MOVE item 5 on SM 7
    raw[1, :] = [(11, 30, 1, 1, 9), (30, 40, -1, 3, 9)]
    raw[2, 0] = (12, 50, 2, 1, 11)   # rank 1, wg 0
    buf = raw.tobytes()  # what the device buffer holds
    recs = np.frombuffer(buf, dtype=TRACE_RECORD_DTYPE).reshape(grid, cap)
    df, dropped = decode(recs, np.array([1, 2, 1, 0]), rank=np.array([0, 0, 1, 1]))
    assert dropped == 0
    assert list(zip(df["rank"], df["wg"], df["sm"], df["role"], df["item"])) == [
        (0, 0, 7, "MOVE", 5), (0, 1, 9, "BUILD", 1), (0, 1, 9, "WAIT", -1), (1, 0, 11, "BUILD", 2)]
    assert list(df["t1_ns"]) == [20, 30, 40, 50]


@pytest.mark.parametrize("policy", ["self", "fixed:3", "predicted"])
def test_synthetic_traces_are_consistent(policy):
    tr = synthetic_trace(policy, world=4, ranks=[0, 1], wgs=8, bands_per_peer=2, tiles_per_band=3)
    s = summarize(tr)
    assert s["trace_clipped"] == 0
    assert s["busy_frac"] + s["idle_frac"] == pytest.approx(1.0)
    assert s["wgs_move"] >= 2 and s["wgs_build"] >= 2
    # Every tile built exactly once per rank: 4 source ranks x 2 bands x 3 tiles.
    assert (tr[tr["role"] == "BUILD"].groupby("rank")["item"].nunique() == 24).all()
    assert (tr[tr["role"] == "MOVE"].groupby("rank")["item"].nunique() == 6).all()
    if policy == "fixed:3":
        movers = set(tr.loc[tr["role"] == "MOVE", "wg"])
        assert movers <= {0, 1, 2} and not set(tr.loc[tr["role"] == "BUILD", "wg"]) & movers
        assert s["role_switches"] == 0


def test_perfetto_valid_and_non_overlapping(tmp_path):
    tr = synthetic_trace("self", world=4, ranks=[0, 2], wgs=6, bands_per_peer=2, tiles_per_band=2)
    # Add an overlapping record: the export must clip it.
    bad = tr.iloc[[0]].assign(t0_ns=tr.iloc[0]["t0_ns"] + 1, t1_ns=tr.iloc[0]["t1_ns"] + 5, role="WAIT")
    path = to_perfetto(pd.concat([tr, bad], ignore_index=True), tmp_path / "t.json", meta={"key": "abc"})
    obj = json.loads(path.read_text())
    assert validate_perfetto(obj) == []
    assert obj["metadata"]["key"] == "abc" and obj["metadata"]["clipped"] >= 1
    ev = obj["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 2: "rank 2"}
    threads = [e for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(threads) == 12 and threads[0]["args"]["name"].startswith("WG 0 · SM ")
    slices = [e for e in ev if e["ph"] == "X"]
    assert {e["name"] for e in slices} <= {"MOVE", "BUILD", "WAIT", "REDUCE"}
    assert all(e["dur"] > 0 and e["ts"] >= 0 and "cname" in e for e in slices)
    assert len(slices) == len(clean(pd.concat([tr, bad]))[0])


def test_validate_perfetto_catches_overlap():
    obj = {"traceEvents": [{"ph": "X", "name": "MOVE", "pid": 0, "tid": 1, "ts": 0.0, "dur": 2.0},
                           {"ph": "X", "name": "BUILD", "pid": 0, "tid": 1, "ts": 1.5, "dur": 1.0}]}
    assert any("overlaps" in p for p in validate_perfetto(obj))
    assert validate_perfetto({"events": []})


def test_ingest_rocprofv3_sample():
    # Layout (22 columns, "Agent N" ids, Stream_Id) of rocprofv3 --kernel-trace --output-format csv as
    # documented in rocprofiler-sdk's using-rocprofv3 guide of the ROCm 7 series ("Kernel name
    # mangling" example: same columns, the same first timestamps).
    df = ingest_rocprofv3(DATA / "rocprofv3_kernel_trace.csv")
    assert list(df.columns[:7]) == ["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"]
    assert len(df) == 5 and (df["role"] == "KERNEL").all() and (df["sm"] == -1).all()
    first = df.iloc[0]  # sorted by start time
    assert first["kernel_name"] == "void ag_gemm_kernel<__hip_bfloat16>(Params)"
    assert (first["t0_ns"], first["t1_ns"]) == (1551874061244694, 1551874061255734)
    assert first["grid_size"] == "65536x1x1" and first["workgroup_size"] == "256x1x1"
    by_name = df.groupby("kernel_name")["item"].unique()
    assert by_name["void ag_gemm_kernel<__hip_bfloat16>(Params)"].tolist() == [0]
    assert sorted(df["item"].unique()) == [0, 1, 2]
    # Agent 4 -> rank 0, Agent 5 -> rank 1; Agent 4's two queues -> tracks 0 and 1.
    assert dict(zip(df["agent_id"], df["rank"])) == {"Agent 4": 0, "Agent 5": 1}
    assert sorted(df.loc[df["rank"] == 0, "wg"].unique()) == [0, 1]
    assert validate_perfetto(perfetto_events(df)) == []
    assert summarize(df)["trace_records"] == 5


def test_ingest_rocprofv3_rocm6_layout():
    # Layout (18 columns, numeric Agent_Id, no Stream_Id, Private/Group_Segment_Size) of the
    # kernel_trace.csv that rocprofv3 of ROCm 6.2-6.4 writes: ROCm/rocprofiler-sdk
    # source/docs/data/kernel_trace.csv at commit 8ab1ed7 (2024-10-10, after tag rocm-6.2.2),
    # the same header as rocprofv3 output reported for ROCm 6.3.1 / 6.4.x in a rocprofiler-sdk issue.
    df = ingest_rocprofv3(DATA / "rocprofv3_rocm6_kernel_trace.csv")
    assert len(df) == 4 and (df["role"] == "KERNEL").all()
    assert dict(zip(df["agent_id"], df["rank"])) == {"2": 0, "3": 1}  # agent ids kept as text
    kosmos = df[df["kernel_name"].str.contains("kosmos_persistent_kernel")]
    assert list(kosmos["rank"]) == [0, 1] and kosmos["item"].nunique() == 1
    assert list(kosmos["t1_ns"] - kosmos["t0_ns"]) == [90000, 91000]
    assert kosmos.iloc[0]["grid_size"] == "26624x1x1" and kosmos.iloc[0]["workgroup_size"] == "256x1x1"
    assert sorted(df.loc[df["rank"] == 0, "wg"].unique()) == [0, 1]  # agent 2: queues 1, 2
    assert validate_perfetto(perfetto_events(df)) == []


def test_ingest_rocprofv3_newer_columns_and_bad_file(tmp_path):
    p = tmp_path / "x_kernel_trace.csv"
    p.write_text('"Kind","Agent_Id","Queue_Id","Kernel_Id","Kernel_Name","Correlation_Id","Start_Timestamp",'
                 '"End_Timestamp","Private_Segment_Size","Group_Segment_Size"\n'
                 '"KERNEL_DISPATCH",2,7,1,"k1",1,1000,2000,0,0\n"KERNEL_DISPATCH",2,7,2,"k2",2,2500,2600,0,0\n')
    df = ingest_rocprofv3(p)
    assert list(df["item"]) == [0, 1] and (df["rank"] == 0).all() and (df["wg"] == 0).all()
    assert df["workgroup_size"].isna().all()
    q = tmp_path / "bad.csv"
    q.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing column"):
        ingest_rocprofv3(q)


def test_rocprofv3_absent_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, why = rocprofv3_available()
    assert not ok and "rocprofv3" in why and "PATH" in why
    with pytest.raises(RuntimeError, match="not on PATH"):
        run_under_rocprofv3(["true"], tmp_path / "out")


def test_run_under_rocprofv3_with_fake_tool(monkeypatch, tmp_path):
    """A stand-in rocprofv3 that writes the sample CSV where the real one would."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "rocprofv3"
    fake.write_text("#!/bin/sh\n# args: --kernel-trace --output-format csv -d DIR -o NAME -- cmd...\n"
                    f'mkdir -p "$5/host/123" && cp "{DATA / "rocprofv3_kernel_trace.csv"}" "$5/host/123/$7_kernel_trace.csv"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    path = run_under_rocprofv3(["true"], tmp_path / "out")
    assert path.name == "kosmos_kernel_trace.csv" and len(ingest_rocprofv3(path)) == 5


def test_torch_profile_cpu(tmp_path):
    import torch

    a = torch.randn(64, 64)
    path = torch_profile(lambda: a @ a, tmp_path / "prof.json", steps=2)
    obj = json.loads(path.read_text())
    names = {e.get("name") for e in obj["traceEvents"]}
    assert "kosmos-bench step 0" in names and "kosmos-bench step 1" in names


def test_gpu_work_per_range_follows_correlation_ids_not_time(tmp_path):
    """Each annotated range owns the GPU work its runtime calls launched, on any stream and
    whenever it ran; work launched outside every range is nobody's."""
    from kosmos_bench.trace import gpu_work_per_range

    ev, corr = [], [0]

    def x(cat, name, ts, dur, c=None, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                   "args": ({"correlation": c} if c is not None else {}) | args})

    def call(name, ts, gpu_cat, gpu_ts, gpu_dur, stream):
        corr[0] += 1
        x("cuda_runtime", name, ts, 2, corr[0])
        x(gpu_cat, name, gpu_ts, gpu_dur, corr[0], stream=stream)

    x("user_annotation", "call|0|kosmos", 100, 50)
    call("cudaMemcpyAsync", 105, "gpu_memcpy", 1000, 300, 14)     # head copy, side stream
    call("cudaLaunchCooperativeKernel", 110, "kernel", 1005, 400, 7)
    call("cudaMemcpyAsync", 140, "gpu_memcpy", 1300, 100, 14)     # rest of the plan
    x("user_annotation", "call|0|gemm", 200, 10)
    call("cudaLaunchKernel", 205, "kernel", 1410, 80, 7)          # runs after kosmos on the GPU
    call("cudaLaunchKernel", 500, "kernel", 1600, 5, 7)           # outside every range
    x("user_annotation", "call|1|idle", 600, 10)                  # launched nothing
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    df = gpu_work_per_range(path).set_index("name")
    assert list(df.index) == ["call|0|kosmos", "call|0|gemm"]
    k = df.loc["call|0|kosmos"]
    assert (k.gpu_start, k.gpu_end, k.k_start, k.k_end, k.c_start, k.c_end) == (1000, 1405, 1005, 1405, 1000, 1400)
    assert (k.n_copies, k.n_kernels, k.host_us, k.lead_us) == (2, 1, 50, 895)
    g = df.loc["call|0|gemm"]
    assert (g.gpu_start, g.gpu_end, g.n_copies, g.n_kernels) == (1410, 1490, 0, 1) and np.isnan(g.c_start)


# One WG of a MoE kernel, two agents at once (math warps and movers), window [0, 100] us:
#   math:   ROUTER 0-10 | EXPERT 20-60 | EXPERT 60-90
#   movers: DISPATCH 5-25 | COMBINE 70-80 | FOLD 85-100
# The union of WG 0's useful records is the whole window (busy 100 us, though its records sum
# to 155); WG 1 (math only) runs EXPERT 10-40: idle 0-10 and 40-100.
LANES = [(0, "ROUTER", 0, 0, 10), (0, "DISPATCH", 1, 5, 25), (0, "EXPERT", 2, 20, 60), (0, "EXPERT", 3, 60, 90),
         (0, "COMBINE", 4, 70, 80), (0, "FOLD", 5, 85, 100), (1, "EXPERT", 6, 10, 40)]


def test_assign_lanes_separates_concurrent_agents():
    from kosmos_bench.trace import assign_lanes

    df = tl(LANES)
    df["lane"] = assign_lanes(df)
    assert list(df["lane"]) == [0, 1, 0, 0, 1, 1, 0]
    for _, g in df.groupby(["wg", "lane"]):  # no two records of one lane overlap
        g = g.sort_values("t0_ns")
        assert (g["t0_ns"].to_numpy()[1:] >= g["t1_ns"].to_numpy()[:-1]).all()
    assert list(assign_lanes(tl(HAND))) == [0] * len(HAND)  # one agent per WG: one lane


def test_summarize_lanes_union_and_role_classes():
    """Concurrent records of one WG are not clipped away: busy is their union, the classes sum."""
    from kosmos_bench.trace import assign_lanes

    df = tl(LANES)
    without_lanes = summarize(df)
    assert without_lanes["trace_clipped"] > 0  # the old view: overlaps taken for malformed records
    df["lane"] = assign_lanes(df)
    s = summarize(df)
    wg_time = 200.0
    assert s["trace_clipped"] == 0
    assert s["busy_frac"] == pytest.approx((100 + 30) / wg_time)
    assert s["idle_frac"] == pytest.approx(70 / wg_time) and s["idle_windows"] == 2
    assert s["busy_frac_build"] == pytest.approx((10 + 40 + 30 + 30) / wg_time)  # ROUTER + EXPERTs
    assert s["busy_frac_move"] == pytest.approx((20 + 10) / wg_time)  # DISPATCH + COMBINE
    assert s["busy_frac_reduce"] == pytest.approx(15 / wg_time)  # FOLD
    assert s["wg_busy_frac_max"] == pytest.approx(1.0) and s["wg_busy_frac_min"] == pytest.approx(0.3)
    assert s["first_build_us"] == 0.0 and s["tail_after_move_us"] == 20.0
    assert s["role_switches"] == 1  # lane 0: BUILD only; lane 1: MOVE, MOVE -> REDUCE; WG 1: BUILD only
    assert s["wgs_build"] == 2 and s["wgs_move"] == 1 and s["wgs_reduce"] == 1
    iw = idle_windows(df)
    assert [(int(r.wg), r.t0_ns // US, r.t1_ns // US) for r in iw.itertuples()] == [(1, 0, 10), (1, 40, 100)]


def test_moe_roles_have_classes():
    """Every role the MoE kernels write is MOVE, BUILD or REDUCE in the summaries."""
    from kosmos_bench.kernels import moe_bwd_sm90, moe_sm90
    from kosmos_bench.trace import ROLE_CLASS, USEFUL_ROLES

    for mod in (moe_sm90, moe_bwd_sm90):
        for name in mod.ROLE_CODES.values():
            assert ROLE_CLASS.get(name) in USEFUL_ROLES, (mod.__name__, name)


def test_moe_decode_trace_lanes():
    """The MoE kernels' decoder: item kinds from the high byte, times from the first record, lanes."""
    import torch

    from kosmos_bench.impls.kosmos_moe import decode_trace
    from kosmos_bench.kernels import moe_sm90 as K

    grid, cap = 2, 4
    raw = np.zeros((grid, cap), dtype=TRACE_RECORD_DTYPE)
    up, comb = K.KINDS.index("UP"), K.KINDS.index("COMBINE")
    raw[0, :3] = [(1000, 5000, (up << 24) | 3, 2, 11), (2000, 3000, (comb << 24) | 1, 3, 11), (5000, 6000, (up << 24) | 4, 2, 11)]
    raw[1, :1] = [(1500, 2500, (up << 24) | 9, 2, 12)]
    buf = torch.from_numpy(raw.view(np.uint8).reshape(-1).copy())
    df, dropped = decode_trace(buf, torch.tensor([3, 1], dtype=torch.int32), grid, cap, 0, K.ROLE_CODES, K.KINDS)
    assert dropped == 0
    assert list(df["kind"]) == ["UP", "COMBINE", "UP", "UP"] and list(df["item"]) == [3, 1, 4, 9]
    assert list(df["role"]) == ["EXPERT", "COMBINE", "EXPERT", "EXPERT"]
    assert list(df["t0_ns"]) == [0, 1000, 4000, 500] and list(df["lane"]) == [0, 1, 0, 0]
    s = summarize(df)
    assert s["trace_clipped"] == 0 and s["busy_frac"] == pytest.approx((5000 + 1000) / (2 * 5000))


def test_kind_summary_per_item_kind():
    """Per item kind: items, time per WG (over every WG), time per item, first start / last end."""
    from kosmos_bench.trace import kind_summary

    df = tl(LANES)
    df["kind"] = ["ROUTE", "GATHER", "UP", "DOWN", "COMBINE", "FOLD", "UP"]
    got = kind_summary(df)
    assert list(got["kind"]) == ["ROUTE", "GATHER", "UP", "DOWN", "COMBINE", "FOLD"]  # by first start
    up = got[got["kind"] == "UP"].iloc[0]
    assert up["role"] == "EXPERT" and up["items"] == 2
    assert up["busy_ms_per_wg"] == pytest.approx((40 + 30) / 2 / 1000)  # 2 WGs
    assert up["us_per_item"] == pytest.approx(35.0)
    assert (up["first_ms"], up["last_ms"]) == (pytest.approx(0.010), pytest.approx(0.060))
    assert kind_summary(tl(HAND)).empty  # no kinds: nothing to summarise
