"""The NCCL-family baselines, on gloo with 2 and 3 ranks and awkward shapes (real processes)."""
import pytest

from kosmos_bench.point import Point
from kosmos_bench import launch


def _run(points):
    rows = {}
    launch.run_points(points, lambda p: None, lambda p, row, tr: rows.__setitem__(p.key(), row), timeout_s=120)
    return [rows[p.key()] for p in points]


@pytest.mark.parametrize("world", [2, 3])
def test_baselines_correct_on_gloo(world):
    pts = []
    for op, (M, N, K) in {"ag-gemm": (66 * world // 2 * 2, 14 * world, 37), "gemm-rs": (30 * world, 37, 13 * world)}.items():
        for impl in ("nccl-seq", "nccl-overlap"):
            pts.append(Point(op, impl, M, N, K, world, fabric="gloo", backend="cpu", warmup=1, reps=2))
    rows = _run(pts)
    for p, r in zip(pts, rows):
        assert r["status"] == "ok", (p.variant, p.op, r.get("error"))
        assert r["wrong"] == 0 and r["deterministic"] is True
        assert 0 <= r["max_rel_err"] < 0.05
        assert r["t_median_us"] > 0 and r["t_gemm_us"] > 0 and r["t_comm_us"] > 0
        assert r["collective"] == "gloo"


def test_non_dividing_shape_is_a_skipped_row():
    p = Point("gemm-rs", "nccl-seq", 30, 8, 13, 2, fabric="gloo", backend="cpu", warmup=1, reps=1)
    (r,) = _run([p])
    assert r["status"] == "skipped" and "K=13 is not divisible by world=2" in r["error"]
