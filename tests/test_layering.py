"""The package's import structure (static: ast over every module's import statements).

* kernels/, sim/ and runtime/ sit below the implementations and the harness: no module under them
  imports kosmos_bench.impls or kosmos_bench.harness, at any level (function bodies included).
* the intra-package import graph has no cycle: neither the module-level imports (what runs at
  import time) nor all of them, function-level imports included, so no function-level import
  hides a circle. An edge from a module to one of its own packages is left out (the package is
  already being imported when its submodule runs).
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "kosmos_bench"
LOWER = ("kosmos_bench.kernels", "kosmos_bench.sim", "kosmos_bench.runtime")
UPPER = ("kosmos_bench.impls", "kosmos_bench.harness")
# Known layering exceptions (importer, imported), each with the change that removes it.
PENDING: set[tuple[str, str]] = set()  # known exceptions (none left)


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for f in sorted((ROOT / PKG).rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


MODULES = _modules()


def _imports(mod: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every intra-package import of `mod`."""
    path, is_pkg = MODULES[mod]
    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out = []

    def visit(node, in_func: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.Import):
                out.extend((a.name, ch.lineno, in_func) for a in ch.names if a.name.split(".")[0] == PKG)
            elif isinstance(ch, ast.ImportFrom):
                base = ".".join(here[:len(here) - ch.level + 1] + ([ch.module] if ch.module else [])) \
                    if ch.level else ch.module
                if base and base.split(".")[0] == PKG:
                    for a in ch.names:  # `from P import m` imports the submodule P.m when there is one
                        sub = f"{base}.{a.name}"
                        out.append((sub if sub in MODULES else base, ch.lineno, in_func))
            visit(ch, in_func or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return out


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for t, _, in_func in _imports(m):
            if (in_func and module_level_only) or t == m or m.startswith(t + "."):
                continue
            g[m].add(t if t in MODULES else t.rsplit(".", 1)[0])
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_every_module_imports(mod):
    importlib.import_module(mod)


def test_kernels_sim_runtime_import_neither_impls_nor_harness():
    bad = []
    for m in MODULES:
        if not m.startswith(LOWER):
            continue
        for t, line, _ in _imports(m):
            if any(t == u or t.startswith(u + ".") for u in UPPER) and (m, t) not in PENDING:
                bad.append(f"{MODULES[m][0].relative_to(ROOT)}:{line} imports {t}")
    assert not bad, "\n".join(bad)


def test_pending_exceptions_still_exist():
    """An exception that no longer occurs is deleted from PENDING."""
    for m, t in PENDING:
        assert t in {x for x, _, _ in _imports(m)}, f"{m} no longer imports {t}: drop it from PENDING"


def test_no_import_cycles_at_module_level():
    assert _cycles(_graph(module_level_only=True)) == []


def test_no_import_cycles_with_function_level_imports():
    assert _cycles(_graph(module_level_only=False)) == []


def test_the_scan_sees_relative_and_submodule_imports():
    """The scanner resolves `from . import x`, `from ..pkg import mod` and `from .mod import name`."""
    targets = {t for t, _, _ in _imports("kosmos_bench.impls")}
    assert {"kosmos_bench.impls.symm_mem", "kosmos_bench.impls.base"} <= targets
    assert "kosmos_bench.kernels.libs" in {t for t, _, _ in _imports("kosmos_bench.kernels.ag_sm90")}
    assert "kosmos_bench.harness" in {t for t, _, _ in _imports("kosmos_bench.launch")}
