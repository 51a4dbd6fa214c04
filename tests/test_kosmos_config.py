"""The KOSMOS configuration (kosmos_bench/kosmos/): fields, parsing, the regime table, the
point keys of default points, knobs as sweep keys / variant names, the knobs page, and one
planning function whose simulated defaults are those of before the refactor. CPU only."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kosmos_bench import schedule as S
from kosmos_bench.kosmos import config as C
from kosmos_bench.kosmos.config import KosmosConfig, resolve
from kosmos_bench.point import Point
from kosmos_bench.spec import SpecError, expand, parse_sweep

ROOT = Path(__file__).resolve().parent.parent


def test_resolve_defaults_regimes_and_explicit_fields():
    """One decision for the GPU runner and the simulator: 70b FC1 (link-bound) 3 K-slices, 8-band
    groups, no ramp; 405b FC1 (compute) 2 K-slices, the schedule's groups; QKV (copy-bound) 4
    slices, per-peer copies, 1-band groups; explicit fields win; no K-streaming without the sm90
    builder; bad values are one-line errors naming the field."""
    d = KosmosConfig()
    fc1 = resolve(d, 7168, 132, True, True)  # 70b FC1: link-bound
    assert (fc1.k_stream, fc1.regime, fc1.slices, fc1.merge, fc1.band_group, fc1.tail_bands, fc1.ramp) == \
        (True, "link-bound", C.LINK_BOUND_SLICES, False, C.LINK_BOUND_GROUP, None, False)
    big = resolve(d, 13312, 132, True, True)  # 405b FC1: link and builders balanced
    assert (big.regime, big.slices, big.merge, big.band_group, big.ramp, big.halve) == \
        ("compute", C.DEFAULT_CE_SLICES, False, None, None, True)  # ramp: the schedule's ramp_needed
    mine = resolve(d.replace(band_group=11, band_ramp=True, ce_slices=2), 7168, 132, True, True)
    assert (mine.band_group, mine.ramp, mine.slices) == (11, True, 2)  # explicit settings win
    qkv = resolve(d, 1280, 132, True, True)
    assert (qkv.regime, qkv.slices, qkv.merge, qkv.band_group) == ("copy-bound", C.COPY_BOUND_SLICES, True, 1)
    # the last group: a K-slice of its bands on the link >= a slice of a tile on a CTA (H200: 3 bands)
    assert qkv.tail_bands == C.copy_bound_tail_bands(1280, 132) == 3
    assert C.copy_bound_tail_bands(1280, 6) == 1  # at most one wave of tiles
    mine = resolve(d.replace(ce_slices=2, ce_merge=False, band_group="peer", tail_bands=2), 1280, 132, True, True)
    assert (mine.regime, mine.slices, mine.merge, mine.band_group, mine.tail_bands) == \
        ("copy-bound", 2, False, S.PEER_GROUPS, 2)
    assert resolve(d.replace(ce_slices="3,1"), 1280, 132, True, True).split == (3, 1)
    mma = resolve(d, 1280, 132, False, True)
    assert (mma.k_stream, mma.regime, mma.merge, mma.band_group) == (False, "", False, None)
    flat = resolve(d.replace(band_ramp=False, band_halve=False), 7168, 132, True, True)
    assert (flat.ramp, flat.halve) == (False, False)
    assert resolve(d.replace(local_group=8), 7168, 132, True, True).local_group == 8
    for name, bad in (("band_group", "x"), ("band_group", -2), ("tail_bands", -1), ("band_ramp", 2),
                      ("band_halve", "maybe"), ("ce_slices", 0), ("ce_slices", "3,0"), ("local_group", -1),
                      ("max_inflight", -1), ("spin_ns", 2_000_000), ("ahead_blocks", -2), ("mover", "dma"),
                      ("gemm_kernel", "cublas"), ("policy", "fixed:0"), ("queue_order", "lifo")):
        with pytest.raises(ValueError, match=f"^{name}=") as e:
            KosmosConfig(**{name: bad})
        assert "\n" not in str(e.value) and "expected" in str(e.value)


def test_parse_set_and_strings():
    assert C.parse_set(["ce_slices=3", "band_ramp=off", "band_group=peer", "max_inflight=0", "ce_merge=on"]) == \
        {"ce_slices": 3, "band_ramp": False, "band_group": "peer", "max_inflight": 0, "ce_merge": True}
    assert C.parse_set(["ce_slices=1,2"]) == {"ce_slices": "1,2"}
    assert C.parse_set(["band_ramp=auto"]) == {"band_ramp": None}
    for bad in (["ce_slice=3"], ["ce_slices"], ["band_ramp=sometimes"]):
        with pytest.raises(ValueError):
            C.parse_set(bad)


# Keys of default points as main computed them before the configuration existed (2026-12-04):
# a point at the default configuration keeps its key (results/ and --resume stay valid).
OLD_KEYS = [
    (dict(M=8192, N=57344, K=8192, world=8, fabric="host", mover="ce", builder="sm90", profile="h200-host-pcie"),
     "9b2b3db524c7a527"),
    (dict(M=4096, N=8192, K=4096, world=8, fabric="host", profile="h200-host-pcie"), "5de14bbb996d4e49"),
    (dict(M=4096, N=8192, K=4096, world=8, fabric="nvlink", profile="h200-nvlink-x8-wgmma", builder="sm90"),
     "a3b059978a8c2571"),
    (dict(op="gemm-rs", M=4096, N=8192, K=4096, world=8, fabric="nvlink", profile="h200-nvlink-x8",
          local_first=False), "f76798982115807f"),
    (dict(M=4096, N=8192, K=4096, world=8, fabric="host", profile="h200-host-pcie", policy="fixed:8"),
     "6be29f5a26635bdf"),
]


def _pt(**kw):
    d = dict(op="ag-gemm", impl="kosmos", dtype="bf16", backend="sim", policy="self", queue_order="demand",
             local_first=True, chunk=1)
    d.update(kw)
    return Point(**d)


@pytest.mark.parametrize("kw,key", OLD_KEYS)
def test_default_points_keep_their_keys(kw, key):
    p = _pt(**kw)
    assert p.key() == key
    assert p.replace(knobs=(("ce_slices", None), ("spin_ns", 32))).key() == key  # defaults are no knobs
    varied = p.replace(knobs=(("ce_slices", 3),))
    assert varied.key() != key and varied.variant.endswith(",ce_slices=3]")


def test_knobs_normalized_in_variant_and_row():
    p = _pt(M=96, N=64, K=40, world=2, mover="ce", builder="sm90",
            knobs=(("band_ramp", "off"), ("ce_slices", "3"), ("band_halve", True)))
    assert p.knobs == (("band_ramp", False), ("ce_slices", 3))
    assert p.variant == "kosmos[self,sm90,ce-mover,band_ramp=off,ce_slices=3]"
    row = p.as_row()
    assert row["knobs"] == "band_ramp=off;ce_slices=3"
    assert Point(**{k: row[k] for k in (f.name for f in dataclasses.fields(Point))}).key() == p.key()
    assert KosmosConfig.from_point(p).replace(band_ramp=None, ce_slices=None).knobs() == ()
    with pytest.raises(ValueError, match="policy"):  # a Point field is not a knob
        p.replace(knobs=(("policy", "self"),))


def test_sweep_kosmos_section_takes_every_field():
    data = {"op": "ag-gemm", "impls": ["kosmos", "nccl-seq"], "world": [2], "shapes": [{"M": 96, "N": 64, "K": 40}],
            "kosmos": {"builder": ["sm90"], "mover": ["ce"], "ce_slices": [2, 3], "band_ramp": ["off"]}}
    pts = expand(parse_sweep(data, "k.yaml"), backend="sim", fabric="host")
    kos = [p for p in pts if p.impl == "kosmos"]
    assert len(kos) == 2 and len({p.key() for p in kos}) == 2
    assert {p.variant for p in kos} == {"kosmos[self,sm90,ce-mover,band_ramp=off,ce_slices=2]",
                                        "kosmos[self,sm90,ce-mover,band_ramp=off,ce_slices=3]"}
    assert [p.knobs for p in pts if p.impl == "nccl-seq"] == [()]
    setp = expand(parse_sweep(data, "k.yaml"), backend="sim", fabric="host", settings={"ce_slices": 4})
    assert {p.variant for p in setp if p.impl == "kosmos"} == {"kosmos[self,sm90,ce-mover,band_ramp=off,ce_slices=4]"}
    for bad, needle in (({"ce_slices": [0]}, "kosmos.ce_slices: 0 is not one of"),
                        ({"band_group": ["x"]}, "kosmos.band_group: 'x' is not one of"),
                        ({"ce_slicez": [2]}, "kosmos: unknown key(s) ce_slicez")):
        with pytest.raises(SpecError) as e:
            parse_sweep(dict(data, kosmos=bad), "k.yaml")
        assert str(e.value).startswith("k.yaml: ") and needle in str(e.value)


def test_every_kept_field_is_used_by_an_ablation_sweep():
    used = set()
    for f in sorted((ROOT / "sweeps" / "ablate").glob("*.yaml")):
        used |= set((yaml.safe_load(f.read_text()).get("kosmos") or {}))
    missing = set(C.KNOB_FIELDS) - used
    assert not missing, f"configuration fields no sweeps/ablate/*.yaml varies: {sorted(missing)}"


def test_knobs_page_is_current():
    page = ROOT / "docs" / "knobs.md"
    assert page.read_text() == C.knobs_markdown(), \
        "docs/knobs.md is stale: python3 -m kosmos_bench.kosmos.config > docs/knobs.md"
    for name in C.FIELDS:
        assert f"| `{name}` |" in page.read_text()


# Simulated t_median_us of default points on main before the refactor (2026-12-04): the plan
# (kosmos/plan.py) and the shared decide() change no simulated time. Since issue 30 the
# defaults of three of them changed (SIM_NOW); what they ran before is pinned here explicitly:
# mover sm (auto is ce on the host fabric with the sm90 builder) and max_inflight 0 (nvlink
# is capped now).
SIM_BEFORE = [
    (OLD_KEYS[0][0], 2193.584974038518),
    (dict(M=8192, N=10240, K=8192, world=8, fabric="host", mover="ce", builder="sm90", profile="h200-host-pcie"),
     2188.7092396197977),
    (dict(OLD_KEYS[1][0], mover="sm"), 655.0906922266082),
    (dict(OLD_KEYS[2][0], knobs=(("max_inflight", 0),)), 128.0047265123226),
    (dict(OLD_KEYS[3][0], builder="mma", knobs=(("max_inflight", 0),)), 345.3161675835276),
    (OLD_KEYS[4][0], 658.9906922266083),
]
# The same default points since issue 30: host ag-gemm runs copy-engine movers (mover auto),
# nvlink is capped at the WGs that saturate the link (24 sm90 loader warpgroups; 36 gemm-rs
# tile movers on the duplex link). The small nvlink ag-gemm point is link-bound with few
# items: the cap's last round of movers leaves the link part-idle (12% slower than uncapped);
# the main job's shapes gain (tests/test_sim_point.py::test_self_keeps_up_with_predicted).
SIM_NOW = [
    (OLD_KEYS[1][0], 571.2216107189897, "ce", 0),
    (OLD_KEYS[2][0], 143.12440651232262, "sm", 24),
    (dict(OLD_KEYS[3][0], builder="mma"), 261.2984718570317, "sm", 36),
    # gemm-rs's default builder is sm90 since its kernel ran on the H200 (kosmos.builder.AUTO_OPS)
    (OLD_KEYS[3][0], 195.54949799171706, "sm", 72),
]


@pytest.mark.parametrize("kw,t_us", SIM_BEFORE)
def test_simulated_defaults_unchanged(kw, t_us):
    from kosmos_bench import harness

    row, _ = harness.run_sim_point(_pt(**kw))
    assert row["status"] == "ok", row.get("error")
    tol = 1e-9 * t_us
    assert abs(row["t_median_us"] - t_us) <= tol


@pytest.mark.parametrize("kw,t_us,mover,cap", SIM_NOW)
def test_simulated_defaults_now(kw, t_us, mover, cap):
    from kosmos_bench import harness

    row, _ = harness.run_sim_point(_pt(**kw))
    assert row["status"] == "ok", row.get("error")
    assert (row["mover"], row["max_inflight_movers"]) == (mover, cap)
    assert abs(row["t_median_us"] - t_us) <= 1e-9 * t_us


def test_sim_rows_record_the_resolved_configuration():
    from kosmos_bench import harness

    row, _ = harness.run_sim_point(_pt(**OLD_KEYS[0][0]))
    assert (row["ce_regime"], row["ce_slices"], row["band_group"], row["band_ramp"]) == \
        ("link-bound", C.LINK_BOUND_SLICES, C.LINK_BOUND_GROUP, 0)
    row, _ = harness.run_sim_point(_pt(**OLD_KEYS[0][0], knobs=(("ce_slices", 2), ("band_group", 4))))
    assert (row["ce_slices"], row["band_group"], row["knobs"]) == (2, 4, "band_group=4;ce_slices=2")
    assert row["variant"] == "kosmos[self,sm90,ce-mover,band_group=4,ce_slices=2]"


def test_sweep_varying_a_knob_distinct_keys_resume_and_report(tmp_path):
    """A sim sweep that varies ce_slices: one key per value, the resolved value in each row,
    --resume runs nothing again (and only a new value when the grid grows), report names the
    value in the variant; --set narrows the grid; a bad --set is a one-line usage error."""
    import subprocess
    import sys

    from kosmos_bench.store import load_rows

    def kb(*args):
        return subprocess.run([sys.executable, "-m", "kosmos_bench.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=300)

    spec = tmp_path / "knob.yaml"
    text = """op: ag-gemm
impls: [kosmos]
world: [8]
fabric: host
shapes: [{M: 2048, N: 8192, K: 1024}]
kosmos: {builder: [sm90], mover: [ce], ce_slices: %s}
timing: {warmup: 1, reps: 2}
"""
    spec.write_text(text % "[2, 3]")
    out = tmp_path / "res"
    r = kb("sweep", spec, "--backend", "sim", "-o", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    df = load_rows(run)
    assert len(df) == 2 and df.key.nunique() == 2 and set(df.status) == {"ok"}
    assert sorted(df.ce_slices) == [2, 3] and sorted(df.knobs) == ["ce_slices=2", "ce_slices=3"]
    r = kb("sweep", spec, "--backend", "sim", "--resume", run)
    assert r.returncode == 0 and "2 points already ok, 0 to run" in r.stderr, r.stderr
    spec.write_text(text % "[2, 3, 4]")
    r = kb("sweep", spec, "--backend", "sim", "--resume", run)
    assert "2 points already ok, 1 to run" in r.stderr, r.stderr
    assert len(load_rows(run)) == 3
    r = kb("report", run)
    assert r.returncode == 0
    for n in (2, 3, 4):
        assert f"ce_slices={n}]" in r.stdout
    r = kb("sweep", spec, "--backend", "sim", "--dry-run", "--set", "ce_slices=3")
    assert r.returncode == 0 and "1 points" in r.stdout and "ce_slices=3" in r.stdout
    r = kb("sweep", spec, "--backend", "sim", "--dry-run", "--set", "ce_slices=zero")
    assert r.returncode == 2 and "ce_slices='zero': expected" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# sha1 (12 hex) of the GPU runner's plan per case, as main built it before the refactor
# (ce_settings + build_schedule + ce_plan.build/share_flags, 2026-12-04): the kernel arrays of
# every executed rank's schedule, its mover cap and groups, the copy-engine entries, aliases and
# flag counts, and whether the last group is K-streamed.
PLAN_BEFORE = ['6a6cd2ee5523', '143eb7cbdfa8', '20066a940faa', 'a3a31c8e2e0e', '382deeb4bd59', 'db6b37734ad6',
               'd8b0b7f5f3f5', 'bc55881bdcd3', 'f2f2b67bf75d', '9859f9255dee', '65badd5cbbf7', 'a9c7da31f121',
               'd74020abdd67', 'f8bd2671f0ba', '3034a0eac18f', 'ad7fea72c76f', 'da176e5658c1', '67dacd21bf05',
               'a5df37a10777', 'ec7147116764', '4ab16e81d320', 'a93b4a672918', '924b0e564429', '80999aa8b630',
               '1a64bf88f796', 'c424dd046ac2', '29921e28ab86', '8fb6157bdce0', 'f8a94ce8ef78', '2fff9ed4406b',
               'cad89dfe5a6e', '595d8e99c1ff', '5312acde7f49', '5c0c08b2d34f']


def _plan_cases():
    cases = []
    for M, N, K in [(8192, 57344, 8192), (8192, 106496, 16384), (8192, 10240, 8192), (16384, 57344, 8192),
                    (3000 * 8, 776 * 8, 1000)]:
        for builder in ("sm90", "mma"):
            for mover in ("ce", "sm"):
                for policy in ("self", "fixed:8"):
                    if mover == "ce" and policy != "self":
                        continue
                    cases.append(("host", 8, M, N, K, builder, mover, policy, {0: 132}))
    for fabric, W in (("local", 4), ("nvlink", 8)):
        for builder in ("sm90", "mma"):
            st = S.wg_starts(132, W)
            sizes = {r: int(st[r + 1] - st[r]) for r in range(W)} if fabric == "local" else {3: 132}
            cases.append((fabric, W, 3000 * W, 776 * W, 1000, builder, "sm", "self", sizes))
    return cases


def test_nvlink_plans_are_capped():
    """Since issue 30 the nvlink fabric caps self's movers at the WGs that saturate the link
    (schedule.MODEL_DEFAULTS["nvlink"]: 360 GB/s over 30 GB/s per 256-thread WG = 12 mma
    movers; an sm90 mover is the 128-thread loader warpgroup at half that rate: 24); local
    stays uncapped."""
    from kosmos_bench.kosmos.plan import plan

    for fabric, W, builder, want in (("nvlink", 8, "sm90", 24), ("nvlink", 8, "mma", 12), ("local", 4, "sm90", 0)):
        p = Point(op="ag-gemm", impl="kosmos", M=3000 * W, N=776 * W, K=1000, world=W, fabric=fabric, policy="self",
                  builder=builder, mover="sm")
        st = S.wg_starts(132, W)
        sizes = {r: int(st[r + 1] - st[r]) for r in range(W)} if fabric == "local" else {3: 132}
        caps = {s.max_inflight for s in plan(p, KosmosConfig.from_point(p), sizes, builder=builder).scheds.values()}
        assert caps == {want}, (fabric, builder, caps)


def test_runner_plans_of_default_points_unchanged():
    import hashlib
    import json

    from kosmos_bench.kosmos.plan import plan

    got = []
    for fabric, W, M, N, K, builder, mover, policy, sizes in _plan_cases():
        p = Point(op="ag-gemm", impl="kosmos", M=M, N=N, K=K, world=W, fabric=fabric, policy=policy, builder=builder,
                  mover=mover)
        cfg = KosmosConfig.from_point(p)
        if fabric == "nvlink":  # capped since issue 30 (test_nvlink_plans_are_capped): the rest is as before
            cfg = cfg.replace(max_inflight=0)
        pl = plan(p, cfg, sizes, builder=builder)
        arr = [{k: v.tolist() for k, v in s.arrays().items()} | {"max_inflight": s.max_inflight,
                                                                 "groups": s.meta["remote_groups"]}
               for s in pl.scheds.values()]
        ce = ([tuple(e.__dict__.values()) for e in pl.ce_shared], pl.ce_alias, pl.ce_flag_mult) if mover == "ce" \
            else None
        blob = json.dumps((arr, ce, pl.resolved.k_stream), sort_keys=True, default=str)
        got.append(hashlib.sha1(blob.encode()).hexdigest()[:12])
    assert got == PLAN_BEFORE
