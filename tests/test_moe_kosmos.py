"""CPU tests of the KOSMOS MoE kernel's plumbing (kernels/moe_sm90.py, impls/kosmos_moe.py); the
kernel itself runs in tests/test_moe_kosmos_gpu.py."""
from __future__ import annotations

import ctypes

import pytest
import torch

from kosmos_bench.impls import kosmos_moe
from kosmos_bench.kernels import libs, moe_sm90
from kosmos_bench.ops import moe_math as mm
from kosmos_bench.ops.moe import preset_point_dims
from kosmos_bench.point import Point


def test_args_layout_matches_the_c_struct():
    """Every field of the ctypes mirror at the C struct's offset (the library is built if needed)."""
    try:
        lib = moe_sm90.load()
    except libs.ToolchainMissing as e:
        pytest.skip(str(e))
    assert moe_sm90.layout_mismatches(lib) == []
    assert lib.kosmos_moe_smem_bytes() <= 227 * 1024
    assert lib.kosmos_moe_threads() == 384


def test_validate_reasons():
    try:
        lib = moe_sm90.load()
    except libs.ToolchainMissing as e:
        pytest.skip(str(e))
    assert lib.kosmos_moe_validate(8192, 7168, 2048, 2048, 32, 8, 8, 4) == b""
    assert b"256 experts" in lib.kosmos_moe_validate(64, 512, 256, 0, 512, 8, 1, 1)
    assert b"F and the shared F of 128" in lib.kosmos_moe_validate(64, 512, 192, 0, 16, 8, 1, 1)
    assert b"kept groups" in lib.kosmos_moe_validate(64, 512, 256, 0, 32, 8, 8, 1)


def test_unsupported_mirrors_the_kernel_limits():
    s = mm.preset("deepseek-v3", T=8192)
    assert kosmos_moe.unsupported(s, "world1") is None
    assert kosmos_moe.unsupported(mm.preset("deepseek-v3", T=1024, world=8), "local") is None
    assert "256" in kosmos_moe.unsupported(mm.preset("deepseek-v3", T=1024, world=16, E_loc=32), "local")
    assert "not implemented" in kosmos_moe.unsupported(mm.preset("qwen3-235b-a22b", T=64, world=8), "nvlink")
    assert "128" in kosmos_moe.unsupported(mm.MoeShape(T=64, H=512, F=192, E=8, topk=2), "world1")


@pytest.mark.parametrize("math,tile", [("joint", 256), ("pingpong", 128)])
def test_w1_arrangement_pairs_gate_and_up_columns(math, tile):
    """Columns c < tile/2 of every n-tile (the build's kBN: 256 joint, 128 ping-pong) are gate rows
    of h column n*tile/2 + c, columns tile/2 + c the up rows of the same h column: what the fused
    SwiGLU epilogue assumes."""
    assert moe_sm90.W1_TILE[math] == tile
    E, F, H = 2, 384, 8
    half = tile // 2
    W1 = torch.arange(E * 2 * F * H, dtype=torch.float32).reshape(E, 2 * F, H)
    t = kosmos_moe.arrange_w1(W1, math)
    assert t.shape == (E, H, 2 * F)
    for n in range(F // half):
        for c in (0, 5, half - 1):
            assert torch.equal(t[:, :, n * tile + c], W1[:, n * half + c, :])
            assert torch.equal(t[:, :, n * tile + half + c], W1[:, F + n * half + c, :])
    assert torch.equal(t.transpose(-1, -2).sort(dim=1).values, W1.sort(dim=1).values)  # a permutation of the rows
    assert torch.equal(kosmos_moe.arrange_w1(W1), kosmos_moe.arrange_w1(W1, "joint"))


def test_runner_settings_come_from_the_points_configuration():
    """A point's --set / sweep keys reach the MoE runners (prepare_moe / prepare_moe_bwd get no
    config from the harness); a caller's explicit keyword wins."""
    p = Point("moe", "kosmos", world=1, backend="gpu", moe="qwen3-235b-a22b", routing="uniform", policy="self",
              queue_order="fifo", knobs="math_wgs=pingpong;spin_ns=0", **preset_point_dims("qwen3-235b-a22b", 512))
    s = kosmos_moe.runner_settings(None, {}, p)
    assert (s["math"], s["queue_order"], s["spin_ns"], s["mover"]) == ("pingpong", "fifo", 0, None)
    assert kosmos_moe.runner_settings(None, {"math": "joint", "mover": "sm"}, p)["math"] == "joint"
    d = kosmos_moe.runner_settings(None, {}, None)
    assert (d["math"], d["queue_order"], d["spin_ns"]) == ("joint", "demand", 32)
    assert p.variant == "kosmos[self,fifo,math_wgs=pingpong,spin_ns=0]"
    assert p.key() != p.replace(knobs="spin_ns=0").key()  # the schedule is part of the point's key


def test_counter_names_for_the_watchdog():
    T, k, E = 1000, 8, 16
    tm = moe_sm90.tiles_max(T, k, E)
    assert tm == -(-T * k // 128) + E
    assert moe_sm90.counter_name(-1, T, k, E) == "scan flag"
    assert moe_sm90.counter_name(1, T, k, E) == "counter routed"
    assert moe_sm90.counter_name(moe_sm90.CTR_HEAD + 3, T, k, E) == "arrived[3]"
    assert moe_sm90.counter_name(moe_sm90.CTR_HEAD + tm + 2, T, k, E) == "up_done[2]"
    assert moe_sm90.counter_name(moe_sm90.CTR_HEAD + 3 * tm, T, k, E) == "shared_up_done[0]"
    assert moe_sm90.counter_name(moe_sm90.CTR_HEAD + 3 * tm + 2 * 8 + 5, T, k, E) == "combined[5]"
    assert moe_sm90.counter_name(-2, T, k, E) == "copy-engine flag"
    assert moe_sm90.counter_name(moe_sm90.CTR_HEAD + 3 * tm + 2 * 8 + E + 1, T, k, E) == "down_group_done[1]"
    assert moe_sm90.ctr_words(T, k, E) == moe_sm90.CTR_HEAD + 3 * tm + 2 * 8 + E + moe_sm90.FOLD_GROUPS + 1


def test_constants_mirror_moe_params_h():
    """The Python mirror's constants are moe_params.h's (FOLD_GROUPS sizes the counters)."""
    import re
    from pathlib import Path

    h = (Path(__file__).resolve().parents[1] / "csrc" / "kosmos" / "moe_params.h").read_text()
    define = lambda name: int(re.search(rf"#define {name} (\d+)", h).group(1))  # noqa: E731
    assert define("KOSMOS_MOE_ABI_VERSION") == moe_sm90.ABI_VERSION
    assert define("KOSMOS_MOE_MAX_E") == moe_sm90.MAX_E
    assert define("KOSMOS_MOE_MAX_TOPK") == moe_sm90.MAX_TOPK
    assert define("KOSMOS_MOE_TOK_BLOCK") == moe_sm90.TOK_BLOCK
    assert define("KOSMOS_MOE_FOLD_GROUPS") == moe_sm90.FOLD_GROUPS


def test_args_struct_has_no_padding():
    sizes = sum(ctypes.sizeof(t) for _, t in moe_sm90.MoeArgs._fields_)
    assert sizes == ctypes.sizeof(moe_sm90.MoeArgs)


@pytest.mark.parametrize("op", ["moe", "moe-bwd", "moe-step"])
def test_policies_other_than_self_are_skipped_with_the_reason(op):
    """The MoE kernels self-schedule only: a fixed / predicted point is a skipped row that says
    so, never the self kernel timed under another policy's key."""
    from kosmos_bench.impls.kosmos import KosmosImpl
    from kosmos_bench.spec import expand, parse_sweep

    data = {"op": op, "impls": ["kosmos"], "world": [8], "moe": {"presets": ["deepseek-v3"], "tokens": [2048]},
            "kosmos": {"policy": ["self", "fixed:4", "predicted"]}}
    pts = expand(parse_sweep(data, "t", "t"), backend="gpu", fabric="host")
    why = {p.policy: KosmosImpl().unsupported(p) for p in pts}
    assert why["self"] is None or "self-schedule" not in why["self"]
    for pol in ("fixed:4", "predicted"):
        assert f"self-schedule only (policy {pol}" in why[pol]


def test_peer_inverse_table_names_every_expert_row_once():
    """The host view's peer tables (moe_params.h peer_inv / peer_first): expert e's k-th peer row
    (peers in order, each peer's rows of e in its order) is peer row peer_inv[peer_first[e] + k],
    a permutation of the peer rows; GATHER and COMBINE_TILE read rows by it."""
    from types import SimpleNamespace

    s = mm.MoeShape(T=64, H=128, F=128, E=16, topk=2, world=4)
    g = torch.Generator().manual_seed(3)
    meta = {p: torch.sort(torch.randint(0, s.E_loc, (n,), generator=g)).values for p, n in ((1, 9), (2, 0), (3, 14))}
    view = SimpleNamespace(peers=[1, 2, 3], routes0=torch.zeros(1, 2), slot0=torch.zeros(1, 2),
                           recv_meta={p: torch.stack([m, m, m], 1).to(torch.int32) for p, m in meta.items()})
    t = kosmos_moe.MoeRunner._peer_tables(view, s, "cpu")
    inv, first, total = t["inv"].long(), t["first"].long(), t["total"].long()
    assert sorted(inv.tolist()) == list(range(t["rows"])) and t["rows"] == 23
    expert = torch.cat([meta[1], meta[2], meta[3]])
    for e in range(s.E_loc):
        rows = inv[first[e]:first[e] + total[e]]
        assert bool((expert[rows] == e).all()) and rows.tolist() == sorted(rows.tolist())  # peers in order


def test_mover_choice_and_its_reasons():
    assert kosmos_moe.moe_mover(None, "host", 8) == "ce" and kosmos_moe.moe_mover(None, "local", 8) == "sm"
    assert kosmos_moe.moe_mover(None, "host", 1) == "sm" and kosmos_moe.moe_mover("sm", "host", 8) == "sm"
    s = mm.preset("qwen3-235b-a22b", T=256, world=8)
    assert kosmos_moe.unsupported(s, "host", "ce") is None
    assert "host-fabric only" in kosmos_moe.unsupported(s, "local", "ce")
    from kosmos_bench.impls.kosmos import KosmosImpl
    from kosmos_bench.point import Point

    p = Point(op="moe-bwd", impl="kosmos", M=256, N=4096, K=1536, world=8, fabric="host", policy="self", mover="ce",
              moe="qwen3-235b-a22b", routing="uniform", tokens=256)
    assert "SM movers only" in KosmosImpl().unsupported(p)
