"""The backward ops and the layer step without a GPU: sweep expansion and the simulator."""
import numpy as np
import pytest

from kosmos_bench import schedule as S
from kosmos_bench import sim
from kosmos_bench.models import get_model, op_shape
from kosmos_bench.point import Point
from kosmos_bench.report import layer_summary
from kosmos_bench.spec import load_sweep


def test_backward_sweeps_expand_to_the_layer_shapes():
    m = get_model("llama3-70b")
    assert op_shape(m, "fc2", 8192, "ag-gemm-dgrad") == (8192, 28672, 8192)
    assert op_shape(m, "fc1", 8192, "gemm-rs-dgrad") == (8192, 8192, 57344)
    assert op_shape(m, "fc1", 8192, "ag-wgrad") == (8192, 57344, 8192)
    assert op_shape(m, "out-proj", 8192, "ag-wgrad") == (8192, 8192, 8192)
    assert op_shape(m, "layer", 8192, "layer") == (8192, 8192, 28672)
    for name, op, layers in (("ag-gemm-dgrad", "ag-gemm-dgrad", {"out-proj", "fc2"}),
                             ("gemm-rs-dgrad", "gemm-rs-dgrad", {"qkv", "fc1"}),
                             ("ag-wgrad", "ag-wgrad", {"qkv", "fc1", "out-proj", "fc2"}), ("layer", "layer", {"layer"})):
        sw = load_sweep(name)
        assert sw.op == op and {s.layer for s in sw.shapes} == layers and sw.fabric == "host" and sw.world == [8]


def test_simulator_runs_the_backward_ops_as_their_forward_schedules():
    for op, fwd in (("ag-gemm-dgrad", "ag-gemm"), ("gemm-rs-dgrad", "gemm-rs")):
        p = Point(op, "kosmos", 8192, 28672, 8192, 8, backend="sim", policy="self")
        f, _ = sim.simulate_point(p)
        g, _ = sim.simulate_point(p.replace(op=fwd))
        assert f["t_median_us"] == g["t_median_us"] > 0
    w = Point("ag-wgrad", "nccl-overlap", 8192, 57344, 8192, 8, backend="sim")
    f, _ = sim.simulate_point(w)
    assert f["t_median_us"] > f["t_comm_us"] > 0
    # kosmos ag-wgrad: its own schedule (tiles over all of K), the same GEMM / collective alone
    k, _ = sim.simulate_point(w.replace(impl="kosmos", policy="self"))
    assert k["t_gemm_us"] == f["t_gemm_us"] and k["t_comm_us"] == f["t_comm_us"] and k["builder"] == "sm90"
    assert k["t_median_us"] >= max(k["t_gemm_us"], k["t_comm_us"])


def test_simulated_layer_step_and_its_summary():
    rows = []
    for impl in ("kosmos", "nccl-seq", "nccl-overlap"):
        p = Point("layer", impl, 8192, 8192, 28672, 8, backend="sim", policy="self" if impl == "kosmos" else None)
        f, trace = sim.run_point(p)
        assert trace is None and f["t_median_us"] > f["t_gemm_us"] > 0 and f["t_comm_us"] > 0
        assert f["layer_ops"].count("=") == 10
        rows.append({"op": "layer", "status": "ok", "impl": impl, "variant": p.variant, "M": 8192, "N": 8192,
                     "K": 28672, "world": 8, "fabric": "host", "t_median_us": f["t_median_us"],
                     "tokens_per_s": 8192 / f["t_median_us"] * 1e6, "exposed_comm_share": 0.5,
                     "speedup_vs_seq": 1.2})
    ops = sim.run_point(Point("layer", "kosmos", 8192, 8192, 28672, 8, backend="sim", policy="self"))[0]["layer_ops"]
    assert "ag-wgrad" not in rows[0] and "qkv.wgrad=kosmos" in ops and "fc1.wgrad=kosmos" in ops
    import pandas as pd

    lines = layer_summary(pd.DataFrame(rows))
    assert "T=8192 H=8192 F=28672 W=8" in lines[0] and "1.10-1.28x" in lines[-1] and "rank-0 view" in lines[-1]


TILE = (("wgrad_items", "tile"),)  # the tile-resident items (band items are the default)


def test_kosmos_ag_wgrad_on_the_simulator():
    """kosmos ag-wgrad's own schedule with SM movers on every fabric: tiles start on the own rows (at
    once) and end after the last band's work; self compared with predicted; no deadlock on local W=2..8."""
    from kosmos_bench.sim import engine, model, profiles

    p = Point("ag-wgrad", "kosmos", 8192, 28672, 8192, 8, backend="sim", policy="self", mover="sm", knobs=TILE)
    f, trace = sim.run_point(p)
    assert f["builder"] == "sm90" and f["max_inflight_movers"] >= 1 and f["num_movers"] is None
    assert set(trace["role"]) >= {"BUILD", "MOVE"}
    g, _ = sim.simulate_point(p.replace(policy="predicted"))
    assert g["num_movers"] >= 1 and max(f["t_comm_us"], f["t_gemm_us"]) <= f["t_median_us"] <= 1.05 * g["t_median_us"]
    built = model.build(p, profiles.load(sim.profiles.default_for("host", 8)))
    res = engine.simulate(built.problem)
    b = built.problem.kind == engine.BUILD
    assert built.problem.end_dep_ptr is not None and np.diff(built.problem.end_dep_ptr)[b].min() > 0
    first = res.t_start[b].min()
    assert first < res.t_end[built.problem.kind == engine.MOVE].min()  # tiles start before any band lands
    for W in (2, 4, 8):
        for pol in ("self", "fixed:2", "predicted"):
            q = Point("ag-wgrad", "kosmos", 2048, 1024 * W, 2048 * W, W, backend="sim", policy=pol, fabric="local")
            assert sim.simulate_point(q)[0]["t_median_us"] > 0
    q = Point("ag-wgrad", "kosmos", 4096, 8192, 8192, 8, backend="sim", policy="self", fabric="nvlink")
    assert sim.simulate_point(q)[0]["t_median_us"] > 0
    with pytest.raises(sim.Unsupported, match="sm90"):
        sim.simulate_point(p.replace(builder="mma"))


@pytest.mark.parametrize("items", ["tile", "band"])
def test_kosmos_ag_wgrad_copy_engine_movers_on_the_simulator(items):
    """mover ce (host, policy self): every CTA builds and the copy engine (one agent, sm -1) brings
    the peers' At bands, whole copies in the tiles' K order. Faster than SM movers (55 vs 49 GB/s,
    and no mover CTAs). Tile items stay behind nccl-overlap where the GEMM is more than a wave:
    no tile ends before the last byte (each reduces over all of K), so all but the first wave's
    work runs after the copies; band items end most of theirs before it."""
    from kosmos_bench.sim import engine, model, profiles

    prof = profiles.load(sim.profiles.default_for("host", 8))
    p = Point("ag-wgrad", "kosmos", 8192, 28672, 8192, 8, backend="sim", policy="self",
              knobs=(("wgrad_items", items),))
    ce, sm = p.replace(mover="ce"), p.replace(mover="sm")
    built = model.build(ce, prof)
    res = engine.simulate(built.problem)
    k = built.problem.kind
    assert built.info["mover"] == "ce" and set(res.wg_of[k == engine.MOVE].tolist()) == {built.num_wgs}
    assert set(built.problem.sm[0][res.wg_of[k == engine.MOVE]].tolist()) == {-1}
    last_byte = res.t_end[k == engine.MOVE].max()
    t_ce, t_sm = sim.simulate_point(ce)[0]["t_median_us"], sim.simulate_point(sm)[0]["t_median_us"]
    t_ov = sim.simulate_point(p.replace(impl="nccl-overlap", policy=None))[0]["t_median_us"]
    assert t_ce < 0.95 * t_sm
    ended = (res.t_end[k == engine.BUILD] <= last_byte).mean()
    if items == "tile":
        assert ended == 0 and t_ce > 1.1 * t_ov
    else:
        assert ended > 0.8 and t_ce < t_ov


def test_kosmos_ag_wgrad_band_items_on_the_simulator():
    """wgrad_items=band: (group, tile) items with claim-time deps (no stream deps), ahead of the
    tile-resident design on the host fabric (its first wave no longer holds its CTAs until the
    last band); the GPU backend takes it (the carry kernel of the A-transposed build)."""
    from kosmos_bench.impls.kosmos import KosmosImpl
    from kosmos_bench.kosmos.config import KosmosConfig
    from kosmos_bench.sim import model, profiles

    band = Point("ag-wgrad", "kosmos", 8192, 57344, 8192, 8, backend="sim", policy="self")
    p = band.replace(knobs=TILE)
    assert KosmosConfig.from_point(band).wgrad_items == "band"  # the default
    built = model.build(band, profiles.load(sim.profiles.default_for("host", 8)))
    assert built.problem.end_dep_ptr is None and built.scheds[0].meta["num_groups"] == 8
    t_tile, t_band = sim.simulate_point(p)[0]["t_median_us"], sim.simulate_point(band)[0]["t_median_us"]
    assert t_band < 0.9 * t_tile
    for W in (2, 4):
        q = Point("ag-wgrad", "kosmos", 2048, 1024 * W, 2048 * W, W, backend="sim", policy="self", fabric="local",
                  knobs=(("wgrad_group", 1), ("wgrad_items", "band")))
        assert sim.simulate_point(q)[0]["t_median_us"] > 0
    assert KosmosImpl().unsupported(band.replace(backend="gpu", M=264, N=1088, K=1600)) is None  # the carry kernel
    with pytest.raises(sim.Unsupported, match="wgrad_group=2"):
        sim.simulate_point(p.replace(knobs=(("wgrad_group", 2),) + TILE))


def test_the_wgrad_models_charge_their_passes_over_c():
    """Both overlapped ag-wgrad designs pass over the whole C_r once per K chunk, which the
    ag-gemm schedules they mirror (disjoint rows of C) never do: nccl-overlap's fp32 accumulator
    (part -> acc 6 bytes an element, acc += part 10, acc -> C 6; impls/nccl.py) and kosmos band
    items' fp32 carry at the CTAs' share of HBM (all of a group's tiles carry at once). Without
    them the simulator put both at ~40% of the H100's times at llama3-405b FC1 (4.9 / 5.5 ms
    against 12.4 / 11.5, results/device-h100-20261206c)."""
    from kosmos_bench.sim import baselines, engine, model, profiles

    prof = profiles.load(sim.profiles.default_for("host", 8))
    M, N, K, W = 16384, 106496, 8192, 8
    wg = Point("ag-wgrad", "nccl-overlap", M, N, K, W, backend="sim")
    ag = wg.replace(op="ag-gemm", M=K, K=M)  # what the model ran before: the same chunks and GEMMs
    acc = (6 + (W - 1) * 10 + 6) * M * (N // W) / (prof["hbm_GBps"] * 1e3) + (W + 1) * prof["launch_overhead_us"]
    t_wg, t_ag = sim.simulate_point(wg)[0]["t_median_us"], sim.simulate_point(ag)[0]["t_median_us"]
    # on the main stream after each chunk GEMM: exposed but where it waits for the next chunk anyway
    assert t_ag + 0.9 * acc < t_wg <= t_ag + acc + 1e-6 and acc > 0.4 * t_ag
    assert baselines.overlap_us(ag, prof) == pytest.approx(t_ag)
    band = Point("ag-wgrad", "kosmos", M, N, K, W, backend="sim", policy="self", knobs=(("wgrad_group", 8),))
    built = model.build(band, prof)  # groups of 8 bands: one 1024-row shard each
    sch = built.scheds[0]
    bt = sch.builders
    G = int(prof["num_sms"])
    i = int(np.flatnonzero(bt.table[:, S.F["rel_flag"]] >= 0)[-1])  # a middle group's item: carry load + store
    rows, cols = (int(bt.table[i, S.F[f]]) for f in ("rows", "cols"))
    assert bt.bytes[i] - 2 * (bt.flops[i] / (2.0 * rows * cols)) * (rows + cols) == 8 * rows * cols
    share = min(float(prof["wg_hbm_GBps"]), prof["hbm_GBps"] / G)
    assert share < float(prof["wg_hbm_GBps"])  # HBM shared by every CTA is the bound, not one CTA's rate
    work = built.problem.work_ns[built.problem.kind == engine.BUILD]  # same MMAs: groups of one 1024-row shard
    assert work.max() - work.min() == pytest.approx((8 - 4) * 128 * 256 / share, rel=1e-6)  # middle - first group
