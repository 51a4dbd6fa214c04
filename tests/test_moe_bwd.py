"""ops moe-bwd / moe-step on the CPU: the streamed reference against moe_math's autograd one, the
counts, the check (it catches a wrong gradient), the torch pipelines' backward through the
harness (world 1, local, host, gloo), the backward graph without accumulating scatters, the
skipped rows, the simulator and the shipped sweeps."""
import subprocess
import sys

import pytest
import torch

from kosmos_bench import harness, launch
from kosmos_bench.impls import get_impl
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.ops import get_op
from kosmos_bench.ops import moe_grad as mg
from kosmos_bench.ops import moe_math as mm
from kosmos_bench.ops.moe import preset_point_dims
from kosmos_bench.ops.moe_bwd import GRAD_RTOL
from kosmos_bench.point import Point
from kosmos_bench.sim import profiles
from kosmos_bench.spec import expand, load_sweep


def _pt(op="moe-bwd", impl="torch-moe", preset="tiny", T=32, world=1, fabric="local", routing="zipf:1.2", **kw):
    return Point(op, impl, world=world, fabric=fabric, backend="cpu", moe=preset, routing=routing,
                 warmup=1, reps=2, **preset_point_dims(preset, T), **kw)


# ----------------------------------------------------------------------------- the reference
@pytest.mark.parametrize("preset", ["tiny", "tiny-grouped"])
def test_streamed_reference_is_moe_maths_autograd(preset):
    s, seed = mm.preset(preset, T=24, world=2, routing="zipf:1.2"), 5
    x = mm.tokens(s, 1, "cpu", seed)
    Wr, bias = mm.router(s, "cpu", seed)
    idx = mm.route(s, x, Wr, bias)[0]
    dy = mg.output_grad(s, 1, "cpu", seed)
    ref = mm.reference_backward(s, 1, x, idx, dy, "cpu", seed)
    got = mg.token_grads(s, x, idx, dy, "cpu", seed, Wr)
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))  # noqa: E731
    assert close(got["x"], ref["x"]) and close(got["Wr"], ref["Wr"])
    assert (got["shared"] is None) == (ref["shared"] is None)
    if ref["shared"] is not None:
        assert all(close(a, b) for a, b in zip(got["shared"], ref["shared"]))
    w = mg.combine_weights(s, x, Wr, idx)
    for e in ref["W1"]:
        d1, d2 = mg.expert_grads(s, e, [(x, idx, w, dy)], "cpu", seed)
        assert close(d1, ref["W1"][e]) and close(d2, ref["W2"][e])
    # two ranks' rows: the sum of the ranks' contributions, in rank order
    x0 = mm.tokens(s, 0, "cpu", seed)
    i0, dy0 = mm.route(s, x0, Wr, bias)[0], mg.output_grad(s, 0, "cpu", seed)
    e = int(idx[0, 0])
    both = mg.expert_grads(s, e, [(x0, i0, mg.combine_weights(s, x0, Wr, i0), dy0), (x, idx, w, dy)], "cpu", seed)
    one = mg.expert_grads(s, e, [(x0, i0, mg.combine_weights(s, x0, Wr, i0), dy0)], "cpu", seed)
    assert close(both[0], one[0] + ref["W1"][e])


# ----------------------------------------------------------------------------- the ops
def test_counts_and_validation():
    p = Point("moe-bwd", "torch-moe", world=8, fabric="host", moe="deepseek-v3", **preset_point_dims("deepseek-v3", 8192))
    fwd, bwd, step = get_op("moe"), get_op("moe-bwd"), get_op("moe-step")
    assert bwd.flops(p) == 2 * fwd.flops(p) and step.flops(p) == 3 * fwd.flops(p)
    assert bwd.bound_flops(p) == 2 * fwd.bound_flops(p) and step.bound_flops(p.replace(fabric="local")) == \
        3 * fwd.bound_flops(p.replace(fabric="local"))
    assert bwd.comm_bytes(p) == fwd.comm_bytes(p) and step.comm_bytes(p) == 2 * fwd.comm_bytes(p)
    assert bwd.tokens(p) == 8 * 8192 and bwd.validate(p) is None
    assert "op moe-step needs a preset" in step.validate(p.replace(moe=None))
    assert "moe-bwd is bf16 only" in bwd.validate(p.replace(dtype="fp16"))
    row = {"t_median_us": 100.0, "t_gemm_us": 50.0, "gemm_flops": bwd.bound_flops(p) / 2}
    d = bwd.derive(row, p)
    assert d["tokens_per_s"] == pytest.approx(8 * 8192 / 100e-6) and d["frac_bound"] == pytest.approx(1.0)


@pytest.mark.parametrize("op", ["moe-bwd", "moe-step"])
@pytest.mark.parametrize("preset,world,fabric", [("tiny", 1, "local"), ("tiny-grouped", 1, "host"),
                                                 ("tiny-grouped", 2, "local"), ("tiny", 4, "local"),
                                                 ("tiny-grouped", 4, "host"), ("tiny", 2, "host")])
def test_torch_moe_backward_is_right_and_deterministic(op, preset, world, fabric):
    row, _ = harness.run_point(_pt(op, preset=preset, world=world, fabric=fabric), rank=0, procs=1)
    assert row["status"] == "ok", row.get("error")
    assert row["wrong"] == 0 and row["route_mismatches"] == 0 and row["deterministic"]
    assert 0 < row["max_rel_err_dx"] < GRAD_RTOL and 0 < row["max_rel_err_dWr"] < GRAD_RTOL
    assert row["max_rel_err_dW"] > 0 and (row["max_rel_err_dWs"] > 0) == (preset == "tiny-grouped")
    assert row["tokens_per_s"] > 0 and row["frac_bound"] > 0
    assert (row["dispatch_bytes"] > 0) == (world > 1)


def test_compiled_backward_reuses_its_graph():  # moe-bwd: retain_graph under torch.compile
    row, _ = harness.run_point(_pt(impl="torch-moe-compiled", world=2), rank=0, procs=1)
    assert row["status"] == "ok" and row["wrong"] == 0 and row["deterministic"], row.get("error")
    assert row["compile_s"] > 0


def test_gloo_backward_over_real_ranks():
    pts = [_pt(op, preset=pr, world=w, fabric="gloo") for op in ("moe-bwd", "moe-step")
           for pr, w in (("tiny-grouped", 2), ("tiny", 3))]
    rows = {}
    launch.run_points(pts, lambda p: None, lambda p, row, tr: rows.__setitem__(p.key(), row), timeout_s=120)
    for p in pts:
        r = rows[p.key()]
        assert r["status"] == "ok" and r["wrong"] == 0 and r["deterministic"], (p.op, p.world, r.get("error"))


def _grad_nodes(roots) -> list:
    seen, stack, out = set(), [r.grad_fn for r in roots], []
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        out.append(f)
        stack += [g for g, _ in f.next_functions]
    return out


@pytest.mark.parametrize("preset,world,fabric", [("tiny-grouped", 1, "local"), ("tiny", 2, "local"),
                                                 ("tiny-grouped", 4, "host")])
def test_backward_graph_has_no_accumulating_scatter(preset, world, fabric):
    """Every node's backward is deterministic on CUDA: no gather / index / index_select (their
    backwards scatter-add with atomics), no accumulating index_put."""
    p = _pt(preset=preset, world=world, fabric=fabric)
    inputs, _ = get_op(p.op).setup(p, list(range(world)), "cpu", 3)
    runner = get_impl("torch-moe").prepare(p, RankCtx(0, world, 1, torch.device("cpu"), fabric, "cpu"), inputs)
    outs, roots = runner.saved
    nodes = _grad_nodes(list(outs.values()) + [y for _, y in roots])
    names = {type(n).__name__ for n in nodes}
    assert "GroupedMmBackward0" in names and "GatherRowsBackward" in names
    assert not names & {"GatherBackward0", "IndexBackward0", "IndexSelectBackward0", "IndexAddBackward0",
                        "ScatterAddBackward0", "EmbeddingBackward0"}, names
    assert not any(getattr(n, "_saved_accumulate", False) for n in nodes)


# ----------------------------------------------------------------------------- the check catches
class _Broken:
    """torch-moe's moe-bwd runner made wrong in one way after each call."""

    def __init__(self, p, how):
        self.inputs, self.state = get_op(p.op).setup(p, list(range(p.world)), "cpu", 3)
        ctx = RankCtx(0, p.world, 1, torch.device("cpu"), p.fabric, "cpu")
        self.inner = get_impl("torch-moe").prepare(p, ctx, self.inputs)
        self.grads, self.routes, self.outputs = self.inner.grads, self.inner.routes, self.inner.outputs
        self.how, self.calls = how, 0

    def run(self):
        self.inner.run()
        self.calls += 1
        g = self.grads
        if self.how == "unwritten":
            g["dW2"][1][0, 3, 5] = float("nan")
        elif self.how == "off-expert":  # one element of an expert's dW1 off by its rms
            t = g["dW1"][0][1]
            t[2, 7] += float(t.float().pow(2).mean().sqrt()) + 0.1 * abs(float(t[2, 7]))
        elif self.how == "off-x":
            t = g["dx"][1]
            t[4, 9] += 0.5 * float(t.float().pow(2).mean().sqrt()) + 0.1 * abs(float(t[4, 9]))
        elif self.how == "swapped-experts":  # rank 0's experts 0 and 1 exchanged
            g["dW1"][0][[0, 1]] = g["dW1"][0][[1, 0]].clone()
        elif self.how == "nondeterministic" and self.calls % 2:
            g["dWr"][0][0, 0] += 1e-2 * abs(float(g["dWr"][0][0, 0])) + 1e-3

    def close(self):
        pass


@pytest.mark.parametrize("how", ["unwritten", "off-expert", "off-x", "swapped-experts", "nondeterministic"])
def test_the_check_catches(how):
    p = _pt(world=2, routing="uniform")
    br = _Broken(p, how)
    ctx = RankCtx(0, p.world, 1, torch.device("cpu"), p.fabric, "cpu")
    wrong, err, same, extra = harness._check(br, p, ctx, br.inputs, br.state)
    if how == "nondeterministic":
        assert not same and wrong == 0
    elif how == "swapped-experts":
        assert wrong > 100 and same
    else:
        assert wrong == 1 and extra["route_mismatches"] == 0 and same is (how != "unwritten")


def test_the_check_catches_a_wrong_route_in_the_forward_state():
    p = _pt(world=2)
    br = _Broken(p, "none")
    keys = mm.route(mm.preset("tiny", T=32, world=2, routing="zipf:1.2"), br.inputs.x[0], br.inputs.Wr,
                    br.inputs.bias)[2]
    br.routes[0][0, -1] = int(keys[0].argmin())  # moe-bwd's routes are the forward's: never poisoned
    ctx = RankCtx(0, p.world, 1, torch.device("cpu"), p.fabric, "cpu")
    wrong, _, _, extra = harness._check(br, p, ctx, br.inputs, br.state)
    assert extra["route_mismatches"] == 1 and wrong >= 1


# ----------------------------------------------------------------------------- skipped rows
def test_skipped_with_reasons():
    assert get_impl("kosmos").unsupported(_pt(impl="kosmos", policy="self").replace(backend="gpu")) is None
    assert "fabric nvlink is not implemented yet" in get_impl("kosmos").unsupported(
        _pt("moe-step", impl="kosmos", world=8, fabric="nvlink").replace(backend="gpu"))
    assert "no autograd path" in get_impl("torch-moe-overlap").unsupported(
        _pt("moe-step", impl="torch-moe-overlap", world=8, fabric="host").replace(backend="gpu"))
    assert get_impl("torch-moe-overlap").unsupported(_pt(impl="torch-moe-overlap", world=2).replace(backend="gpu")) is None
    assert "not written yet" in get_impl("deepep").unsupported(_pt(impl="deepep", world=8, fabric="nvlink"))
    row, _ = harness.run_point(_pt(impl="liger-moe"), rank=0, procs=1)
    assert row["status"] == "skipped" and "liger" in row["error"]


# ----------------------------------------------------------------------------- simulator, sweeps
def _sim(op, impl, world=1, fabric="nvlink", preset="deepseek-v3", **kw):
    p = Point(op, impl, world=world, fabric=fabric, backend="sim", moe=preset, routing="uniform",
              profile=profiles.default_for(fabric, world), **preset_point_dims(preset, 8192), **kw)
    return harness.run_sim_point(p)[0]


def test_simulator_models_the_backward_and_the_step():
    for impl, world, fabric in (("torch-moe", 1, "nvlink"), ("torch-moe-compiled", 1, "nvlink"),
                                ("torch-moe", 8, "host"), ("torch-moe-overlap", 4, "local"), ("kosmos", 1, "nvlink"),
                                ("kosmos", 4, "local"), ("kosmos", 8, "host")):
        # the step's forward has SM movers (the copy-engine movers are the forward op's alone)
        kw = {"mover": "sm"} if impl == "kosmos" and fabric == "host" else {}
        t = {op: _sim(op, impl, world, fabric, **(kw if op == "moe" else {})) for op in ("moe", "moe-bwd", "moe-step")}
        assert all(r["status"] == "ok" for r in t.values()), t
        f, b, s = (t[o]["t_median_us"] for o in ("moe", "moe-bwd", "moe-step"))
        assert f < b < s and s == pytest.approx(f + b)
        assert 0 < t["moe-bwd"]["frac_bound"] <= 1.0
    assert _sim("moe-bwd", "torch-moe-compiled")["t_median_us"] < _sim("moe-bwd", "torch-moe")["t_median_us"]
    for row in (_sim("moe-bwd", "kosmos", 8, "nvlink"), _sim("moe-step", "torch-moe-overlap", 8, "host")):
        assert row["status"] == "skipped"
    assert "fabric nvlink not implemented yet" in _sim("moe-step", "kosmos", 8, "nvlink")["error"]
    assert _sim("moe-bwd", "kosmos")["t_median_us"] < _sim("moe-bwd", "torch-moe")["t_median_us"]


def test_shipped_sweeps_parse_with_the_points_of_moe():
    base = {(p.moe, p.M, p.routing, p.world, p.impl) for p in expand(load_sweep("moe"), backend="sim", fabric="host")}
    for name in ("moe-bwd", "moe-step"):
        sw = load_sweep(name)
        pts = expand(sw, backend="sim", fabric="host")
        assert sw.op == name and {p.op for p in pts} == {name}
        assert {(p.moe, p.M, p.routing, p.world, p.impl) for p in pts} == base


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the sweep runs on it, not the simulator")
def test_sweep_moe_bwd_without_a_gpu_runs_the_simulator(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kosmos_bench.cli", "sweep", "moe-step", "--world", "1", "--impl",
                        "kosmos,torch-moe", "-o", tmp_path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SIMULATED" in r.stdout and "tokens/s" in r.stdout and "moe-step" in r.stdout
    assert "not built yet" not in r.stdout and "kosmos" in r.stdout
