"""The `layer` op on the simulator: the step as its ten collective sub-ops (each simulated as
its own point, by the family that runs it: impls/layer.py's family_of) in sequence, plus the
step's local work priced on the profile: the two wgrad GEMMs that reuse a gathered gradient
(cuBLAS model), causal attention forward + backward (at the profile's GEMM rate; flash
attention reaches ~60% of it) and the elementwise glue (HBM traffic).
t_gemm_us is the step with no collectives (every sub-op's GEMM alone), t_comm_us the
collectives alone one after another, as the GPU runner times them."""
from __future__ import annotations

from ..ops.layer import WIRING, shape_of, sub_point
from ..point import Point
from . import baselines
from .model import Unsupported

ATTENTION_EFFICIENCY = 0.6  # flash attention's share of the dense GEMM rate (fwd and bwd)


def _local_us(p: Point, prof: dict) -> float:
    """The step's work outside the collective sub-ops, on one rank."""
    s = shape_of(p)
    e = 2 if p.dtype in ("bf16", "fp16") else 4
    wgrad = baselines.cublas_us(prof, p.dtype, s.nq, s.H, s.T) + baselines.cublas_us(prof, p.dtype, s.f, s.H, s.T)
    heads = s.nq // s.head_dim
    attn_flops = 3.5 * 2.0 * s.T * s.T * heads * s.head_dim  # causal fwd 2 T^2 h d, bwd 2.5x
    attn = attn_flops / (prof["gemm_tflops"][p.dtype] * ATTENTION_EFFICIENCY * 1e6)
    # SwiGLU fwd/bwd (read U, write a; read U, da, write dU), residual adds, q/k/v/dq/dk/dv copies
    elems = 7 * s.T * 2 * s.f + 10 * s.t * s.H + 4 * s.T * s.nqkv
    glue = elems * e / (prof["hbm_GBps"] * 1e3) + 12 * prof["launch_overhead_us"]
    return wgrad + attn + glue


def simulate_layer(p: Point, prof: dict) -> dict:
    from . import simulate_point

    s = shape_of(p)
    t_op = t_gemm = t_comm = 0.0
    fams = []
    for name in WIRING:
        q = sub_point(p, name, s).replace(concurrent=False)
        if q.impl == "torch":
            raise Unsupported(f"layer {name}: torch-emulated ranks (local fabric) are not modelled")
        f, _ = simulate_point(q, prof)
        t_op += f["t_median_us"]
        t_gemm += f["t_gemm_us"]
        t_comm += f.get("t_comm_us") or 0.0
        fams.append(f"{name}={q.impl}")
    local = _local_us(p, prof)
    t = t_op + local
    return {"profile": prof["name"], "t_median_us": t, "t_min_us": t, "t_p99_us": t, "cv": 0.0,
            "t_gemm_us": t_gemm + local, "t_comm_us": t_comm, "layer_ops": ";".join(fams)}
