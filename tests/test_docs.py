"""README.md is a short guide and the docs' links lead somewhere (CPU only).

* README.md: under 200 lines, no link to the design file outside the repository, no link
  outside the repository at all, and no ``KOSMOS_*`` name but the environment variables that
  remain (everything that changes a measurement is a configuration field, not a variable).
* README.md and docs/*.md: every relative link points to a file or directory that exists.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# The environment variables that remain (issue 28): kernel cache, CUTLASS headers, watchdog
# timeout, git sha of a copied tree.
ENV_NAMES = {"KOSMOS_BENCH_CACHE", "KOSMOS_CUTLASS_INCLUDE", "KOSMOS_TIMEOUT_S", "KOSMOS_GIT_SHA"}

# Link targets allowed to be missing from a checkout: docs/knobs.md is generated from the
# configuration (kosmos-bench writes it; its staleness is checked by test_knobs).
GENERATED = {ROOT / "docs" / "knobs.md"}

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.\-]*:", re.I)  # http:, https:, mailto:, ...


def links(text: str) -> list[str]:
    """Markdown link targets outside code blocks and code spans."""
    return LINK.findall(CODE_SPAN.sub("", FENCE.sub("", text)))


def relative_targets(doc: Path) -> list[tuple[str, Path]]:
    out = []
    for target in links(doc.read_text()):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        out.append((target, (doc.parent / path).resolve()))
    return out


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n < 200, f"README.md has {n} lines (the guide stays under 200; details go to docs/)"


def test_readme_links_stay_in_the_repository():
    text = README.read_text()
    assert "../shared" not in text, "README.md names ../shared (the design file is outside the repository)"
    external = [t for t in links(text) if EXTERNAL.match(t)]
    outside = [t for t, p in relative_targets(README) if not p.is_relative_to(ROOT)]
    assert not external and not outside, f"README.md links outside the repository: {external + outside}"


def test_readme_names_no_knob_variables():
    names = set(re.findall(r"KOSMOS_[A-Z0-9_]+", README.read_text()))
    extra = sorted(names - ENV_NAMES)
    assert not extra, (f"README.md names {extra}: knobs are configuration fields (docs/knobs.md), "
                       f"the only environment variables are {sorted(ENV_NAMES)}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(doc):
    missing = [t for t, p in relative_targets(doc) if not p.exists() and p not in GENERATED]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_the_link_check_sees_links():
    text = ("see [a](docs/a.md), ![img](x.png \"t\"), [web](https://x.org), [here](#top), `[no](code.md)`\n"
            "```\n[no](fenced.md)\n```\n")
    assert links(text) == ["docs/a.md", "x.png", "https://x.org", "#top"]
