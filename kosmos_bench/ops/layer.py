"""Op `layer`: one TP+SP transformer layer step (attention projections + SwiGLU MLP), forward
and backward, over W tensor-parallel ranks with sequence parallelism (Megatron-LM's layout).

Point: M = tokens T, N = hidden H, K = FFN width F; heads, KV heads and head dim come from the
catalog model with that (hidden, ffn) (llama3-8b/70b/405b, ...), else H/128 heads of 128, MHA.
Per rank r (X_r, dY_r: token band r, T/W x H; no norms, no dropout, causal attention):

    forward                                         backward (dY_r given)
    QKV_r = AG(X) @ Wqkv_r        ag-gemm           da_r   = AG(dY) @ W2_r^T         ag-gemm-dgrad
    attn_r = SDPA(q_r, k_r, v_r)  (GQA, causal)     dW2_r  = a_r^T @ AG(dY)          (gathered dY reused)
    O_r  = RS(attn_r @ Wo_r)      gemm-rs           dU_r   = SwiGLU'(U_r) da_r
    Y1_r = X_r + O_r                                dY1_r  = dY_r + RS(dU_r @ W1_r^T)  gemm-rs-dgrad
    U_r  = AG(Y1) @ W1_r          ag-gemm           dW1_r  = AG(Y1)^T @ dU_r         ag-wgrad
    a_r  = silu(g_r) * u_r        (U_r = [g_r|u_r]) dattn_r = AG(dY1) @ Wo_r^T       ag-gemm-dgrad
    Y_r  = Y1_r + RS(a_r @ W2_r)  gemm-rs           dWo_r  = attn_r^T @ AG(dY1)      (gathered dY1 reused)
                                                    dQKV_r = SDPA'(...)
                                                    dX_r   = dY1_r + RS(dQKV_r @ Wqkv_r^T)  gemm-rs-dgrad
                                                    dWqkv_r = AG(X)^T @ dQKV_r       ag-wgrad

Weights are held as the forward keeps them (Wqkv_r: H x nqkv/W, Wo_r: attn/W x H, W1_r:
H x 2F/W, W2_r: F/W x H); the dgrad ops read them transposed in place. Global weights are in
rank-blocked column order (block r of Wqkv = rank r's [q heads | k heads | v heads], block r of
W1 = [gate_r | up_r]), so the single-device reference layer is the same function of the same
tensors. A rank's output is its Y_r, dX_r and its four weight-gradient shards, packed flat.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..point import Point
from .base import ELEM_BYTES, Op, check_output, generator, randn, torch_dtype

# Per-element tolerance of the layer's outputs (|out - ref| <= layer_rtol(s) * (|ref| + rms(ref)),
# per output tensor): every bf16 rounding of the step's chain (projections, SDPA, SwiGLU, the
# reduce-scatters' partials) compounds: a bf16 emulation of all ranks (tests/test_layer.py) is off
# by ~0.5% of rms(ref) in rms, its worst elements by about half of LAYER_RTOL. The worst element
# grows with the reductions' length (sqrt of the FFN width): the plain bf16 torch step (nccl-seq)
# on an H100, T 8192, worst element / rms: llama3-8b 0.056, 70b 0.067, 405b 0.105 (LAYER_RTOL
# alone failed 50 of 405b's elements, every implementation alike).
LAYER_RTOL = 5e-2
LAYER_RTOL_F = 14336  # the FFN width LAYER_RTOL was set at (llama3-8b)


def layer_rtol(s: "LayerShape") -> float:
    """LAYER_RTOL scaled by sqrt(F / 14336) and a 25% margin above F = 14336: 8b 0.05, 70b 0.088,
    405b 0.120 (the worst bf16 element measured there: 0.105)."""
    return LAYER_RTOL * max(1.0, (s.F / LAYER_RTOL_F) ** 0.5) * (1.25 if s.F > LAYER_RTOL_F else 1.0)


HEAD_DIM = 128  # for a (hidden, ffn) that is not in the model catalog


@dataclass(frozen=True)
class LayerShape:
    T: int
    H: int
    F: int
    heads: int
    kv_heads: int
    head_dim: int
    world: int

    @property
    def nq(self) -> int:  # rank-local q width (heads/W x head_dim) = attention width per rank
        return self.heads // self.world * self.head_dim

    @property
    def nkv(self) -> int:
        return self.kv_heads // self.world * self.head_dim

    @property
    def nqkv(self) -> int:
        return self.nq + 2 * self.nkv

    @property
    def f(self) -> int:  # FFN width per rank
        return self.F // self.world

    @property
    def t(self) -> int:  # tokens per rank (sequence-parallel band)
        return self.T // self.world

    def gemms(self) -> dict[str, tuple[str, int, int, int]]:
        """Every collective GEMM of the step: name -> (op, M, N, K), global shapes (Point's)."""
        T, H, F, W = self.T, self.H, self.F, self.world
        return {"qkv": ("ag-gemm", T, W * self.nqkv, H), "out": ("gemm-rs", T, H, W * self.nq),
                "fc1": ("ag-gemm", T, 2 * F, H), "fc2": ("gemm-rs", T, H, F),
                "fc2.dgrad": ("ag-gemm-dgrad", T, F, H), "fc1.dgrad": ("gemm-rs-dgrad", T, H, 2 * F),
                "fc1.wgrad": ("ag-wgrad", H, 2 * F, T), "out.dgrad": ("ag-gemm-dgrad", T, W * self.nq, H),
                "qkv.dgrad": ("gemm-rs-dgrad", T, H, W * self.nqkv), "qkv.wgrad": ("ag-wgrad", H, W * self.nqkv, T)}

    def outputs(self) -> dict[str, tuple[int, int]]:
        """A rank's outputs, in packing order: name -> (rows, cols)."""
        return {"Y": (self.t, self.H), "dX": (self.t, self.H), "dWqkv": (self.H, self.nqkv), "dWo": (self.nq, self.H),
                "dW1": (self.H, 2 * self.f), "dW2": (self.f, self.H)}

    def packed_size(self) -> int:
        return sum(r * c for r, c in self.outputs().values())


def shape_of(p: Point) -> LayerShape:
    from ..models import MODELS

    m = next((m for m in MODELS.values() if (m.hidden, m.ffn) == (p.N, p.K) and m.gated and not m.qkv_width), None)
    if m is not None:
        return LayerShape(p.M, p.N, p.K, m.heads, m.kv_heads, m.head_dim, p.world)
    heads = max(1, p.N // HEAD_DIM)
    return LayerShape(p.M, p.N, p.K, heads, heads, HEAD_DIM, p.world)


def unpack(flat: torch.Tensor, s: LayerShape) -> dict[str, torch.Tensor]:
    """Views of a rank's packed outputs (offsets are multiples of 8 elements when the widths are)."""
    out, off = {}, 0
    for name, (r, c) in s.outputs().items():
        out[name] = flat[off:off + r * c].view(r, c)
        off += r * c
    return out


def rank_weights(Wg: dict[str, torch.Tensor], s: LayerShape, r: int) -> dict[str, torch.Tensor]:
    """Rank r's weight shards, contiguous, as the forward keeps them."""
    q, f = s.nqkv, s.f
    return {"Wqkv": Wg["Wqkv"][:, r * q:(r + 1) * q].contiguous(), "Wo": Wg["Wo"][r * s.nq:(r + 1) * s.nq].contiguous(),
            "W1": Wg["W1"][:, 2 * r * f:2 * (r + 1) * f].contiguous(), "W2": Wg["W2"][r * f:(r + 1) * f].contiguous()}


def attention(qkv: torch.Tensor, s: LayerShape):
    """(q, k, v, o) of one rank's heads: q/k/v leaves (1, h, T, d) requiring grad, o (T, nq)."""
    T, d = qkv.shape[0], s.head_dim
    hq, hkv = s.nq // d, s.nkv // d

    def heads(x, h):
        return x.view(T, h, d).transpose(0, 1).unsqueeze(0).detach().requires_grad_(True)

    q = heads(qkv[:, :s.nq], hq)
    k = heads(qkv[:, s.nq:s.nq + s.nkv], hkv)
    v = heads(qkv[:, s.nq + s.nkv:], hkv)
    # flash attention (GQA natively, a deterministic backward: impls/layer.py); math on CPU
    with torch.enable_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
    return q, k, v, o


def swiglu(U: torch.Tensor) -> torch.Tensor:
    g, u = U.float().chunk(2, dim=1)
    return (F.silu(g) * u).to(U.dtype)


def swiglu_grad(U: torch.Tensor, da: torch.Tensor, out: torch.Tensor) -> None:
    """out = [dg | du] of a = silu(g) * u for upstream da (fp32 math, one rounding)."""
    g, u = U.float().chunk(2, dim=1)
    s = torch.sigmoid(g)
    da = da.float()
    f = out.shape[1] // 2
    out[:, :f].copy_(da * u * s * (1 + g * (1 - s)))
    out[:, f:].copy_(da * g * s)


class Layer(Op):
    name = "layer"
    base = "layer"
    collective = "layer"

    def validate(self, p: Point) -> str | None:
        s = shape_of(p)
        W = p.world
        if W < 2:
            return "layer: world must be at least 2 (a TP+SP step; world 1 has no collectives)"
        for what, n in (("tokens M", p.M), ("FFN width K", p.K), ("heads", s.heads), ("KV heads", s.kv_heads)):
            if n % W:
                return f"layer: {what}={n} is not divisible by world={W}"
        if p.dtype == "fp32":
            return "layer: bf16 or fp16 (the step's attention runs in the point's dtype)"
        return None

    def flops(self, p: Point) -> float:
        """Forward + backward of the step, all ranks: the ten GEMMs, the two reused-gather wgrads
        and causal attention (forward 2 T^2 h d; backward 2.5x that, recomputing P)."""
        s = shape_of(p)
        gemm = 3.0 * sum(2.0 * M * N * K for name, (op, M, N, K) in s.gemms().items() if "." not in name)
        attn = 2.0 * s.T * s.T * s.heads * s.head_dim
        return gemm + 3.5 * attn

    def comm_bytes(self, p: Point) -> float:
        """Bytes of the step's ten collectives (nccl-tests' size: gathered / reduced tensors)."""
        e = ELEM_BYTES[p.dtype]
        return float(sum((M * N if op.startswith("gemm-rs") else M * K) * e for op, M, N, K in shape_of(p).gemms().values()))

    def bus_factor(self, p: Point) -> float:
        return (p.world - 1) / p.world if p.world > 1 else 0.0

    def out_shape(self, p: Point) -> tuple[int]:
        return (shape_of(p).packed_size(),)

    def make_global(self, p: Point, device, seed: int) -> dict[str, torch.Tensor]:
        """X, dY (T x H) and the global weights, O(1) activations (weights scaled by fan-in^-1/2)."""
        s = shape_of(p)
        g = generator(torch.device(device), seed)
        dt = torch_dtype(p.dtype)
        W = s.world
        return {"X": randn((s.T, s.H), dt, device, g), "dY": randn((s.T, s.H), dt, device, g),
                "Wqkv": randn((s.H, W * s.nqkv), dt, device, g, scale=s.H ** -0.5),
                "Wo": randn((W * s.nq, s.H), dt, device, g, scale=(W * s.nq) ** -0.5),
                "W1": randn((s.H, 2 * s.F), dt, device, g, scale=s.H ** -0.5),
                "W2": randn((s.F, s.H), dt, device, g, scale=s.F ** -0.5)}

    def inputs(self, p: Point, ranks: list[int], device, seed: int):
        """RankInputs with A[r] = rank r's tensors (X_r, dY_r and its weight shards; B unused),
        and the global tensors for the reference (its fp32 results are cached in them)."""
        from .base import RankInputs

        s = shape_of(p)
        G = self.make_global(p, device, seed)
        A = {}
        for r in ranks:
            A[r] = {"X": G["X"][r * s.t:(r + 1) * s.t].contiguous(), "dY": G["dY"][r * s.t:(r + 1) * s.t].contiguous(),
                    **rank_weights(G, s, r)}
        return RankInputs(A, {r: None for r in ranks}), G, s

    def reference(self, G, s: LayerShape, rank: int, world: int) -> dict[str, torch.Tensor]:
        """Rank `rank`'s outputs from the single-device fp32 layer (autograd), by name."""
        if "_ref" not in G:
            G["_ref"] = reference_layer(G, s)
        return {k: v(rank) for k, v in G["_ref"].items()}

    def check(self, out: torch.Tensor, ref: dict[str, torch.Tensor], dtype: str, s: LayerShape) -> tuple[int, float]:
        """(wrong, max_rel_err) over the packed outputs, each tensor against its own reference."""
        wrong, err = 0, 0.0
        got = unpack(out, s)
        for name, r in ref.items():
            w, e = check_output(got[name], r, dtype, rtol=layer_rtol(s))
            wrong, err = wrong + w, max(err, e)
        return wrong, err

    def derive(self, row: dict, p: Point) -> dict:
        """The step: tokens/s, and the share of it that is exposed communication (t_gemm_us: the
        same step with no collectives)."""
        t = row.get("t_median_us")
        if not t:
            return {}
        out = {"tokens_per_s": p.M / (t * 1e-6)}
        if row.get("t_gemm_us") is not None:
            out["exposed_comm_share"] = max(0.0, t - row["t_gemm_us"]) / t
        return out


def reference_layer(G: dict[str, torch.Tensor], s: LayerShape) -> dict:
    """The single-device layer in fp32: forward, then backward of sum(Y * dY) by autograd.
    Returns per output name a function rank -> that rank's fp32 piece."""
    with torch.enable_grad():
        Wt = {k: G[k].float().requires_grad_(True) for k in ("Wqkv", "Wo", "W1", "W2")}
        X = G["X"].float().requires_grad_(True)
        attn = []
        for r in range(s.world):  # rank r's heads: the same function as one device's all heads
            qkv = X @ Wt["Wqkv"][:, r * s.nqkv:(r + 1) * s.nqkv]
            T, d = qkv.shape[0], s.head_dim

            def heads(x, h):
                return x.reshape(T, h, d).transpose(0, 1).unsqueeze(0)

            rep = s.nq // s.nkv  # KV heads repeated (not enable_gqa: fp32 GQA would take the T^2 math path)
            q = heads(qkv[:, :s.nq], s.nq // d)
            k = heads(qkv[:, s.nq:s.nq + s.nkv], s.nkv // d).repeat_interleave(rep, dim=1)
            v = heads(qkv[:, s.nq + s.nkv:], s.nkv // d).repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            attn.append(o.squeeze(0).transpose(0, 1).reshape(T, s.nq))
        Y1 = X + torch.cat(attn, dim=1) @ Wt["Wo"]
        U = Y1 @ Wt["W1"]
        a = torch.cat([F.silu(g) * u for g, u in (U[:, 2 * r * s.f:2 * (r + 1) * s.f].chunk(2, dim=1)
                                                    for r in range(s.world))], dim=1)
        Y = Y1 + a @ Wt["W2"]
        Y.backward(G["dY"].float())
    Y, dX = Y.detach(), X.grad
    gW = {k: w.grad for k, w in Wt.items()}
    t, q, f, nq = s.t, s.nqkv, s.f, s.nq
    return {"Y": lambda r: Y[r * t:(r + 1) * t], "dX": lambda r: dX[r * t:(r + 1) * t],
            "dWqkv": lambda r: gW["Wqkv"][:, r * q:(r + 1) * q], "dWo": lambda r: gW["Wo"][r * nq:(r + 1) * nq],
            "dW1": lambda r: gW["W1"][:, 2 * r * f:2 * (r + 1) * f], "dW2": lambda r: gW["W2"][r * f:(r + 1) * f]}


# Which family runs each op of a family's step (default: the family itself; none is substituted
# now that kosmos has its ag-wgrad kernel). LOCAL_SUBSTITUTES: on the local fabric, where nccl
# runs no emulated ranks.
SUBSTITUTES: dict[str, dict[str, str]] = {}
LOCAL_SUBSTITUTES: dict[str, dict[str, str]] = {}

# Sub-op -> (its A buffer, its B: a weight, a weight read transposed (".t"), or a buffer).
WIRING = {"qkv": ("X", "Wqkv"), "out": ("attn", "Wo"), "fc1": ("Y1", "W1"), "fc2": ("a", "W2"),
          "fc2.dgrad": ("dY", "W2.t"), "fc1.dgrad": ("dU", "W1.t"), "fc1.wgrad": ("Y1", "dU"),
          "out.dgrad": ("dY1", "Wo.t"), "qkv.dgrad": ("dQKV", "Wqkv.t"), "qkv.wgrad": ("X", "dQKV")}


def family_of(impl: str, op: str, fabric: str) -> str:
    subs = (LOCAL_SUBSTITUTES if fabric == "local" else SUBSTITUTES).get(impl, {})
    return subs.get(op, impl)


def sub_point(p: Point, name: str, s: LayerShape) -> Point:
    """The point of one sub-op of the step, run by its family (family_of)."""
    op, M, N, K = s.gemms()[name]
    impl = family_of(p.impl, op, p.fabric)
    q = p.replace(op=op, impl=impl, M=M, N=N, K=K, trace=False)
    if impl != "kosmos":  # the KOSMOS fields are not the baselines'
        q = q.replace(policy=None, queue_order=None, local_first=None, chunk=None, builder=None, mover=None, knobs=())
    return q


OP = Layer()
