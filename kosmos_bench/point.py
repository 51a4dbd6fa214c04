"""One benchmark point: the full, hashable configuration of a single measurement.

A sweep file expands into a list of `Point`s (see `spec.py`). Everything that can change a
result is a field here, so `Point.key()` (a hash of all fields but the bookkeeping ones) is
a stable identity used by `--resume` and by the results store.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from .kosmos.decide import parse_policy  # noqa: F401 - re-exported: the one policy parser

OPS = ("ag-gemm", "gemm-rs", "gemm", "moe", "ag-gemm-dgrad", "gemm-rs-dgrad", "ag-wgrad", "layer", "moe-bwd", "moe-step")
# The MoE expert layer's ops (ops/moe.py, ops/moe_bwd.py): a preset, not a GEMM shape, in Point.moe
MOE_OPS = ("moe", "moe-bwd", "moe-step")
DTYPES = ("bf16", "fp16", "fp32")
FABRICS = ("nvlink", "local", "host", "gloo")
BACKENDS = ("gpu", "cpu", "sim")
QUEUE_ORDERS = ("demand", "fifo", "reverse", "random")

# Fields that describe how a point is *recorded*, not what is measured: excluded from the key.
_NON_KEY_FIELDS = ("trace", "concurrent", "model", "layer", "tokens", "sweep")


@dataclass(frozen=True)
class Point:
    """A fully resolved point. Global GEMM shape conventions (W = world):

    * ag-gemm: A is (M x K) gathered along M from W shards of (M/W x K); B is (K x N) split
      along N, rank r holds B_r (K x N/W); rank r outputs C_r = A @ B_r, (M x N/W).
    * gemm-rs: A is (M x K) split along K, rank r holds A_r (M x K/W); B is (K x N) split
      along K, B_r (K/W x N); rank r outputs band r (M/W x N) of sum_r A_r @ B_r.
    * moe: the expert layer of preset `moe` (ops/moe_math.py) with M = tokens per rank, N = the
      expert FFN width and K = the hidden size (both the preset's), `experts` per rank and
      `routing`; ops/moe.py's moe_shape(point) is the layer's shape. moe-bwd (its backward, the
      output gradient given) and moe-step (forward + backward) take the same fields.
    * ag-gemm-dgrad / gemm-rs-dgrad (backward, ops/backward.py): ag-gemm / gemm-rs with B_r
      held transposed (the layer weight W_r as stored: N/W x K, resp. N x K/W, row-major).
    * ag-wgrad: all-gather along K (tokens): rank r holds rows r*K/W.. of At (K x M) and B_r
      (K x N/W); outputs C_r = At^T @ B_r (M x N/W).
    * layer (ops/layer.py): one TP+SP transformer layer step, forward and backward; M = tokens,
      N = the model's hidden size, K = its FFN width (the model preset names the rest).
    """

    op: str
    impl: str
    M: int
    N: int
    K: int
    world: int
    dtype: str = "bf16"
    fabric: str = "host"
    backend: str = "gpu"
    # KOSMOS kernel knobs (None for implementations that have no such knob).
    policy: str | None = None  # self | fixed:<k> | predicted
    queue_order: str | None = None  # demand | fifo | reverse | random
    local_first: bool | None = None
    chunk: int | None = None  # rows per mover band, in builder tiles (BM); None = default
    builder: str | None = None  # mma | sm90 (Hopper wgmma+TMA); None = the kernel's default
    # sm (WGs move) | ce (host-fabric ag-gemm: the copy engine moves); None = auto, resolved by
    # kosmos.builder.mover_choice (the row's `mover` column records what ran)
    mover: str | None = None
    profile: str | None = None  # simulator hardware profile (backend=sim)
    # The other KOSMOS configuration fields that differ from their default: sorted (name, value)
    # pairs (kosmos/config.py KOSMOS_FIELDS; docs/knobs.md). A string "name=value;..." is parsed.
    knobs: tuple = ()
    warmup: int = 5
    reps: int = 20
    seed: int = 0
    # Bookkeeping: where the point came from; not part of the key.
    trace: bool = False
    concurrent: bool = True  # also time the GEMM alone + collective alone issued together (GPU)
    model: str | None = None
    layer: str | None = None
    tokens: int | None = None
    sweep: str | None = None
    # op moe (None for the other ops, whose keys stay as they were)
    moe: str | None = None  # preset: deepseek-v3 | qwen3-235b-a22b | ...
    routing: str | None = None  # uniform | zipf:<s>
    experts: int | None = None  # routed experts per rank (None: the preset's)

    def __post_init__(self):
        if isinstance(self.knobs, str) or self.knobs:
            object.__setattr__(self, "knobs", normalize_knobs(self.knobs))

    def config(self) -> dict:
        cfg = {k: v for k, v in dataclasses.asdict(self).items() if k not in _NON_KEY_FIELDS}
        for knob in ("builder", "mover", "moe", "routing", "experts"):  # keys of points from before these existed stay valid
            if cfg[knob] is None:
                del cfg[knob]
        if not cfg["knobs"]:  # likewise: a point at the default configuration keeps its old key
            del cfg["knobs"]
        else:
            cfg["knobs"] = [list(kv) for kv in self.knobs]
        return cfg

    def key(self) -> str:
        blob = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    @property
    def variant(self) -> str:
        """Short label: 'kosmos[self]', 'kosmos[fixed:4,fifo]', 'nccl-seq'."""
        if self.policy is None:
            return self.impl
        extra = [self.policy]
        if self.queue_order not in (None, "demand"):
            extra.append(self.queue_order)
        if self.local_first is False:
            extra.append("no-local-first")
        if self.chunk not in (None, 1):
            extra.append(f"chunk={self.chunk}")
        if self.builder not in (None, "mma"):
            extra.append(self.builder)
        if self.mover is not None:  # set explicitly (auto: the row's mover column says which ran)
            extra.append(f"{self.mover}-mover")
        extra += [f"{n}={_fmt(v)}" for n, v in self.knobs]
        return f"{self.impl}[{','.join(extra)}]"

    @property
    def knobs_text(self) -> str:
        """The knobs as one string, "name=value;name=value" ("" when none; parsed back by Point)."""
        return ";".join(f"{n}={_fmt(v)}" for n, v in self.knobs)

    def replace(self, **kw) -> "Point":
        return dataclasses.replace(self, **kw)

    def as_row(self) -> dict:
        row = dataclasses.asdict(self)
        row["knobs"] = self.knobs_text
        row["key"] = self.key()
        row["variant"] = self.variant
        return row


def _fmt(v) -> str:
    return "on" if v is True else "off" if v is False else str(v)


def normalize_knobs(knobs) -> tuple:
    """Sorted, validated (name, value) pairs without the default values, from pairs, a dict or a
    "name=value;..." string (kosmos.config.coerce checks each). ValueError (one line) when bad."""
    from .kosmos.config import DEFAULTS, KNOB_FIELDS, coerce

    if isinstance(knobs, str):
        items = [kv.partition("=")[::2] for kv in knobs.split(";") if kv.strip()]
    elif isinstance(knobs, dict):
        items = list(knobs.items())
    else:
        items = [tuple(kv) for kv in knobs]
    out = {}
    for name, v in items:
        name = str(name).strip()
        if name not in KNOB_FIELDS:
            raise ValueError(f"knob {name!r}: not a KOSMOS setting outside the Point fields; known: "
                             f"{', '.join(KNOB_FIELDS)}")
        v = coerce(name, v.strip() if isinstance(v, str) else v)
        if v != getattr(DEFAULTS, name):
            out[name] = v
    return tuple(sorted(out.items()))
