"""Model catalog and the TP+SP layer GEMMs derived from it.

Shapes are *global* (the whole tensor-parallel group); the op splits them over W ranks.
M is the number of tokens in the sequence-parallel region (batch x sequence).

Layers:
  qkv       column-parallel, ag-gemm:  M=T, K=hidden, N=(heads + 2*kv_heads) * head_dim
  fc1       column-parallel, ag-gemm:  M=T, K=hidden, N=ffn * (2 if gated else 1)
  out-proj  row-parallel,    gemm-rs:  M=T, K=heads * head_dim, N=hidden
  fc2       row-parallel,    gemm-rs:  M=T, K=ffn, N=hidden
For MoE models `ffn` is the dense-layer (or shared) FFN width; the expert layer is the MoE
op's business. DeepSeek-V3's attention is MLA; its qkv entry uses the up-projections'
output width (heads x (qk_nope + qk_rope) for q, plus heads x (qk_nope + v) for kv), which is
what a TP split shards.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    gated: bool = True  # SwiGLU: FC1 produces gate and up together
    qkv_width: int | None = None  # override for non-standard attention (MLA)
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("llama3-8b", hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128),
    Model("llama3-70b", hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128),
    Model("llama3-405b", hidden=16384, ffn=53248, heads=128, kv_heads=8, head_dim=128),
    Model("gpt3-175b", hidden=12288, ffn=49152, heads=96, kv_heads=96, head_dim=128, gated=False),
    Model("qwen3-235b-a22b", hidden=4096, ffn=12288, heads=64, kv_heads=4, head_dim=128,
          experts=128, top_k=8, expert_ffn=1536),
    Model("deepseek-v3", hidden=7168, ffn=18432, heads=128, kv_heads=128, head_dim=128,
          qkv_width=128 * (128 + 64) + 128 * (128 + 128), experts=256, top_k=8, expert_ffn=2048),
)}

# Which op each TP+SP layer GEMM fuses with.
LAYER_OPS = {"qkv": "ag-gemm", "fc1": "ag-gemm", "out-proj": "gemm-rs", "fc2": "gemm-rs"}


# The backward ops of each layer (ops/backward.py): row-parallel layers' dgrad is an AG+GEMM,
# column-parallel layers' dgrad a GEMM+RS; every layer's wgrad an all-gather along tokens.
BWD_LAYER_OPS = {"ag-gemm-dgrad": ("out-proj", "fc2"), "gemm-rs-dgrad": ("qkv", "fc1"),
                 "ag-wgrad": ("qkv", "fc1", "out-proj", "fc2")}


def layers_for(op: str) -> list[str]:
    """The layers whose GEMM op `op` is (forward or backward)."""
    if op in BWD_LAYER_OPS:
        return list(BWD_LAYER_OPS[op])
    if op == "layer":  # the whole step (ops/layer.py): M = tokens, N = hidden, K = FFN width
        return ["layer"]
    return [l for l, o in LAYER_OPS.items() if o == op]


def op_shape(model: Model, layer: str, tokens: int, op: str) -> tuple[int, int, int]:
    """Global (M, N, K) of op `op` on `layer`: the forward GEMM's (layer_shape), or the GEMM of
    its backward op: dgrad (T, K_fwd, N_fwd); wgrad (K_fwd, N_fwd, T) for a column-parallel
    layer, (N_fwd, K_fwd, T) for a row-parallel one (it computes dW_r transposed)."""
    if op == "layer":
        return tokens, model.hidden, model.ffn
    M, N, K = layer_shape(model, layer, tokens)
    if op in ("ag-gemm-dgrad", "gemm-rs-dgrad"):
        return M, K, N
    if op == "ag-wgrad":
        return (K, N, M) if LAYER_OPS[layer] == "ag-gemm" else (N, K, M)
    return M, N, K


def get_model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


def layer_shape(model: Model, layer: str, tokens: int) -> tuple[int, int, int]:
    """Global (M, N, K) of one TP+SP layer GEMM for `tokens` tokens."""
    attn = model.heads * model.head_dim
    if layer == "qkv":
        n = model.qkv_width or (model.heads + 2 * model.kv_heads) * model.head_dim
        return tokens, n, model.hidden
    if layer == "fc1":
        return tokens, model.ffn * (2 if model.gated else 1), model.hidden
    if layer == "out-proj":
        return tokens, model.hidden, attn
    if layer == "fc2":
        return tokens, model.hidden, model.ffn
    raise KeyError(f"unknown layer {layer!r}; known layers: {', '.join(LAYER_OPS)}")
