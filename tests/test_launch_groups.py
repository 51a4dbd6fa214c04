"""Which points share worker processes: consecutive points with the same process needs share one
spawn; with isolate (sweep --isolate) every point gets its own."""
from kosmos_bench.point import Point
from kosmos_bench import launch


def _groups(points, **kw):
    seen = []
    orig = launch._run_group
    try:
        launch._run_group = lambda g, on_start, on_row, timeout_s: seen.append([p.impl for p in g])
        launch.run_points(points, lambda p: None, lambda p, r, t: None, 60.0, **kw)
    finally:
        launch._run_group = orig
    return seen


def _points():
    mk = lambda impl, world: Point("ag-gemm", impl, 64 * world, 16 * world, 32, world, fabric="gloo", backend="cpu")  # noqa: E731
    return [mk("nccl-seq", 2), mk("nccl-overlap", 2), mk("nccl-seq", 3), mk("nccl-overlap", 3)]


def test_consecutive_points_with_the_same_needs_share_a_spawn():
    assert _groups(_points()) == [["nccl-seq", "nccl-overlap"], ["nccl-seq", "nccl-overlap"]]


def test_isolate_gives_every_point_its_own_workers():
    assert _groups(_points(), isolate=True) == [["nccl-seq"], ["nccl-overlap"], ["nccl-seq"], ["nccl-overlap"]]
