"""Problems: one module per op, each with shapes, counts and a pure-torch reference."""
from __future__ import annotations

from .ag_gemm import OP as AG_GEMM
from .backward import AG_GEMM_DGRAD, AG_WGRAD, GEMM_RS_DGRAD
from .base import Op
from .gemm import OP as GEMM
from .gemm_rs import OP as GEMM_RS
from .layer import OP as LAYER
from .moe import OP as MOE
from .moe_bwd import MOE_BWD, MOE_STEP

OPS: dict[str, Op] = {o.name: o for o in (AG_GEMM, GEMM_RS, GEMM, MOE, AG_GEMM_DGRAD, GEMM_RS_DGRAD, AG_WGRAD, LAYER, MOE_BWD, MOE_STEP)}


def get_op(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(OPS)}") from None
