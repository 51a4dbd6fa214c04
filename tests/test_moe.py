"""op moe on the CPU: Point keys, the sweep file's moe: section, the op's counts and check, the
torch baselines through the harness (world 1, local, host), kosmos's registration, the report."""
import sys
import types

import pytest
import torch

from kosmos_bench import harness
from kosmos_bench.impls import get_impl
from kosmos_bench.impls import kosmos as kosmos_impl
from kosmos_bench.impls.base import RankCtx
from kosmos_bench.ops import get_op
from kosmos_bench.ops import moe_math as mm
from kosmos_bench.ops.moe import moe_shape, preset_point_dims
from kosmos_bench.point import Point
from kosmos_bench.spec import SpecError, expand, parse_sweep


def _pt(impl="torch-moe", preset="tiny", T=32, world=1, fabric="local", routing="zipf:1.2", **kw):
    return Point("moe", impl, world=world, fabric=fabric, backend="cpu", moe=preset, routing=routing,
                 warmup=1, reps=2, **preset_point_dims(preset, T), **kw)


# ----------------------------------------------------------------------------- Point / spec
def test_tp_point_keys_do_not_change_and_moe_fields_enter_the_key():
    tp = Point("ag-gemm", "nccl-seq", 1024, 512, 256, 8)
    assert not {"moe", "routing", "experts"} & set(tp.config())
    a, b = _pt(), _pt(routing="uniform")
    assert a.key() != b.key() != _pt(experts=8).key()
    assert a.config()["moe"] == "tiny" and a.variant == "torch-moe"


def test_tp_point_key_is_the_one_before_moe_fields():
    import hashlib
    import json

    tp = Point("gemm-rs", "kosmos", 4096, 4096, 4096, 8, policy="self", queue_order="demand", local_first=True, chunk=1)
    cfg = tp.config()
    blob = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    assert tp.key() == hashlib.sha1(blob.encode()).hexdigest()[:16] and "routing" not in blob


def _sweep(**moe):
    data = {"op": "moe", "impls": ["torch-moe", "kosmos"], "world": [1, 8],
            "moe": {"presets": ["deepseek-v3", "qwen3-235b-a22b"], "tokens": [4096, 8192], **moe}}
    return parse_sweep(data, "t.yaml")


def test_moe_section_expands_into_points():
    sw = _sweep(routing=["uniform", "zipf:1.2"], experts_per_rank=[None, 16])
    pts = expand(sw, backend="sim", fabric="host")
    assert len(pts) == 2 * 2 * 2 * 2 * 2 * 2
    p = [p for p in pts if p.moe == "deepseek-v3" and p.M == 8192 and p.experts == 16][0]
    assert (p.N, p.K, p.tokens) == (2048, 7168, 8192)
    assert moe_shape(p).E_loc == 16 and moe_shape(p.replace(experts=None)).E_loc == 32
    assert {p.policy for p in pts if p.impl == "kosmos"} == {"self"}


@pytest.mark.parametrize("data,msg", [
    ({"op": "ag-gemm", "shapes": [{"M": 8, "N": 8, "K": 8}], "moe": {"presets": ["tiny"], "tokens": [8]}},
     "belongs to op moe"),
    ({"op": "moe"}, "takes its layers from a moe: section"),
    ({"op": "moe", "moe": {"presets": ["gpt-9"], "tokens": [8]}}, "moe.presets"),
    ({"op": "moe", "moe": {"presets": ["tiny"], "tokens": [8], "routing": ["zipf"]}}, "moe.routing"),
    ({"op": "moe", "moe": {"presets": ["tiny"], "tokens": [8], "experts_per_rank": [0]}}, "experts_per_rank"),
    ({"op": "moe", "moe": {"presets": ["tiny"]}}, "expected a mapping with presets, tokens"),
    ({"op": "moe", "shapes": [{"M": 8, "N": 8, "K": 8}], "moe": {"presets": ["tiny"], "tokens": [8]}},
     "moe: section only"),
])
def test_moe_section_errors_are_one_line(data, msg):
    with pytest.raises(SpecError, match=msg):
        parse_sweep(data, "t.yaml")


def test_shipped_moe_sweeps_parse():
    from kosmos_bench.spec import load_sweep

    for name in ("moe", "ablate/moe-policy", "ablate/moe-queue-order", "ablate/moe-skew"):
        sw = load_sweep(name)
        assert sw.op == "moe" and expand(sw, backend="sim", fabric="host")


# ----------------------------------------------------------------------------- the op
def test_op_counts_and_validation():
    op = get_op("moe")
    p = Point("moe", "torch-moe", world=8, fabric="host", moe="deepseek-v3", **preset_point_dims("deepseek-v3", 8192))
    s = moe_shape(p)
    assert (s.E, s.E_loc, s.topk, s.H) == (256, 32, 8, 7168)
    assert op.flops(p) == 8 * s.flops() and op.bound_flops(p) == s.flops()
    assert op.bound_flops(p.replace(fabric="local")) == 8 * s.flops()
    assert op.comm_bytes(p) == 8192 * 8 * 7168 * 2 and op.bus_factor(p) == 7 / 8
    assert op.validate(p) is None
    assert "needs a preset" in op.validate(p.replace(moe=None))
    assert "FFN width 2048" in op.validate(p.replace(N=1024))
    assert "bf16 only" in op.validate(p.replace(dtype="fp32"))
    assert "not divisible" in op.validate(p.replace(experts=3, world=1)) or op.validate(p.replace(experts=3, world=1))
    assert "zipf" in op.validate(p.replace(routing="zipf:x"))


def test_derive_gives_tokens_per_second_and_the_bound():
    op = get_op("moe")
    p = _pt(world=2)
    row = {"t_median_us": 100.0, "t_gemm_us": 50.0, "gemm_flops": op.bound_flops(p) / 2}
    d = op.derive(row, p)
    assert d["tokens_per_s"] == pytest.approx(2 * 32 / 100e-6)
    assert d["t_bound_us"] == pytest.approx(100.0) and d["frac_bound"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- harness + baselines
@pytest.mark.parametrize("preset,world,fabric", [("tiny", 1, "local"), ("tiny-grouped", 1, "host"),
                                                 ("tiny-grouped", 2, "local"), ("tiny", 4, "local"),
                                                 ("tiny-grouped", 4, "host"), ("tiny", 2, "host")])
def test_torch_moe_is_right_and_deterministic(preset, world, fabric):
    row, _ = harness.run_point(_pt(preset=preset, world=world, fabric=fabric), rank=0, procs=1)
    assert row["status"] == "ok", row.get("error")
    assert row["wrong"] == 0 and row["route_mismatches"] == 0 and row["deterministic"]
    assert row["tokens_per_s"] > 0 and row["frac_bound"] > 0 and row["gemm_flops"] > 0
    assert row["tok_per_expert_max"] >= row["tok_per_expert_mean"] > 0
    assert (row["dispatch_bytes"] > 0) == (world > 1)


def test_host_dispatch_bytes_are_the_views():
    p = _pt(preset="tiny-grouped", world=4, fabric="host")
    op = get_op("moe")
    inputs, st = op.setup(p, [0, 1, 2, 3], "cpu", 7)
    assert list(inputs.x) == [0]  # rank 0's share only; the peers are in the view
    b = inputs.host["view"].bytes_moved()
    assert st.columns["dispatch_bytes"] == b["dispatch"] and st.columns["combine_bytes"] == b["combine"]


class _Broken:
    """A torch-moe runner made wrong in one way: a route, an output element, or run to run."""

    def __init__(self, p, how):
        ctx = RankCtx(0, p.world, 1, torch.device("cpu"), p.fabric, "cpu")
        self.inner = get_impl("torch-moe").prepare(p, ctx, self._inputs(p))
        self.outputs, self.routes, self.how, self.calls = self.inner.outputs, self.inner.routes, how, 0

    def _inputs(self, p):
        self.inputs, self.state = get_op("moe").setup(p, list(range(p.world)), "cpu", 3)
        return self.inputs

    def run(self):
        self.inner.run()
        self.calls += 1
        if self.how == "route":  # token 0's last choice: the expert with the lowest key
            keys = mm.route(moe_shape(self.p), self.inputs.x[0], self.inputs.Wr, self.inputs.bias)[2]
            self.routes[0][0, -1] = int(keys[0].argmin())
        elif self.how == "unwritten":
            self.outputs[0][3, 5] = float("nan")
        elif self.how == "nondeterministic" and self.calls % 2:
            self.outputs[0][0, 0] += 0.001 * abs(float(self.outputs[0][0, 0])) + 1e-3

    def close(self):
        pass


@pytest.mark.parametrize("how", ["route", "unwritten", "nondeterministic"])
def test_the_check_catches(how):
    p = _pt(world=2)
    br = _Broken.__new__(_Broken)
    br.p = p
    br.__init__(p, how)
    ctx = RankCtx(0, p.world, 1, torch.device("cpu"), p.fabric, "cpu")
    wrong, err, same, extra = harness._check(br, p, ctx, br.inputs, br.state)
    if how == "route":
        assert extra["route_mismatches"] >= 1 and wrong >= 1
    elif how == "unwritten":
        assert wrong >= 1 and extra["route_mismatches"] == 0
    else:
        assert not same


def test_overlap_and_deepep_skip_with_reasons():
    ov = get_impl("torch-moe-overlap")
    assert "nothing to overlap at world 1" in ov.unsupported(_pt(impl="torch-moe-overlap"))
    assert "CUDA streams" in ov.unsupported(_pt(impl="torch-moe-overlap", world=2))
    assert "host and local" in ov.unsupported(_pt(impl="torch-moe-overlap", world=2, fabric="gloo"))
    assert "does not implement ag-gemm" in get_impl("torch-moe").unsupported(
        Point("ag-gemm", "torch-moe", 64, 64, 64, 1, fabric="local", backend="cpu"))


# ----------------------------------------------------------------------------- kosmos registration
def test_kosmos_moe_is_skipped_with_the_reason_when_the_kernel_module_is_absent(monkeypatch):
    real = kosmos_impl.importlib.import_module

    def no_moe(name, *a):
        if name.endswith("kosmos_moe"):
            raise ImportError("No module named 'kosmos_bench.impls.kosmos_moe'")
        return real(name, *a)

    monkeypatch.setattr(kosmos_impl.importlib, "import_module", no_moe)
    p = _pt(impl="kosmos", policy="self").replace(backend="gpu")
    assert "moe" in kosmos_impl.KosmosImpl.ops
    assert "not in this build" in kosmos_impl._moe_unsupported(p)


def test_kosmos_moe_dispatches_to_prepare_moe(monkeypatch):
    fake = types.ModuleType("kosmos_bench.impls.kosmos_moe")
    fake.prepare_moe = lambda point, ctx, inputs, **kw: ("runner", point.op, kw)
    fake.unsupported_moe = lambda point: "fake says no" if point.world > 4 else None
    monkeypatch.setitem(sys.modules, "kosmos_bench.impls.kosmos_moe", fake)
    p = _pt(impl="kosmos", policy="self")
    assert kosmos_impl._moe_unsupported(p) is None
    assert kosmos_impl._moe_unsupported(p.replace(world=8)) == "fake says no"
    assert kosmos_impl.KosmosImpl().prepare(p, None, None, timeout_s=3) == ("runner", "moe", {"timeout_s": 3})


# ----------------------------------------------------------------------------- report
def test_report_prints_moe_rows_under_their_columns(tmp_path, capsys):
    from kosmos_bench import report
    from kosmos_bench.store import RunStore

    store = RunStore.create(tmp_path)
    for impl, t in (("torch-moe", 200.0), ("torch-moe-compiled", 100.0)):
        p = _pt(impl=impl)
        row, _ = harness.run_point(p, rank=0, procs=1) if impl == "torch-moe" else ({**harness.base_row(p)}, None)
        row.update(status="ok", t_median_us=t, wrong=0, run_id=store.run_id)
        store.write_row(harness.derive(row, p))
    assert report.report([store.root]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "tok/exp max/mean" in out
    assert "torch-moe-compiled" in out and "2.00x" in out  # speedup vs torch-moe
