import pytest

from kosmos_bench.models import MODELS, layer_shape
from kosmos_bench.point import Point, parse_policy
from kosmos_bench.spec import SpecError, expand, load_sweep, parse_sweep

GOOD = {
    "op": "ag-gemm",
    "impls": ["kosmos", "nccl-seq"],
    "world": [2, 4],
    "shapes": [{"M": 96, "N": 64, "K": 40}],
    "models": {"names": ["llama3-8b"], "tokens": [4096]},
    "kosmos": {"policy": ["self", "fixed:2"], "queue_order": ["demand", "fifo"]},
}


def test_grid_expansion_counts_and_knobs():
    sw = parse_sweep(GOOD, "good.yaml")
    # shapes: 1 explicit + llama3-8b qkv,fc1 (ag-gemm layers by default) = 3
    assert len(sw.shapes) == 3
    pts = expand(sw, backend="gpu", fabric="host")
    per_shape_world = 2 * 2 + 1  # kosmos: policy x queue order; nccl-seq: one point
    assert len(pts) == 3 * 2 * per_shape_world
    seq = [p for p in pts if p.impl == "nccl-seq"]
    assert all(p.policy is None and p.queue_order is None for p in seq)
    assert {p.variant for p in pts if p.impl == "kosmos"} == {
        "kosmos[self]", "kosmos[fixed:2]", "kosmos[self,fifo]", "kosmos[fixed:2,fifo]"}


def test_model_shapes_are_derived():
    sw = parse_sweep(GOOD, "good.yaml")
    m = [s for s in sw.shapes if s.model == "llama3-8b" and s.layer == "fc1"][0]
    assert (m.M, m.N, m.K) == (4096, 2 * 14336, 4096)
    assert layer_shape(MODELS["llama3-70b"], "qkv", 8192) == (8192, (64 + 16) * 128, 8192)
    assert layer_shape(MODELS["gpt3-175b"], "fc1", 1024) == (1024, 49152, 12288)  # not gated


def test_keys_stable_and_distinct():
    a = Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="self")
    b = Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="self", model="x", trace=True)
    c = Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="fixed:1")
    assert a.key() == b.key()  # bookkeeping fields do not change identity
    assert a.key() != c.key()
    assert a.key() == Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="self").key()
    assert len(a.key()) == 16


def test_concurrent_timing_switch():
    """timing.concurrent (default on) reaches every point; the CLI's --no-concurrent wins; it
    is bookkeeping, not identity (the op measured is the same)."""
    data = dict(GOOD)
    on = expand(parse_sweep(data, "c.yaml"), backend="gpu", fabric="host")
    off = expand(parse_sweep(dict(data, timing={"reps": 3, "concurrent": False}), "c.yaml"), backend="gpu", fabric="host")
    assert all(p.concurrent for p in on) and not any(p.concurrent for p in off)
    assert not any(p.concurrent for p in expand(parse_sweep(data, "c.yaml"), backend="gpu", fabric="host",
                                                concurrent=False))
    assert [p.key() for p in on] == [p.key() for p in expand(parse_sweep(data, "c.yaml"), backend="gpu", fabric="host",
                                                               concurrent=False)]


def test_duplicate_shapes_measured_once():
    data = dict(GOOD, shapes=[{"M": 96, "N": 64, "K": 40}, {"M": 96, "N": 64, "K": 40}], models=None)
    data.pop("models")
    pts = expand(parse_sweep(data, "d.yaml"), backend="gpu", fabric="host")
    assert len(pts) == len({p.key() for p in pts}) == 2 * 5


@pytest.mark.parametrize("patch,needle", [
    ({"op": "all-reduce"}, "op: 'all-reduce' is not one of"),
    ({"world": [0]}, "world: expected positive integers"),
    ({"world": "eight"}, "world: expected positive integers"),
    ({"shapes": [{"M": 1, "N": 2}]}, "shapes[0]: expected a mapping with exactly M, N, K"),
    ({"dtype": ["fp8"]}, "dtype: 'fp8' is not one of"),
    ({"fabric": "pcie"}, "fabric: 'pcie' is not one of"),
    ({"kosmos": {"policy": ["fixed:0"]}}, "kosmos.policy:"),
    ({"kosmos": {"queue_order": ["lifo"]}}, "kosmos.queue_order: 'lifo'"),
    ({"models": {"names": ["gpt5"], "tokens": [1]}}, "models.names: 'gpt5' is not one of"),
    ({"models": {"names": ["llama3-8b"], "tokens": [1], "layers": ["fc2"]}}, "'fc2' is a gemm-rs layer"),
    ({"timing": {"reps": -1}}, "timing.reps"),
    ({"timing": {"concurrent": "yes"}}, "timing.concurrent: expected true/false"),
    ({"timing": {"repz": 3}}, "timing: expected a mapping with warmup, reps and/or concurrent"),
    ({"colour": "blue"}, "unknown key(s) colour"),
])
def test_malformed_specs_name_file_and_key(patch, needle):
    data = dict(GOOD, **patch)
    with pytest.raises(SpecError) as e:
        parse_sweep(data, "bad.yaml")
    assert str(e.value).startswith("bad.yaml: ")
    assert needle in str(e.value)


def test_missing_op_and_not_a_mapping():
    with pytest.raises(SpecError, match="op: missing"):
        parse_sweep({"world": [2]}, "x.yaml")
    with pytest.raises(SpecError, match="expected a mapping"):
        parse_sweep([1, 2], "x.yaml")


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("op: ag-gemm\nworld: [2\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML \(line"):
        load_sweep(str(f))
    with pytest.raises(SpecError, match="no such sweep file or sweep name"):
        load_sweep("does-not-exist")


def test_shipped_sweeps_load():
    for name in ("ag-gemm", "gemm-rs", "smoke", "gemm-rs-smoke"):
        sw = load_sweep(name)
        assert expand(sw, backend="sim", fabric="nvlink")


def test_parse_policy():
    assert parse_policy("self") == ("self", None)
    assert parse_policy("fixed:12") == ("fixed", 12)
    for bad in ("fixed", "fixed:x", "fixed:0", "random"):
        with pytest.raises(ValueError):
            parse_policy(bad)


def test_builder_knob_expands_and_keeps_old_keys():
    data = dict(GOOD, impls=["kosmos"], kosmos={"policy": ["self"], "builder": ["mma", "sm90"]})
    data.pop("models")
    pts = expand(parse_sweep(data, "b.yaml"), backend="gpu", fabric="host")
    assert {p.variant for p in pts} == {"kosmos[self]", "kosmos[self,sm90]"}
    assert len({p.key() for p in pts}) == len(pts)
    # points without the knob keep the key they had before it existed
    old = Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="self")
    assert "builder" not in old.config()
    with pytest.raises(SpecError, match="kosmos.builder: 'tensor' is not one of"):
        parse_sweep(dict(data, kosmos={"builder": ["tensor"]}), "b.yaml")


def test_mover_knob_expands_and_keeps_old_keys():
    data = dict(GOOD, impls=["kosmos"], kosmos={"policy": ["self"], "builder": ["sm90"], "mover": ["sm", "ce"]})
    data.pop("models")
    pts = expand(parse_sweep(data, "m.yaml"), backend="gpu", fabric="host")
    assert {p.variant for p in pts} == {"kosmos[self,sm90,sm-mover]", "kosmos[self,sm90,ce-mover]"}
    assert len({p.key() for p in pts}) == len(pts)
    old = Point("ag-gemm", "kosmos", 96, 64, 40, 2, policy="self")
    assert "mover" not in old.config() and old.key() == old.replace(mover=None).key()
    with pytest.raises(SpecError, match="kosmos.mover: 'dma' is not one of"):
        parse_sweep(dict(data, kosmos={"mover": ["dma"]}), "m.yaml")


def test_mover_ce_is_skipped_with_a_reason_where_it_does_not_apply():
    from kosmos_bench.impls.kosmos import KosmosImpl

    impl = KosmosImpl()
    base = Point("ag-gemm", "kosmos", 8192, 4096, 2048, 8, fabric="host", policy="self", mover="ce")
    assert impl.unsupported(base) is None
    assert "host-fabric only" in impl.unsupported(base.replace(fabric="local"))
    rs = base.replace(op="gemm-rs")
    assert impl.unsupported(rs) is None  # gemm-rs: copy-engine pushes and proxies (sm90 builder)
    assert "sm90 builder" in impl.unsupported(rs.replace(builder="mma"))
    assert "host-fabric only" in impl.unsupported(rs.replace(fabric="nvlink"))
    assert "role policies do not apply" in impl.unsupported(base.replace(policy="fixed:8"))
    assert "role policies do not apply" in impl.unsupported(rs.replace(policy="predicted"))


def test_default_sweeps_run_mover_auto_beside_sm_movers():
    """sweeps/ag-gemm.yaml and gemm-rs.yaml list mover [auto, sm]: on the host fabric both get
    kosmos[self] (auto: copy-engine movers with the sm90 builder) and kosmos[self,sm-mover];
    where auto can only be sm (nvlink, policies fixed / predicted) one point, with the
    key the default point always had (mover None); symm-mem and nccl-overlap are in the grid."""
    from kosmos_bench.spec import load_sweep

    for name in ("ag-gemm", "gemm-rs"):
        sw = load_sweep(name)
        assert {"nccl-overlap", "symm-mem"} <= set(sw.impls) and sw.kosmos["mover"] == [None, "sm"]
        for fabric in ("host", "nvlink"):
            pts = [p for p in expand(sw, backend="gpu", fabric=fabric) if p.impl == "kosmos"]
            per_shape = {}
            for p in pts:
                per_shape.setdefault((p.M, p.N, p.K), []).append(p.variant)
            two = fabric == "host"
            want = ["kosmos[self]"] + (["kosmos[self,sm-mover]"] if two else []) + ["kosmos[fixed:16]", "kosmos[predicted]"]
            assert all(v == want for v in per_shape.values()), (name, fabric, per_shape)
            for p in pts:
                if p.mover is None:  # the default point keeps its old key (no mover entry)
                    assert "mover" not in p.config()


def test_mover_auto_parses_and_resolves():
    from kosmos_bench.kosmos.builder import mover_choice
    from kosmos_bench.kosmos.config import KosmosConfig, coerce

    assert coerce("mover", "auto") is None and KosmosConfig().mover is None
    data = dict(GOOD, impls=["kosmos"], kosmos={"mover": ["auto", "sm", "ce"]})
    assert parse_sweep(data, "m.yaml").kosmos["mover"] == [None, "sm", "ce"]
    assert mover_choice(None, "ag-gemm", "host", "sm90") == "ce"
    assert mover_choice(None, "ag-gemm", "host", "sm90", "fixed:16") == "sm"
    assert mover_choice(None, "ag-gemm", "host", "mma") == "sm"
    assert mover_choice(None, "gemm-rs", "host", "sm90") == "ce"
    assert mover_choice(None, "ag-wgrad", "host", "sm90") == "ce"
    assert mover_choice(None, "gemm-rs", "host", "mma") == "sm"
    for fabric in ("nvlink", "local"):
        assert mover_choice(None, "ag-gemm", fabric, "sm90") == "sm"
    assert mover_choice("sm", "ag-gemm", "host", "sm90") == "sm"
    assert mover_choice("ce", "gemm-rs", "nvlink", "mma") == "ce"  # explicit: the runner refuses it, with the reason
    with pytest.raises(ValueError):
        mover_choice("dma", "ag-gemm", "host", "sm90")
