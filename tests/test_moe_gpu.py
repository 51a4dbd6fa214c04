"""op moe on a GPU: the torch baselines are right (wrong == 0, bitwise deterministic) on the
real presets at world 1 and on the local / host fabrics. Skipped without a CUDA GPU."""
import pytest

from kosmos_bench import harness
from kosmos_bench.ops.moe import preset_point_dims
from kosmos_bench.point import Point

pytestmark = pytest.mark.gpu


def _run(impl, preset, T, world, fabric, routing="uniform"):
    p = Point("moe", impl, world=world, fabric=fabric, backend="gpu", moe=preset, routing=routing,
              warmup=1, reps=3, **preset_point_dims(preset, T))
    row, _ = harness.run_point(p, rank=0, procs=1)
    assert row["status"] == "ok" and row["wrong"] == 0 and row["deterministic"], \
        (impl, preset, T, world, fabric, row.get("error"), row.get("max_rel_err"))
    assert 0 < row["frac_bound"] < 1.5 and row["tokens_per_s"] > 0
    return row


@pytest.mark.parametrize("preset", ["deepseek-v3", "qwen3-235b-a22b"])
def test_world1_presets(preset):  # torch-moe-compiled: in sweeps (a compile per point is slow here)
    _run("torch-moe", preset, 2048, 1, "nvlink", routing="zipf:1.2")


@pytest.mark.parametrize("impl", ["torch-moe", "torch-moe-overlap"])
@pytest.mark.parametrize("fabric,world", [("local", 2), ("host", 8)])
def test_multi_rank_fabrics(impl, fabric, world):
    row = _run(impl, "qwen3-235b-a22b", 1024, world, fabric, routing="zipf:1.2")
    assert row["dispatch_bytes"] > 0
    if fabric == "host":
        assert row["t_comm_us"] > 0  # the host view's copies alone
