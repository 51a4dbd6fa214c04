"""The KOSMOS configuration: every tunable of the kernels, the schedule and the copy-engine
plan in one frozen, typed dataclass (:class:`KosmosConfig`), the regime table that picks the
copy-engine defaults from the shape (:data:`REGIMES`, :func:`resolve`), and the knobs page
(``python3 -m kosmos_bench.kosmos.config > docs/knobs.md``).

Six fields are `Point` fields (policy, queue_order, local_first, chunk, builder, mover); every
other field whose value differs from its default is a ``Point.knobs`` entry, hence part of
``Point.key()``, of the variant name (``kosmos[self,sm90,ce-mover,ce_slices=3]``), a sweep key
(``kosmos: {ce_slices: [2, 3]}``) and a CLI override (``--set ce_slices=3``). Nothing here is
read from the environment.

Results directories cited below are under ``results/``; the numbers are H200 measurements.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

POINT_FIELDS = ("policy", "queue_order", "local_first", "chunk", "builder", "mover")
QUEUE_ORDERS = ("demand", "fifo", "reverse", "random")
PEER = "peer"  # band_group: remote groups aligned to peer shards (schedule.peer_groups)

# Copy-bound shapes (rho = schedule.link_compute_ratio < COPY_BOUND_RHO: the QKV layers on the
# host fabric, rho <= 0.16; FC1 is 0.47-0.88): the builders wait for the link anyway, so what
# counts is fewer copies and a short tail: one copy per peer (merge), 1-band groups and the
# last group (copy_bound_tail_bands) in COPY_BOUND_SLICES K-slices. 1.5-3% faster than the
# defaults on the three QKV shapes (issue4-h200-20261203/timeline/t12-copy-bound, t13-halving);
# on FC1 merge costs 1-6% (t11), so only here.
COPY_BOUND_RHO = 0.3
COPY_BOUND_SLICES = 4
# Link-bound shapes (COPY_BOUND_RHO <= rho < schedule.BALANCED_RHO[0]: 70b FC1 on the host
# fabric, rho 0.47): the builders have slack, so remote groups need not start small (no ramp)
# and can be a peer's shard (8 bands: 11 copies instead of 17 at 8k tokens, ~2.5 us each), and
# the last group arrives in 3 K-slices (tail 41-44 us against 55-60 with 2; 4 cost more than
# they save). 70b FC1 8k / 16k back to back: 2213-2215 / 4348-4350 us against 2242-2252 /
# 4382-4395 (issue4-h200-20261203/probes/tail_probe-9-groups); groups of 16-32 bands or the
# ramp kept: 5-30 us slower.
LINK_BOUND_GROUP = 8
LINK_BOUND_SLICES = 3
# K-slices of the last remote group outside those regimes (sm90 + ce; 1 = whole bands): 2
# measured 1.0-1.5% faster than 1 and 4/8 on the copy-bound host shapes
# (issue4-h200-20261203/timeline/): the tail after the last byte drops from a tile to half.
DEFAULT_CE_SLICES = 2


def _to_bool(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    s = str(v).strip().lower()
    if s in ("1", "on", "true", "yes"):
        return True
    if s in ("0", "off", "false", "no"):
        return False
    raise ValueError


def _to_int(v, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool):
        raise ValueError
    n = v if isinstance(v, int) else int(str(v).strip())
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise ValueError
    return n


def _none_or(conv):
    def f(v):
        if v is None or (isinstance(v, str) and v.strip().lower() in ("none", "null", "auto", "")):
            return None
        return conv(v)
    return f


def _choice(*allowed):
    def f(v):
        if v not in allowed:
            raise ValueError
        return v
    return f


def _policy(v) -> str:
    from .decide import parse_policy

    if not isinstance(v, str):
        raise ValueError
    parse_policy(v)
    return v


def _ce_slices(v):
    """An int >= 1 (that many one-slice copies) or a split "3,1" (slices per copy), normalized."""
    from ..ce_plan import parse_split

    if isinstance(v, bool):
        raise ValueError
    if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()):
        return _to_int(v, lo=1)
    if isinstance(v, (tuple, list)):
        v = ",".join(str(int(x)) for x in v)
    parts = parse_split(str(v))
    if all(x == 1 for x in parts):  # "1,1,1": three one-slice copies, as 3
        return len(parts)
    text = ",".join(map(str, parts))
    return text if len(parts) > 1 else text + ","  # "2,": one copy of 2 slices (2 alone: two copies)


def _band_group(v):
    if isinstance(v, str) and v.strip() == PEER:
        return PEER
    return _to_int(v, lo=1)


@dataclass(frozen=True)
class Knob:
    """One configuration field: its parser (value or string -> value, ValueError when bad),
    the values it takes (words), the regime rule that picks its default (words) and what it
    does, with the measurement behind the default."""

    name: str
    parse: Callable[[Any], Any]
    values: str
    rule: str
    doc: str


FIELDS: dict[str, Knob] = {k.name: k for k in (
    Knob("policy", _policy, "self | fixed:<k> | predicted", "-",
         "WG roles: every WG decides per item (self), k fixed movers, or k from the cost model."),
    Knob("queue_order", _choice(*QUEUE_ORDERS), " | ".join(QUEUE_ORDERS), "-",
         "Order of the item queues (demand: consumer order; the others are ablations)."),
    Knob("local_first", _none_or(_to_bool), "on | off | auto", "auto: on for ag-gemm, off for gemm-rs",
         "Own bands (ag-gemm) / own destination (gemm-rs) first in the builder queue."),
    Knob("chunk", lambda v: _to_int(v, lo=1), "integer >= 1", "-", "Rows per mover band, in builder tiles (BM)."),
    Knob("builder", _none_or(_choice("mma", "sm90")), "mma | sm90 | auto",
         "auto: sm90 for ag-gemm and gemm-rs on sm_90 when TMA takes the shape (kosmos.builder.builder_choice)",
         "Builder kernel: portable mma.sync, or the Hopper wgmma+TMA builder (ag-gemm, gemm-rs)."),
    Knob("mover", _none_or(_choice("sm", "ce")), "sm | ce | auto",
         "auto: ce for ag-gemm, gemm-rs and ag-wgrad on the host fabric with the sm90 builder and "
         "policy self, else sm (kosmos.builder.mover_choice)",
         "Who moves: WGs (sm), or the copy engine (ce: host fabric only, every CTA builds). Host "
         "ag-gemm, sm90: ce 1.38x nccl-seq geomean, eff* 0.977 vs nccl-overlap 1.33x / 0.944; sm "
         "1.21x / 0.865 (H200, 2026-12-04). Host gemm-rs, sm90, default sweep: ce 1.65x / 0.948, sm "
         "1.20x / 0.689, nccl-overlap 1.49x / 0.857 (H100, 2026-12-05, "
         "results/main-job-h100-20261205). Host ag-wgrad, llama3-70b fc1 8k: ce 0.87x (tile) / "
         "1.09x (band), sm 0.81x / 1.00x, nccl-overlap 1.08x (2026-12-05, first call of the day, "
         "card not recorded)."),
    Knob("mover_bulk", _to_bool, "on | off", "-",
         "ag-gemm mma-builder movers use TMA bulk copies (needs the mma builder)."),
    Knob("max_inflight", _none_or(lambda v: _to_int(v, lo=0)), "integer >= 0 | auto",
         "auto: ceil(link / one mover's rate) on host and nvlink, none on local (ag-wgrad: capped there "
         "too, never below 1; schedule.max_inflight_movers)",
         "Policy self: cap on concurrent mover items of a rank (0: none; ag-wgrad: 1). Host ag-gemm with 48 movers "
         "ran 1.5x slower than with 8 (2026-12-02); simulated NVLink uncapped: self 21% behind "
         "predicted on one shape, capped: level or ahead on every shape."),
    Knob("ce_slices", _none_or(_ce_slices), "integer >= 1 | split like 3,1 | auto",
         f"auto: copy-bound {COPY_BOUND_SLICES}, link-bound {LINK_BOUND_SLICES}, else {DEFAULT_CE_SLICES}",
         "K-slices of the last remote group (sm90 + ce; 1: whole bands, no K-streaming); a split gives "
         "slices per copy. 2 beat 1 and 4/8 by 1.0-1.5% outside the regimes (issue4-h200-20261203/timeline)."),
    Knob("ce_merge", _none_or(_to_bool), "on | off | auto", "auto: on when copy-bound, else off",
         "One copy per peer before the sliced group (halving toward the tail). Copy-bound QKV 1.5-3% "
         "faster; FC1 1-6% slower (issue4-h200-20261203/timeline/t11-t13)."),
    Knob("band_group", _none_or(_band_group), "integer >= 1 | peer | auto",
         f"auto: copy-bound 1, link-bound {LINK_BOUND_GROUP}, else schedule.demand_group "
         "(6 when balanced, else ~sqrt(builders))",
         "Bands per remote demand group, or peer-aligned groups (schedule.peer_groups)."),
    Knob("tail_bands", _none_or(lambda v: _to_int(v, lo=1)), "integer >= 1 | auto",
         "auto: copy-bound copy_bound_tail_bands (one slice's link time covers a CTA's slice), else one wave",
         "Bands of the last (K-sliced) remote group. Copy-bound QKV: 1 band left tails of 52-112 us, "
         "2-4 bands 31-56 us (issue4-h200-20261203/probes/tail_probe-5-qkv)."),
    Knob("band_ramp", _none_or(_to_bool), "on | off | auto",
         "auto: link-bound off, else schedule.ramp_needed (only where the own bands do not cover the first copy)",
         "Remote groups start at one band and double. 405b FC1 8k: no ramp 4812 / 4813 us against "
         "4837 / 4976 (issue4-h200-20261204b)."),
    Knob("band_halve", _to_bool, "on | off", "-",
         "Remote groups halve toward the end (the work after the last band stays about one band)."),
    Knob("local_group", lambda v: _to_int(v, lo=0), "integer >= 0", "0: as band_group when set, else ~sqrt(builders)",
         "Bands per regular group of the rank's own bands (an ablation of the raster: L2 reuse, "
         "hence power at the 700 W limit)."),
    Knob("wgrad_items", _choice("tile", "band"), "tile | band",
         "band (measured ahead of tile on every ag-wgrad shape and layer step)",
         "ag-wgrad builder items: tile (one C tile over all of K, waiting per band inside it) or band "
         "((band group, tile) partials added in a fixed per-tile order into an fp32 carry, queued as "
         "the movers deliver). `sweep ag-wgrad --policy self` (host W=8, 12 shapes, mover auto = ce, "
         "H100, 2026-12-05): band 1.05x nccl-seq geomean, eff* 0.929, tile 0.92x / 0.797, "
         "nccl-overlap 1.03x / 0.921 (results/device-h100-20261205)."),
    Knob("wgrad_group", lambda v: _to_int(v, lo=0), "integer >= 0",
         "0: the fewest bands with >= 2048 K rows (carry traffic <= 1/8 of the operands'), at most a shard "
         "(schedule.wgrad_group_bands); the own shard is always one group",
         "wgrad_items band: bands per remote group; more than a shard's bands: groups of whole remote "
         "shards (schedule.wgrad_groups). H100 host W=8: two shards a group 10.90 vs 11.61 ms at 405b FC1, "
         "6.03 vs 5.92 at 16384 x 53248, three or four lose everywhere (docs/notes/wgrad-groups.md)."),
    Knob("math_wgs", _choice("joint", "pingpong"), "joint | pingpong", "-",
         "MoE kernels (op moe; moe-bwd and moe-step: both kernels of the build): the two math warpgroups on one "
         "128 x 256 tile, each tile's epilogue with the tensor cores idle (joint), or a warpgroup a 128 x 128 "
         "tile taking turns for the MMAs, one's epilogue under the other's mainloop (pingpong; "
         "libs.MOE_SM90_PP, docs/notes/pingpong-plan.md). Pingpong is built and CPU-checked, not yet run "
         "on a GPU: the default stays joint until both are timed."),
    Knob("ahead_blocks", lambda v: _to_int(v, lo=-1), "integer >= -1", "-",
         "sm90: claim the next tile this many k-blocks before the last load (-1: after the loads, "
         "2.6 us per tile lost; at the first load copy-bound FC1 2-3.5% slower). 24: 70b FC1 8k "
         "2246-2256 us, 405b FC1 4884 vs 4982 (issue4-h200-20261203 run37)."),
    Knob("spin_ns", lambda v: _to_int(v, lo=0, hi=1_000_000), "0..1000000", "-",
         "Sleep between two polls of a flag spin (Params.spin_ns)."),
    Knob("gemm_kernel", _choice("fused", "standalone"), "fused | standalone", "-",
         "op gemm: the fused AG+GEMM kernel at world 1, or the builder's standalone persistent GEMM."),
)}


@dataclass(frozen=True)
class KosmosConfig:
    """All KOSMOS tunables (``FIELDS`` documents each; ``None``: the regime / schedule rule)."""

    policy: str = "self"
    queue_order: str = "demand"
    local_first: bool | None = None
    chunk: int = 1
    builder: str | None = None
    mover: str | None = None
    mover_bulk: bool = False
    max_inflight: int | None = None
    ce_slices: int | str | None = None
    ce_merge: bool | None = None
    band_group: int | str | None = None
    tail_bands: int | None = None
    band_ramp: bool | None = None
    band_halve: bool = True
    local_group: int = 0
    wgrad_items: str = "band"
    wgrad_group: int = 0
    math_wgs: str = "joint"
    ahead_blocks: int = 24
    spin_ns: int = 32
    gemm_kernel: str = "fused"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce(f.name, getattr(self, f.name)))

    def replace(self, **kw) -> "KosmosConfig":
        return dataclasses.replace(self, **kw)

    def knobs(self) -> tuple[tuple[str, Any], ...]:
        """Sorted (name, value) of the non-Point fields that differ from their default."""
        d = DEFAULTS
        return tuple(sorted((n, getattr(self, n)) for n in KNOB_FIELDS if getattr(self, n) != getattr(d, n)))

    @classmethod
    def from_point(cls, p) -> "KosmosConfig":
        """A point's configuration (its Point fields and its knobs)."""
        return cls(policy=p.policy or "self", queue_order=p.queue_order or "demand", local_first=p.local_first,
                   chunk=p.chunk or 1, builder=p.builder, mover=p.mover, **dict(p.knobs))


def coerce(name: str, value):
    """A field's value from a typed value or a string; ValueError naming field and values."""
    k = FIELDS.get(name)
    if k is None:
        raise ValueError(f"unknown KOSMOS setting {name!r}; known: {', '.join(FIELDS)}")
    default = getattr(KosmosConfig, name, None)
    if value is None and default is None:
        return None
    try:
        return k.parse(value)
    except (ValueError, TypeError):
        raise ValueError(f"{name}={value!r}: expected {k.values}") from None


def parse_set(items) -> dict:
    """``["ce_slices=3", "band_ramp=off"]`` -> {name: value}; ValueError (one line) when bad."""
    out = {}
    for it in items or ():
        name, sep, v = str(it).partition("=")
        if not sep:
            raise ValueError(f"--set {it!r}: expected name=value (names: {', '.join(FIELDS)})")
        out[name.strip()] = coerce(name.strip(), v.strip())
    return out


def format_value(v) -> str:
    """A knob value as the variant name and --set write it (on/off for booleans)."""
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


KNOB_FIELDS = tuple(f for f in FIELDS if f not in POINT_FIELDS)
DEFAULTS = KosmosConfig()


# ---------------------------------------------------------------------------------------
# Regimes: the copy-engine defaults per host-fabric shape (DeepEP get_dispatch_config style).


def regime_of(n_loc: int, builders: int) -> str:
    """'copy-bound', 'link-bound' or 'compute' for a host-fabric sm90 rank GEMM of n_loc
    columns on ``builders`` CTAs (rho = schedule.link_compute_ratio at the sm90 model)."""
    from .. import schedule as S
    from . import builder

    rho = S.link_compute_ratio(n_loc, builders, "host", builder.schedule_model("host"))
    return "copy-bound" if rho < COPY_BOUND_RHO else ("link-bound" if rho < S.BALANCED_RHO[0] else "compute")


def copy_bound_tail_bands(n_loc: int, builders: int) -> int:
    """Bands of a copy-bound shape's last (K-sliced) group: enough that one K-slice of the
    group's bands takes the link at least as long as a CTA needs for that slice of its tile
    (per-CTA compute/link ratio rho * builders / tiles per band, ~2.2 on the H200 host fabric);
    at most one wave of tiles."""
    from .. import schedule as S
    from . import builder

    nt = S.cdiv(n_loc, builder.BN)
    rho = S.link_compute_ratio(n_loc, builders, "host", builder.schedule_model("host"))
    return max(1, min(math.ceil(rho * builders / nt), builders // nt))


# Regime -> defaults of the fields left unset (None); a callable gets (n_loc, builders).
REGIMES: dict[str, dict[str, Any]] = {
    "": {"ce_slices": DEFAULT_CE_SLICES, "ce_merge": False, "band_group": None, "tail_bands": None,
         "band_ramp": None},
    "compute": {"ce_slices": DEFAULT_CE_SLICES, "ce_merge": False, "band_group": None, "tail_bands": None,
                "band_ramp": None},
    "link-bound": {"ce_slices": LINK_BOUND_SLICES, "ce_merge": False, "band_group": LINK_BOUND_GROUP,
                   "tail_bands": None, "band_ramp": False},
    "copy-bound": {"ce_slices": COPY_BOUND_SLICES, "ce_merge": True, "band_group": 1,
                   "tail_bands": copy_bound_tail_bands, "band_ramp": None},
}


@dataclass(frozen=True)
class Resolved:
    """A configuration with the regime's defaults filled in, for one rank GEMM."""

    k_stream: bool  # the last group arrives in K-slices the builders stream (sm90 + ce)
    regime: str  # "copy-bound", "link-bound", "compute", or "" (no K-streaming / not host)
    split: tuple[int, ...]  # slices per copy of the sliced group (sum = slices)
    merge: bool  # one copy per peer before the sliced group
    band_group: int | str | None  # schedule.build_schedule band_group
    tail_bands: int | None  # bands of the last remote group (None: one wave of tiles)
    ramp: bool | None  # remote groups start small (None: schedule.ramp_needed)
    halve: bool  # remote groups shrink toward the end
    local_group: int  # bands per own-band group (0: the schedule's rule)

    @property
    def slices(self) -> int:
        return sum(self.split)


def resolve(cfg: KosmosConfig, n_loc: int, builders: int, streams: bool, host: bool) -> Resolved:
    """The settings of a rank GEMM of n_loc columns on ``builders`` CTAs. ``streams``:
    copy-engine movers with the sm90 builder (the only builder with a slice wait); ``host``:
    the host fabric, where the regime (REGIMES) picks the defaults of the unset fields."""
    from ..ce_plan import parse_split

    first = cfg.ce_slices if cfg.ce_slices is not None else DEFAULT_CE_SLICES
    k_stream = streams and sum(parse_split(first)) > 1
    regime = regime_of(n_loc, builders) if k_stream and host else ""
    rules = REGIMES[regime]

    def pick(name):
        v = getattr(cfg, name)
        if v is not None:
            return v
        d = rules[name]
        return d(n_loc, builders) if callable(d) else d

    return Resolved(k_stream, regime, parse_split(pick("ce_slices")), bool(pick("ce_merge")), pick("band_group"),
                    pick("tail_bands"), pick("band_ramp"), cfg.band_halve, cfg.local_group)


# ---------------------------------------------------------------------------------------
# The knobs page.


def knobs_markdown() -> str:
    """docs/knobs.md: one row per field (a CPU test fails when the committed page is stale)."""
    lines = ["# KOSMOS knobs", "",
             "Generated by `python3 -m kosmos_bench.kosmos.config > docs/knobs.md` from",
             "`kosmos_bench/kosmos/config.py`; do not edit. Every field is a sweep key",
             "(`kosmos: {ce_slices: [2, 3]}`) and a CLI override (`--set ce_slices=3`); a field that",
             "differs from its default is part of the point's key and of its variant name",
             "(`kosmos[self,sm90,ce-mover,ce_slices=3]`). Regimes (host fabric, sm90 builder, copy-engine",
             f"movers; rho = schedule.link_compute_ratio): copy-bound rho < {COPY_BOUND_RHO}, link-bound",
             "rho < schedule.BALANCED_RHO[0], compute otherwise. Removed knobs: docs/notes/deleted-knobs.md.", "",
             "| name | default | values | regime rule | what it does |", "|---|---|---|---|---|"]
    for k in FIELDS.values():
        d = getattr(DEFAULTS, k.name)
        default = "auto" if d is None else format_value(d)
        cells = [f"`{k.name}`", default, k.values.replace(" | ", ", "), k.rule, k.doc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(knobs_markdown(), end="")
