"""Sweep files -> validated, expanded list of `Point`s.

A sweep file (YAML) names an op, implementations, world sizes, dtypes, a fabric and shapes,
given explicitly and/or from the model catalog::

    op: ag-gemm
    impls: [kosmos, nccl-seq, nccl-overlap]
    world: [8]
    dtype: [bf16]
    fabric: auto            # auto | nvlink | local | host | gloo
    shapes: [{M: 8192, N: 8192, K: 8192}]
    models: {names: [llama3-70b], tokens: [8192, 16384], layers: [qkv, fc1]}
    kosmos: {policy: [self, fixed:8, predicted], queue_order: [demand], local_first: [true], chunk: [1],
             builder: [mma, sm90], mover: [auto, sm, ce], ce_slices: [2, 3]}   # any KosmosConfig field

Op ``moe`` takes its layers from a ``moe:`` section instead of shapes/models (a grid; presets
in ops/moe_math.py, tokens per rank, routing uniform | zipf:<s>, experts per rank, null = the
preset's)::

    moe: {presets: [deepseek-v3, qwen3-235b-a22b], tokens: [8192], routing: [uniform, zipf:1.2],
          experts_per_rank: [null]}

The ``kosmos:`` section takes every field of ``kosmos_bench.kosmos.config.KosmosConfig`` as a
value or a list (a grid; docs/knobs.md lists them).
    timing: {warmup: 5, reps: 20}

Errors name the file, the key and what was expected (`SpecError`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .models import LAYER_OPS, MODELS, get_model, layers_for, op_shape
from .point import DTYPES, FABRICS, MOE_OPS, OPS, Point

KNOWN_KEYS = {"op", "impls", "world", "dtype", "fabric", "shapes", "models", "kosmos", "timing", "description", "profile",
              "moe"}
MOE_KEYS = {"presets", "tokens", "routing", "experts_per_rank"}
KOSMOS_KEYS = {"policy": ["self"], "queue_order": ["demand"], "local_first": [True], "chunk": [1], "builder": [None],
               "mover": [None]}  # the Point fields' defaults; the other configuration fields: [their default]
# Implementations that take the kosmos knobs (policy, queue order, ...).
KNOB_IMPLS = {"kosmos"}


class SpecError(ValueError):
    """A malformed sweep file or option; the message is one line naming file and key."""


@dataclass(frozen=True)
class Shape:
    M: int
    N: int
    K: int
    model: str | None = None
    layer: str | None = None
    tokens: int | None = None
    moe: str | None = None  # op moe: preset, routing, experts per rank (Point fields of the same names)
    routing: str | None = None
    experts: int | None = None


@dataclass
class Sweep:
    name: str
    source: str
    op: str
    impls: list[str]
    world: list[int]
    dtype: list[str]
    fabric: str
    shapes: list[Shape]
    kosmos: dict = field(default_factory=lambda: dict(KOSMOS_KEYS))
    warmup: int = 5
    reps: int = 20
    profile: str | None = None
    description: str = ""
    concurrent: bool = True


def sweep_dirs() -> list[Path]:
    """Where sweep names are looked up: ./sweeps, then the sweeps/ shipped beside the package."""
    return [Path.cwd() / "sweeps", Path(__file__).resolve().parent.parent / "sweeps"]


def find_sweep(name_or_path: str) -> Path | None:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p if p.exists() else None
    for d in sweep_dirs():
        for cand in (d / f"{name_or_path}.yaml", d / f"{name_or_path}.yml"):
            if cand.exists():
                return cand
    return None


def list_sweeps() -> list[Path]:
    seen, out = set(), []
    for d in sweep_dirs():
        for f in sorted(d.glob("**/*.yaml")):
            rel = f.relative_to(d).as_posix()
            if rel not in seen:
                seen.add(rel)
                out.append(f)
    return out


def _as_list(v, src: str, key: str, typ, allowed=None) -> list:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise SpecError(f"{src}: {key}: expected a non-empty value or list")
    for x in vals:
        if typ is int and (isinstance(x, bool) or not isinstance(x, int) or x < 1):
            raise SpecError(f"{src}: {key}: expected positive integers, got {x!r}")
        if typ is str and not isinstance(x, str):
            raise SpecError(f"{src}: {key}: expected strings, got {x!r}")
        if typ is bool and not isinstance(x, bool):
            raise SpecError(f"{src}: {key}: expected true/false, got {x!r}")
        if allowed is not None and x not in allowed:
            raise SpecError(f"{src}: {key}: {x!r} is not one of {', '.join(map(str, allowed))}")
    return vals


def parse_sweep(data, src: str, name: str = "sweep") -> Sweep:
    """Validate a parsed YAML document into a Sweep."""
    if not isinstance(data, dict):
        raise SpecError(f"{src}: expected a mapping of keys (op, impls, world, shapes, ...), got {type(data).__name__}")
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise SpecError(f"{src}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KNOWN_KEYS))}")
    if "op" not in data:
        raise SpecError(f"{src}: op: missing; expected one of {', '.join(OPS)}")
    op = data["op"]
    if op not in OPS:
        raise SpecError(f"{src}: op: {op!r} is not one of {', '.join(OPS)}")
    impls = _as_list(data.get("impls", ["kosmos", "nccl-seq", "nccl-overlap"]), src, "impls", str)
    world = _as_list(data.get("world", [8]), src, "world", int)
    dtype = _as_list(data.get("dtype", ["bf16"]), src, "dtype", str, DTYPES)
    fabric = data.get("fabric", "auto")
    if fabric not in ("auto",) + FABRICS:
        raise SpecError(f"{src}: fabric: {fabric!r} is not one of auto, {', '.join(FABRICS)}")

    shapes: list[Shape] = []
    for i, s in enumerate(data.get("shapes") or []):
        key = f"shapes[{i}]"
        if not isinstance(s, dict) or set(s) != {"M", "N", "K"}:
            raise SpecError(f"{src}: {key}: expected a mapping with exactly M, N, K, got {s!r}")
        for d in "MNK":
            _as_list(s[d], src, f"{key}.{d}", int)
        shapes.append(Shape(s["M"], s["N"], s["K"]))
    models = data.get("models")
    if models is not None:
        if not isinstance(models, dict) or not {"names", "tokens"} <= set(models) or set(models) - {"names", "tokens", "layers"}:
            raise SpecError(f"{src}: models: expected a mapping with names, tokens and optional layers")
        names = _as_list(models["names"], src, "models.names", str, list(MODELS))
        tokens = _as_list(models["tokens"], src, "models.tokens", int)
        default_layers = layers_for(op)
        layers = _as_list(models.get("layers", default_layers), src, "models.layers", str, [*LAYER_OPS, "layer"])
        for l in layers:
            if l not in default_layers:
                raise SpecError(f"{src}: models.layers: {l!r} is a {LAYER_OPS.get(l, l)} layer, not {op}")
        for n, t, l in itertools.product(names, tokens, layers):
            M, N, K = op_shape(get_model(n), l, t, op)
            shapes.append(Shape(M, N, K, n, l, t))
    if (op in MOE_OPS) != ("moe" in data):
        raise SpecError(f"{src}: moe: " + (f"op {op} takes its layers from a moe: section" if op in MOE_OPS else
                                           f"a moe: section belongs to op {'/'.join(MOE_OPS)}, not {op}"))
    if op in MOE_OPS:
        if shapes:
            raise SpecError(f"{src}: shapes/models: op {op} takes its layers from the moe: section only")
        shapes = parse_moe(data["moe"], src)
    if not shapes:
        raise SpecError(f"{src}: shapes/models: no shapes given; expected shapes: [{{M:, N:, K:}}] or models: {{names:, tokens:}}")

    kosmos = parse_kosmos(data.get("kosmos") or {}, src)
    timing = data.get("timing") or {}
    if not isinstance(timing, dict) or set(timing) - {"warmup", "reps", "concurrent"}:
        raise SpecError(f"{src}: timing: expected a mapping with warmup, reps and/or concurrent")
    warmup = _as_list(timing.get("warmup", 5), src, "timing.warmup", int)[0]
    reps = _as_list(timing.get("reps", 20), src, "timing.reps", int)[0]
    concurrent = _as_list(timing.get("concurrent", True), src, "timing.concurrent", bool)[0]
    profile = data.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise SpecError(f"{src}: profile: expected a simulator profile name")
    return Sweep(name, src, op, impls, world, dtype, fabric, shapes, kosmos, warmup, reps, profile,
                 str(data.get("description", "")), concurrent)


def parse_moe(mdata, src: str) -> list[Shape]:
    """The ``moe:`` section -> one Shape per (preset, tokens, routing, experts per rank)."""
    from .ops import moe_math as mm
    from .ops.moe import preset_point_dims

    if not isinstance(mdata, dict) or not {"presets", "tokens"} <= set(mdata) or set(mdata) - MOE_KEYS:
        raise SpecError(f"{src}: moe: expected a mapping with presets, tokens and optional routing, experts_per_rank")
    presets = _as_list(mdata["presets"], src, "moe.presets", str, list(mm.PRESETS))
    tokens = _as_list(mdata["tokens"], src, "moe.tokens", int)
    routings = _as_list(mdata.get("routing", "uniform"), src, "moe.routing", str)
    for r in routings:
        try:
            mm.zipf_s(r)
        except ValueError as e:
            raise SpecError(f"{src}: moe.routing: {e}") from None
    experts = mdata.get("experts_per_rank", [None])
    experts = experts if isinstance(experts, list) else [experts]
    if not experts or any(e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 1) for e in experts):
        raise SpecError(f"{src}: moe.experts_per_rank: expected positive integers or null (the preset's), got {experts!r}")
    return [Shape(**preset_point_dims(pr, t), tokens=t, moe=pr, routing=ro, experts=e)
            for pr, t, ro, e in itertools.product(presets, tokens, routings, experts)]


def parse_kosmos(kdata, src: str) -> dict:
    """The ``kosmos:`` section: {field: [values]} for every configuration field (FIELDS), the
    Point fields defaulting to KOSMOS_KEYS and the others to [their default]."""
    from .kosmos.config import DEFAULTS, FIELDS, KNOB_FIELDS, coerce

    kosmos = dict(KOSMOS_KEYS)
    kosmos.update({n: [getattr(DEFAULTS, n)] for n in KNOB_FIELDS})
    if not isinstance(kdata, dict) or set(kdata) - set(FIELDS):
        bad = ", ".join(sorted(set(kdata) - set(FIELDS))) if isinstance(kdata, dict) else type(kdata).__name__
        raise SpecError(f"{src}: kosmos: unknown key(s) {bad}; known: {', '.join(FIELDS)}")
    for name, v in kdata.items():
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise SpecError(f"{src}: kosmos.{name}: expected a non-empty value or list")
        out = []
        for x in vals:
            try:
                out.append(coerce(name, x))
            except ValueError:
                raise SpecError(f"{src}: kosmos.{name}: {x!r} is not one of {FIELDS[name].values}") from None
        kosmos[name] = out
        if name == "local_first" and None in kosmos[name]:
            raise SpecError(f"{src}: kosmos.local_first: expected true/false")
    return kosmos


def load_sweep(name_or_path: str) -> Sweep:
    """Load a sweep by file path or by name (sweeps/<name>.yaml); ops name their default sweep."""
    path = find_sweep(name_or_path)
    if path is None:
        known = ", ".join(sorted({p.stem for p in list_sweeps()}))
        raise SpecError(f"{name_or_path}: no such sweep file or sweep name (known sweeps: {known})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML{where}: {first}") from None
    return parse_sweep(data, str(path), path.stem)


def expand(sweep: Sweep, *, backend: str, fabric: str, impls: list[str] | None = None,
           worlds: list[int] | None = None, profile: str | None = None, trace: bool = False,
           reps: int | None = None, warmup: int | None = None,
           policies: list[str] | None = None, concurrent: bool | None = None,
           settings: dict | None = None) -> list[Point]:
    """Grid expansion: shapes x worlds x dtypes x impls (x kosmos configuration for kosmos).

    `backend` and `fabric` must already be resolved (no 'auto'). Point order groups by world
    so each group of processes is started once. ``settings`` ({field: value}, the CLI's
    ``--set``) fixes configuration fields, replacing the sweep's lists.
    """
    from .kosmos.config import KNOB_FIELDS

    impls = impls or sweep.impls
    kn = dict(sweep.kosmos)
    if policies:
        kn["policy"] = policies
    for name, v in (settings or {}).items():
        kn[name] = [v]
    knob_names = [n for n in KNOB_FIELDS if n in kn]
    points = []
    for world in worlds or sweep.world:
        for shape, dtype, impl in itertools.product(sweep.shapes, sweep.dtype, impls):
            base = Point(op=sweep.op, impl=impl, M=shape.M, N=shape.N, K=shape.K, world=world, dtype=dtype,
                         fabric=fabric, backend=backend, warmup=warmup or sweep.warmup, reps=reps or sweep.reps,
                         trace=trace, concurrent=sweep.concurrent if concurrent is None else concurrent,
                         model=shape.model, layer=shape.layer, tokens=shape.tokens,
                         moe=shape.moe, routing=shape.routing, experts=shape.experts,
                         sweep=sweep.name, profile=(profile or sweep.profile) if backend == "sim" else None)
            if impl in KNOB_IMPLS:
                for pol, qo, lf, ch, bu, mv, *kv in itertools.product(
                        kn["policy"], kn["queue_order"], kn["local_first"], kn["chunk"], kn["builder"], kn["mover"],
                        *(kn[n] for n in knob_names)):
                    points.append(base.replace(policy=pol, queue_order=qo, local_first=lf, chunk=ch, builder=bu,
                                               mover=mv, knobs=tuple(zip(knob_names, kv))))
            else:
                points.append(base)
    seen, unique = set(), []
    for p in points:  # a shape listed twice (explicit + model), or mover auto and the mover it is, is measured once
        k = _same_as(p).key()
        if k not in seen:
            seen.add(k)
            unique.append(p)
    return unique


def _same_as(p: Point) -> Point:
    """The point as it runs wherever that is known before the device is: mover auto becomes 'sm'
    where ``mover_choice`` gives sm for every builder the device could pick (off the host
    fabric, policies fixed / predicted, the mma builder), so ``mover: [auto, sm]`` yields one
    point there and two (auto = ce with the sm90 builder, and sm) for the host ops of
    ``CE_AUTO_OPS`` under policy self. The first listed is kept (auto keeps the default's key)."""
    if p.impl not in KNOB_IMPLS or p.mover is not None or p.op in ("gemm", *MOE_OPS):
        return p
    from .kosmos.builder import mover_choice

    if mover_choice(None, p.op, p.fabric, p.builder or "sm90", p.policy or "self") == "sm":
        return p.replace(mover="sm")
    return p
