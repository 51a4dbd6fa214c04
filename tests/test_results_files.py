"""Committed results stay whole and small: every file a results README or a lab note names is in
the repo (sweep outputs are git-ignored, ``results/<run-id>/``, and files named in the notes but
never added are lost data), every Parquet file loads as result rows, and results/ stays < 8 MB.

Layout: results/<dir>/ holds one compacted Parquet per run (``kosmos-bench compact``); files
that fold several runs, probe tables or traces have a ``source`` column naming what each row
came from (the old file or run directory). The lab notebook of a directory is
docs/notes/<dir>.md, whose file names are relative to results/<dir>/ as they were written: a
name resolves to a file, or to a ``source`` of a Parquet file in that directory."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kosmos_bench.store import MANIFEST_META, load_manifest, load_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
READMES = sorted(RESULTS.glob("**/README.md"))
# lab notebooks of a results directory (other notes are checked as docs, below)
NOTES = sorted(n for n in (ROOT / "docs" / "notes").glob("*.md") if (ROOT / "results" / n.stem).is_dir())
# git-ignored sweep outputs (results/<run-id>/, run ids start with a digit) are not committed results
IGNORED = re.compile(r"^\d")
MAX_BYTES = 8 * 2**20
# a backticked relative path to a result file or directory (no globs, placeholders or spaces)
REF = re.compile(r"`((?:[\w.\-]+/)*[\w.\-]+\.(?:parquet|json|txt|csv)|(?:[\w.\-]+/)+)`")


def committed_files() -> list[Path]:
    return [f for f in RESULTS.rglob("*") if f.is_file() and not IGNORED.match(f.relative_to(RESULTS).parts[0])]


def parquet_files() -> list[Path]:
    return sorted(f for f in committed_files() if f.suffix == ".parquet")


def referenced(doc: Path) -> list[str]:
    return sorted(set(REF.findall(doc.read_text())))


@functools.lru_cache(maxsize=None)
def names(base: Path) -> frozenset[str]:
    """What a note may name in results/<dir>/: its files (with and without .parquet), and each
    `source` of a folded Parquet file, with every run of its parts (a run directory `run27-x/` ->
    source `run27-x/streams-process` of runs.parquet; `probes/`, `t1-head`, `first/`)."""
    out: set[str] = set()
    for f in base.iterdir() if base.is_dir() else ():
        out |= {f.name, f.stem}
        if f.suffix != ".parquet" or "source" not in pq.read_schema(f).names:
            continue
        for s in set(pq.read_table(f, columns=["source"]).column("source").to_pylist()):
            parts = str(s).split("/")
            for i in range(1, len(parts) + 1):
                out.add(f"{f.stem}/" + "/".join(parts[:i]))
            # every run of parts: a file folded again keeps the names its rows had (run29-x/first/y: first/)
            out |= {"/".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
    return frozenset(out)


def found(base: Path, ref: str) -> bool:
    """`ref` relative to `base` (a results directory), its old probes/ or timeline/, or the repo
    root; else (after ../ is resolved) a name or `source` of the results directory it points in;
    `manifest.json` is in every compacted file's metadata."""
    if any((b / ref).exists() for b in (base, base / "probes", base / "timeline", ROOT)):
        return True
    path = Path(os.path.normpath(base / ref.rstrip("/")))
    try:
        rel = path.relative_to(RESULTS)
    except ValueError:
        return False
    if len(rel.parts) < 2:
        return False
    d, rest = RESULTS / rel.parts[0], "/".join(rel.parts[1:])
    rest = rest[: -len(".parquet")] if rest.endswith(".parquet") else rest
    return rest in names(d) or (rest.split("/")[-1] == "manifest.json" and any(d.glob("*.parquet")))


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_result_files_exist(readme):
    missing = [r for r in referenced(readme) if not found(readme.parent, r)]
    assert not missing, f"{readme.relative_to(ROOT)} names files that are not in the repo: {missing}"


@pytest.mark.parametrize("note", NOTES, ids=lambda p: str(p.relative_to(ROOT)))
def test_notes_name_result_files_that_exist(note):
    base = RESULTS / note.stem
    missing = [r for r in referenced(note) if not found(base, r)]
    assert not missing, f"{note.relative_to(ROOT)} names files that are not in {base.relative_to(ROOT)}: {missing}"


def test_the_check_sees_references():
    text = "`run1/` and `probes/a.parquet`, not `results/<run-id>/` or `x*.parquet` or `KOSMOS_X=1`"
    assert REF.findall(text) == ["run1/", "probes/a.parquet"]


def test_the_check_resolves_folded_files():
    assert found(ROOT, "results/issue4-h200-20261204/run45-405b-fc1-group-g81.parquet")  # folded into run45-...-group
    assert not found(ROOT, "results/issue4-h200-20261204/run45-405b-fc1-group-g99.parquet")
    base = RESULTS / "issue4-h200-20261203"
    assert found(base, "probes/tail_probe-1.parquet")  # a row source of probes.parquet
    assert found(base, "run27-host-ce-stream-pair/")  # a compacted run directory
    assert found(base, "../issue4-h200-20261204/probes/tail_probe-11-shared-release.parquet")
    assert not found(base, "probes/tail_probe-5-qkv.parquet")  # lost, never committed
    assert not found(base, "run30-host-ce-groups/")


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_result_files_that_exist(doc):
    refs = re.findall(r"`(results/[\w.\-/]+)`", doc.read_text())
    missing = [r for r in refs if not found(ROOT, r)]  # a file, or a source folded into one
    assert not missing, f"{doc.relative_to(ROOT)} names result files that are not in the repo: {missing}"


@pytest.mark.parametrize("path", parquet_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_result_files_load(path):
    rows = load_rows(path)
    assert len(rows) > 0, f"{path.relative_to(ROOT)}: no rows"
    if MANIFEST_META in (pq.read_schema(path).metadata or {}):  # a compacted run: rows of points
        assert rows["key"].notna().all() and rows["status"].notna().all(), f"{path.relative_to(ROOT)}: rows without key/status"
        assert load_manifest(path).get("command"), f"{path.relative_to(ROOT)}: manifest without the command"
    else:  # probe tables and traces, folded: each row names where it came from
        assert "source" in rows.columns and rows["source"].notna().all(), f"{path.relative_to(ROOT)}: no source column"


def test_runs_are_compacted():
    """No per-point files: a run is committed as one Parquet file (kosmos-bench compact)."""
    loose = [str(f.relative_to(ROOT)) for f in committed_files()
             if {"points", "traces", "plots"} & set(f.relative_to(RESULTS).parts[:-1]) or f.name == "manifest.json"]
    assert not loose, f"uncompacted run files in results/: {loose[:5]} ... ({len(loose)})"


def test_results_stay_small():
    used = sum(-(-f.stat().st_size // 4096) * 4096 for f in committed_files())  # as du counts 4 KiB blocks
    assert used < MAX_BYTES, f"results/ holds {used / 2**20:.1f} MB of committed files; the limit is 8 MB"


def test_headline_run_reports():
    """The README's measured table cites these two compacted runs; report reads them."""
    from kosmos_bench import report

    for name in ("run52-a1-host-ce.parquet", "run52-a2-host-ce.parquet"):
        path = RESULTS / "issue4-h200-20261204b" / name
        lines: list[str] = []

        class Lines:
            print = staticmethod(lines.append)

        assert report.report([path], console=Lines) == 0
        assert any("kosmos" in l for l in lines)
