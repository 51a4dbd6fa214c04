import os

import pandas as pd

from kosmos_bench.point import Point
from kosmos_bench.store import RESULT_COLUMNS, RunStore, git_info, load_rows, source_hash


def _row(p: Point, status="ok", **kw):
    return {**p.as_row(), "status": status, **kw}


def test_rows_roundtrip_and_schema(tmp_path):
    st = RunStore.create(tmp_path, "run")
    p = Point("ag-gemm", "nccl-seq", 96, 64, 40, 2, fabric="gloo", backend="cpu")
    st.write_row(_row(p, wrong=0, t_median_us=12.5, extra_col=3))
    df = st.rows()
    assert list(df.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    assert df.loc[0, "t_median_us"] == 12.5 and df.loc[0, "extra_col"] == 3 and df.loc[0, "run_id"] == "run"


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    st = RunStore.create(tmp_path, "run")
    p = Point("ag-gemm", "nccl-seq", 96, 64, 40, 2)

    def boom(self, path, **kw):
        with open(path, "wb") as f:
            f.write(b"PAR1 torn")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    try:
        st.write_row(_row(p))
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    assert not list(st.points_dir.glob("*.parquet"))  # nothing torn is visible
    assert not list(st.points_dir.glob(".*tmp"))  # and the temp file was removed
    assert st.rows().empty


def test_resume_skips_only_ok_points(tmp_path):
    st = RunStore.create(tmp_path, "run")
    pts = [Point("ag-gemm", "nccl-seq", 96, 64, 40 + i, 2) for i in range(4)]
    st.write_row(_row(pts[0]))
    st.write_row(_row(pts[1], "failed", error="boom"))
    st.write_row(_row(pts[2], "wrong", wrong=3))
    # a crash after this point: pts[3] never written. A fresh RunStore on the same dir resumes.
    again = RunStore(st.root)
    assert again.done_keys() == {pts[0].key()}
    # re-running a point replaces its row (one file per key)
    again.write_row(_row(pts[1]))
    df = load_rows(st.root)
    assert len(df) == 3 and set(df.loc[df.key == pts[1].key(), "status"]) == {"ok"}


def test_manifest_records_environment_and_history(tmp_path):
    st = RunStore.create(tmp_path, "run")
    st.write_manifest({"sweep": "x"})
    m = st.manifest()
    for k in ("torch", "git_sha", "git_dirty", "host", "command", "gpus", "nccl", "driver", "source_hash"):
        assert k in m
    st.write_manifest()
    assert len(st.manifest()["previous"]) == 1


def test_git_sha_override_for_copied_trees(tmp_path, monkeypatch):
    monkeypatch.setenv("KOSMOS_GIT_SHA", "0123abcd")
    st = RunStore.create(tmp_path, "run")
    st.write_manifest()
    m = st.manifest()
    assert m["git_sha"] == "0123abcd" and m["git_dirty"] is None and m["git_sha_from"] == "KOSMOS_GIT_SHA"
    monkeypatch.delenv("KOSMOS_GIT_SHA")
    assert git_info().get("git_sha_from") is None


def test_source_hash_names_the_code_not_the_checkout(tmp_path):
    """The same sources hash the same wherever they are; an edit, a new kernel file or a rename
    changes the hash; files that do not run (docs, results, caches) do not."""
    for root in (tmp_path / "a", tmp_path / "b"):
        (root / "kosmos_bench" / "sub").mkdir(parents=True)
        (root / "csrc" / "kosmos").mkdir(parents=True)
        (root / "kosmos_bench" / "sub" / "x.py").write_text("X = 1\n")
        (root / "csrc" / "kosmos" / "k.cuh").write_text("// kernel\n")
    a, b = tmp_path / "a", tmp_path / "b"
    h = source_hash(a)
    assert h == source_hash(b) and len(h) == 12 and source_hash(tmp_path / "none") is None
    (a / "README.md").write_text("docs")
    (a / "kosmos_bench" / "sub" / "__pycache__").mkdir()
    (a / "kosmos_bench" / "sub" / "__pycache__" / "x.py").write_text("cache")
    assert source_hash(a) == h
    (a / "csrc" / "kosmos" / "k.cuh").write_text("// kernel, edited\n")
    assert source_hash(a) != h
    (b / "csrc" / "kosmos" / "k.cuh").rename(b / "csrc" / "kosmos" / "k2.cuh")
    assert source_hash(b) not in (h, source_hash(a))
    assert source_hash() is not None  # this checkout


def test_create_never_reuses_a_directory(tmp_path):
    a = RunStore.create(tmp_path, "same")
    b = RunStore.create(tmp_path, "same")
    assert a.root != b.root and os.path.isdir(b.root)
