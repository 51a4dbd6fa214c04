"""Implementation registry: every family behind the one interface of `impls/base.py`.

Modules are imported here on purpose (cheap: no kernels are built and no optional library
is imported at module level); each family reports its own availability.
"""
from __future__ import annotations

from . import deepep, flux, kosmos, liger_moe, nccl, symm_mem, te, torch_gemm, torch_moe_grad
from .base import Impl, RankCtx, Runner  # noqa: F401

_FAMILIES = (nccl, torch_gemm, torch_moe_grad, kosmos, symm_mem, te, flux, deepep, liger_moe)
IMPLS: dict[str, Impl] = {impl.name: impl for mod in _FAMILIES for impl in mod.IMPLS}


def get_impl(name: str) -> Impl:
    try:
        return IMPLS[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(IMPLS)}") from None


def optional_status(backend: str = "gpu") -> list[dict]:
    """One dict per optional baseline family, for `kosmos-bench list` / `doctor`.

    Keys: name (impl name), ops (list of op names), fabrics (list), module (what it imports),
    available (bool, for `backend`), why ('' when available, else the one-line reason),
    version (str or None: the installed library's version, torch's for symm-mem).
    Never raises.
    """
    rows = []
    for impl in (*symm_mem.IMPLS, *te.IMPLS, *flux.IMPLS, *deepep.IMPLS, *liger_moe.IMPLS):
        ok, why = impl.available(backend)
        try:
            version = impl.version()
        except Exception:  # noqa: BLE001 -- a version lookup must not break `list`
            version = None
        rows.append({
            "name": impl.name,
            "ops": list(impl.ops),
            "fabrics": list(impl.fabrics),
            "module": impl.module,
            "available": bool(ok),
            "why": why,
            "version": version,
        })
    return rows
