"""Results store: a Parquet dataset under results/<run-id>/ plus manifest.json.

Layout (all writes atomic: tmp file + os.replace, so a killed sweep loses nothing that
finished and never leaves a torn file):

    results/<run-id>/manifest.json          environment + command line (see manifest())
    results/<run-id>/points/<key>.parquet   one row per point (RESULT_COLUMNS, plus extras)
    results/<run-id>/traces/<key>.parquet   role timeline of a traced point (TRACE_COLUMNS)
    results/<run-id>/profiles/...           external profiler outputs (torch, rocprofv3)

``compact`` folds a run's rows and manifest into one Parquet file (the manifest in the
file's metadata): ~50 KB for an 80-point sweep instead of ~2.7 MB of per-point files, which
is how small results are committed; ``report`` reads either form.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

# Status values of a row. 'wrong' means it ran but failed the correctness check.
STATUSES = ("ok", "wrong", "failed", "skipped", "timeout")

# Columns every row has (the Point's fields come first; see Point.as_row()).
RESULT_COLUMNS = [
    "key", "run_id", "op", "impl", "variant", "policy", "queue_order", "local_first", "chunk", "builder", "mover", "knobs",
    "fabric", "backend", "profile", "world", "dtype", "M", "N", "K", "model", "layer", "tokens",
    "status", "error",
    "wrong", "max_rel_err", "deterministic",
    "t_median_us", "t_min_us", "t_p99_us", "cv", "reps",
    "t_gemm_us", "t_comm_us", "t_concurrent_us", "overlap_efficiency", "eff_concurrent", "speedup_vs_seq",
    "sm_mhz", "sm_mhz_gemm", "sm_mhz_comm", "power_w", "power_w_gemm", "clock_limit", "clock_limit_gemm",
    "tflops", "algbw_gbs", "busbw_gbs", "flops", "comm_bytes",
    "collective", "emulated", "timestamp",
]
# Role timeline records, one row per (WG, role interval). Roles: MOVE, BUILD, REDUCE, WAIT.
TRACE_COLUMNS = ["key", "rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"]


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    _atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2, default=str)))


def write_frame(path: Path, df: pd.DataFrame) -> None:
    _atomic_write(Path(path), lambda tmp: df.to_parquet(tmp, index=False))


# Damaged files already warned about (a file is named once per process, however often it is read).
_WARNED: set[str] = set()


ROW_LEFT_OUT = "its row is left out (`sweep --resume` of the run measures that point again)"


def warn_damaged(path: Path | str, e: BaseException, what: str = ROW_LEFT_OUT) -> None:
    """One stderr line naming a file that cannot be read (a torn copy, a full disk): the rest
    of the run is still used; `sweep --resume` re-runs a point whose row file is damaged."""
    if str(path) in _WARNED:
        return
    _WARNED.add(str(path))
    msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    print(f"warning: {path}: unreadable ({type(e).__name__}: {msg}); {what}", file=sys.stderr, flush=True)


def _read_parquet(path: Path, what: str = ROW_LEFT_OUT) -> pd.DataFrame | None:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - any damage (truncated, not Parquet, unreadable) is the same to us
        warn_damaged(path, e, what)
        return None


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        warn_damaged(path, e, "its manifest is ignored")
        return {}
    return obj if isinstance(obj, dict) else {}


class RunStore:
    """One run directory. Rows are dicts; missing RESULT_COLUMNS are filled with None."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.run_id = self.root.name

    @classmethod
    def create(cls, base: Path | str = "results", run_id: str | None = None) -> "RunStore":
        run_id = run_id or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        root = Path(base) / run_id
        n = 1
        while root.exists():
            root = Path(base) / f"{run_id}-{n}"
            n += 1
        root.mkdir(parents=True)
        return cls(root)

    @property
    def points_dir(self) -> Path:
        return self.root / "points"

    @property
    def traces_dir(self) -> Path:
        return self.root / "traces"

    def write_row(self, row: dict) -> None:
        row = {c: row.get(c) for c in RESULT_COLUMNS} | {k: v for k, v in row.items() if k not in RESULT_COLUMNS}
        row["run_id"] = self.run_id
        write_frame(self.points_dir / f"{row['key']}.parquet", pd.DataFrame([row]))

    def write_trace(self, key: str, df: pd.DataFrame) -> Path:
        path = self.traces_dir / f"{key}.parquet"
        write_frame(path, df)
        return path

    def rows(self) -> pd.DataFrame:
        return load_rows(self.root)

    def done_keys(self) -> set[str]:
        """Keys of points that already succeeded (skipped by --resume)."""
        df = self.rows()
        if df.empty:
            return set()
        return set(df.loc[df["status"] == "ok", "key"])

    def write_manifest(self, extra: dict | None = None) -> None:
        m = manifest()
        if extra:
            m.update(extra)
        path = self.root / "manifest.json"
        if path.exists():  # a resumed run keeps its history of invocations
            old = _read_json(path)
            m["previous"] = old.get("previous", []) + [{k: old.get(k) for k in ("command", "time", "git_sha")}]
        write_json(path, m)

    def manifest(self) -> dict:
        path = self.root / "manifest.json"
        return _read_json(path) if path.exists() else {}

    def is_run(self) -> bool:
        """A run directory: it has a manifest.json or a points/ folder."""
        return (self.root / "manifest.json").is_file() or self.points_dir.is_dir()


def load_rows(root: Path | str) -> pd.DataFrame:
    """All result rows under a run directory (or a parent holding several runs), or of one
    Parquet file of rows (a run compacted into one file to keep committed results small).
    A file that cannot be read is named on stderr and left out (warn_damaged)."""
    root = Path(root)
    files = ([root] if root.is_file() and root.suffix == ".parquet" else
             sorted(root.glob("points/*.parquet")) or sorted(root.glob("*/points/*.parquet")))
    if not files:
        return pd.DataFrame(columns=RESULT_COLUMNS)
    frames = [f for f in (_read_parquet(p, "its rows are left out" if p == root else ROW_LEFT_OUT)
                          for p in files) if f is not None]
    frames = [f.dropna(axis=1, how="all") for f in frames]
    if not frames:
        return pd.DataFrame(columns=RESULT_COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    for c in RESULT_COLUMNS:
        if c not in df.columns:
            df[c] = None
    return df[RESULT_COLUMNS + [c for c in df.columns if c not in RESULT_COLUMNS]]


MANIFEST_META = b"kosmos_bench.manifest"  # Parquet key-value metadata of a compacted run


def compact(run_dir: Path | str, dest: Path | str) -> Path:
    """Write every row of ``run_dir`` (a run, or a parent of runs) to one Parquet file with
    the run's manifest.json in its metadata; returns dest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run_dir, dest = Path(run_dir), Path(dest)
    rows = load_rows(run_dir)
    if rows.empty:
        raise FileNotFoundError(f"no result rows under {run_dir} (expected {run_dir}/points/*.parquet)")
    man = load_manifest(run_dir)
    table = pa.Table.from_pandas(rows, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), MANIFEST_META: json.dumps(man).encode()})
    _atomic_write(dest, lambda tmp: pq.write_table(table, tmp))
    return dest


def load_manifest(path: Path | str) -> dict:
    """A run directory's manifest.json, or the manifest inside a compacted Parquet file ({} if none).
    For a parent of runs (``sweep -o DIR`` writes DIR/<run-id>/): its first run's, with
    ``runs`` naming every run under it when there are several."""
    path = Path(path)
    if path.is_file() and path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(path).metadata or {}
            return json.loads(meta[MANIFEST_META]) if MANIFEST_META in meta else {}
        except Exception as e:  # noqa: BLE001 - damaged file: load_rows names it too
            warn_damaged(path, e, "its rows are left out")
            return {}
    mpath = path / "manifest.json"
    if mpath.exists():
        return _read_json(mpath)
    subs = sorted(path.glob("*/manifest.json"))
    if not subs:
        return {}
    man = _read_json(subs[0])
    if len(subs) > 1:
        man["runs"] = [p.parent.name for p in subs]
    return man


def trace_files(root: Path | str, key: str | None = None) -> list[Path]:
    """Role-timeline files of a run directory (traces/<key>.parquet), or of every run under a
    parent of several runs (<run>/traces/<key>.parquet); none for a compacted run (.parquet),
    which keeps only the rows."""
    root = Path(root)
    if not root.is_dir():
        return []
    pat = f"{key or '*'}.parquet"
    return sorted(root.glob(f"traces/{pat}")) or sorted(root.glob(f"*/traces/{pat}"))


def load_traces(root: Path | str, key: str | None = None) -> pd.DataFrame:
    frames = [f for f in (_read_parquet(p, "its role timeline is left out") for p in trace_files(root, key))
              if f is not None]
    if not frames:
        return pd.DataFrame(columns=TRACE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def _cmd(args: list[str]) -> str | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_info() -> dict:
    """git_sha / git_dirty of this checkout. KOSMOS_GIT_SHA overrides them (git_dirty None):
    a working tree copied to a GPU box may carry a stale .git, whose HEAD is not what ran."""
    if os.environ.get("KOSMOS_GIT_SHA"):
        return {"git_sha": os.environ["KOSMOS_GIT_SHA"], "git_dirty": None, "git_sha_from": "KOSMOS_GIT_SHA"}
    here = Path(__file__).resolve().parent.parent
    sha = _cmd(["git", "-C", str(here), "rev-parse", "HEAD"])
    dirty = _cmd(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"])
    return {"git_sha": sha, "git_dirty": bool(dirty) if sha else None}


# What runs: the package's Python, the kernels' sources, the sweep files (relative to the root).
SOURCE_GLOBS = ("kosmos_bench/**/*.py", "kosmos_bench/**/*.json", "csrc/**/*.cu", "csrc/**/*.cuh", "csrc/**/*.h",
                "sweeps/**/*.yaml")


def source_hash(root: Path | None = None) -> str | None:
    """12 hex digits of a sha256 over the sources that run (SOURCE_GLOBS: path and bytes of each,
    in path order). Unlike git_sha it needs no .git and sees uncommitted edits, so a run made
    from a copied working tree (a GPU box) names its code: `kosmos-bench doctor` prints it here."""
    root = Path(__file__).resolve().parent.parent if root is None else Path(root)
    files = sorted({f for g in SOURCE_GLOBS for f in root.glob(g) if f.is_file() and "__pycache__" not in f.parts})
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def manifest() -> dict:
    """Environment of this run: GPU, driver, CUDA/ROCm, NCCL, torch, git, host, command."""
    import torch

    m = {
        "time": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "gpus": [],
        "driver": None,
        "nccl": None,
    }
    if torch.cuda.is_available():
        m["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        m["driver"] = _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        try:
            m["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - a missing NCCL is reported, not fatal
            m["nccl"] = f"unavailable: {e}"
    m.update(git_info())
    m["source_hash"] = source_hash()
    return m
