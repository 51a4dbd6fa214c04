"""Implementation registry: every family behind the one interface of `impls/base.py`.

Modules are imported here on purpose (cheap: no kernels are built and no optional library
is imported at module level); each family reports its own availability.
"""
from __future__ import annotations

from . import deepep, flux, kosmos, nccl, symm_mem, te, torch_gemm
from .base import Impl, RankCtx, Runner  # noqa: F401

_FAMILIES = (nccl, torch_gemm, kosmos, symm_mem, te, flux, deepep)
IMPLS: dict[str, Impl] = {impl.name: impl for mod in _FAMILIES for impl in mod.IMPLS}


def get_impl(name: str) -> Impl:
    try:
        return IMPLS[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(IMPLS)}") from None
