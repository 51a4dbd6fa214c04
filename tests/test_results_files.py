"""Every result file a results README names is in the repo: sweep outputs are git-ignored
(``results/<run-id>/``), and files named in the notes but never added are lost data."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted((ROOT / "results").glob("**/README.md"))
# a backticked relative path to a result file or directory (no globs, placeholders or spaces)
REF = re.compile(r"`((?:[\w.\-]+/)*[\w.\-]+\.(?:parquet|json|txt|csv)|(?:[\w.\-]+/)+)`")


def referenced(readme: Path) -> list[str]:
    return sorted(set(REF.findall(readme.read_text())))


def found(readme: Path, ref: str) -> bool:
    """Relative to the README, its probes/ or timeline/, or the repo root; a bare name (a run's
    `traces/`, `manifest.json`) anywhere below the README."""
    here = readme.parent
    if any((base / ref).exists() for base in (here, here / "probes", here / "timeline", ROOT)):
        return True
    name = ref.rstrip("/")
    return "/" not in name and any(p.is_dir() or not ref.endswith("/") for p in here.rglob(name))


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_result_files_exist(readme):
    missing = [r for r in referenced(readme) if not found(readme, r)]
    assert not missing, f"{readme.relative_to(ROOT)} names files that are not in the repo: {missing}"


def test_the_check_sees_references():
    text = "`run1/` and `probes/a.parquet`, not `results/<run-id>/` or `x*.parquet` or `KOSMOS_X=1`"
    assert REF.findall(text) == ["run1/", "probes/a.parquet"]


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_result_files_that_exist(doc):
    refs = re.findall(r"`(results/[\w.\-/]+)`", doc.read_text())
    missing = [r for r in refs if not (ROOT / r).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} names result files that are not in the repo: {missing}"
