"""kosmos: the self-scheduling persistent AG+GEMM and GEMM+RS kernels of csrc/.

One implementation object, ``kosmos``, for ops ag-gemm and gemm-rs on three fabrics:

* ``local``  — W emulated ranks in ONE cooperative launch on one GPU; rank r owns WGs
  ``schedule.wg_starts(G, W)[r:r+2]``; peers' buffers are other device allocations.
* ``host``   — rank-0 view: peers' A shards (ag-gemm) and peers' partial contributions to
  band 0 (gemm-rs, computed with torch in prepare) live in pinned host memory and cross
  PCIe; rank 0 pushes its partials for peers into pinned host memory (gemm-rs). Peers do
  not execute.
* ``nvlink`` — one process per GPU; peer pointers from torch symmetric memory (flags and
  the buffers peers touch live in one symmetric allocation). Untested until a multi-GPU
  machine is available.

Point knobs: ``policy`` (self | fixed:k | predicted), ``queue_order``, ``local_first``,
``chunk``; bf16 only. Extra ``prepare`` keywords: ``num_wgs`` (default: all co-resident),
``timeout_s`` (watchdog, default ``$KOSMOS_TIMEOUT_S`` or 5 s), ``debug_skip_rank`` (local
fabric: that emulated rank never signals; the watchdog test), ``trace_cap`` (records/WG),
``max_inflight`` (policy self: override the schedule's in-flight mover cap; 0 = none),
``mover_bulk`` (ag-gemm movers use TMA bulk copies; default ``$KOSMOS_MOVER_BULK`` or off),
``mover`` ('sm' default; 'ce': host-fabric ag-gemm bands move by the copy engine, flags
released by stream memory operations, every WG builds; default ``$KOSMOS_MOVER``; as a
Point knob ``mover``),
``builder`` ('mma': the portable mma.sync builder, 256-thread WGs, 128x128 tiles; 'sm90':
ag-gemm, the Hopper wgmma+TMA builder in 384-thread CTAs, one per SM, 128x256 tiles,
csrc/ag_gemm_sm90.cu; default ``$KOSMOS_BUILDER``, else picked by device: sm90 for ag-gemm
on sm_90 when the shape suits it, mma otherwise — ``kernels.ag_sm90.builder_choice``).

Runner: ``run()`` launches without synchronizing (and first raises :class:`WatchdogError`
if an earlier call timed out); ``check()`` synchronizes and raises for this call;
``run_traced()`` runs once with tracing and returns the role timeline (rank, wg, sm, role,
item, t0_ns, t1_ns; t0 relative to the call's first record); ``info`` holds extra columns.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
from dataclasses import dataclass

import numpy as np

from .. import schedule as S
from ..point import Point
from ..runtime.knobs import env_int
from .base import common_unsupported

DEFAULT_TIMEOUT_S = float(os.environ.get("KOSMOS_TIMEOUT_S", "5"))
DEFAULT_TRACE_CAP = 4096
# K-slices of the last remote group (sm90 + ce; 1 = whole bands). 2 measured 1.0-1.5% faster than 1
# and 4/8 on the copy-bound host shapes (results/issue4-h200-20261203/timeline/): the tail after
# the last byte drops from a tile to half a tile, and rows of K/2 still copy at full speed.
DEFAULT_CE_SLICES = 2
DEFAULT_CE_MERGE = "0"
# The last copy's releases on the copy stream (KOSMOS_CE_TAIL_INLINE; 0: all on the flag
# stream). The flag stream's release lands 9-18 us after the last byte (an event hop); inline,
# the tail after the last byte is 5-13 us shorter on 70b FC1 / QKV
# (results/issue4-h200-20261203/probes/tail_probe-*).
DEFAULT_CE_TAIL_INLINE = "1"
# KOSMOS_CE_HEAD_MAIN=1: the plan's first copy, cut to its first band, goes on the main stream
# before the kernel (no event hop before the first byte; the kernel starts when it has landed).
# Off: measured back to back on 70b FC1 8k (probes/tail_probe-6-head-main.parquet, 2026-12-03
# 21:05) the call then serialises: 3423-3430 us (tail after the last byte 1050 us, i.e. the
# whole GEMM) against 2248-2249 us off; why the kernel waits for the copies is not understood.
DEFAULT_CE_HEAD_MAIN = "0"
# KOSMOS_CE_KERNEL_SIDE=1: the plan's copies on the caller's (main) stream, the kernel on a stream
# of its own (kernel_stream), so that the first byte leaves without the ~10 us event hop from
# main to the copy stream and the kernel, whose first remote band lands a copy later anyway,
# takes the hop instead; main then waits for the kernel. Off: 120-150 us slower on 70b FC1 8k /
# 16k (2347-2375 vs 2223 us; results/issue4-h200-20261203/probes/tail_probe-9-groups, call 5),
# cause not measured (the probe's span events sit on the plan's copy stream, empty in this mode).
# An ablation, like KOSMOS_CE_HEAD_MAIN.
DEFAULT_CE_KERNEL_SIDE = "0"
# KOSMOS_CE_SHARED_RELEASE (default 1): one flag release per copy, the bands of a copy sharing
# its first band's flag (ce_plan.share_flags). 0: a release per band, as before 2026-12-04: each
# is a fenced stream write, and they landed ~11 us apart, an 8-band copy's last band ~80 us
# after its first (probes/split_trace_items-10-tail.parquet, tile starts by band).
DEFAULT_CE_SHARED_RELEASE = "1"
# Copy-bound shapes (rho = schedule.link_compute_ratio < COPY_BOUND_RHO: the QKV layers on the
# host fabric, rho <= 0.16; FC1 is 0.47-0.88): the builders wait for the link anyway, so what
# counts is fewer copies and a short tail: one copy per peer (merge), 1-band groups and the
# last group (copy_bound_tail_bands) in COPY_BOUND_SLICES K-slices. 1.5-3% faster than the
# defaults on the three QKV shapes (timeline/t12-copy-bound.parquet, t13-halving); on FC1 merge
# costs 1-6% (t11), so only here.
COPY_BOUND_RHO = 0.3
COPY_BOUND_SLICES = 4
# Link-bound shapes (COPY_BOUND_RHO <= rho < schedule.BALANCED_RHO[0]: 70b FC1 on the host
# fabric, rho 0.47): the builders have slack, so remote groups need not start small (no ramp)
# and can be a peer's shard (8 bands), which saves the copies where groups straddle peers (11
# instead of 17 at 8k tokens, ~2.5 us each), and the last group arrives in 3 K-slices (a third
# of each tile's K after the last byte: tail 41-44 us against 55-60 with 2; 4 slices' narrower
# copies cost more than they save). Back to back on 70b FC1 8k / 16k, fresh processes
# (results/issue4-h200-20261203/probes/tail_probe-9-groups.parquet, session of 2026-12-03 22:27):
# 2213-2215 / 4348-4350 us against 2242-2252 / 4382-4395 for the previous defaults (copy alone
# 2138-2146 / 4253-4261): efficiency 0.966-0.970 / 0.978-0.980. Groups of 16 / 24 / 32 bands
# and the ramp kept: 5-30 us slower.
LINK_BOUND_GROUP = 8
LINK_BOUND_SLICES = 3
# The sm90 AG kernel's lookahead claim (KOSMOS_AHEAD_BLOCKS; csrc/ag_gemm_sm90.cu kAheadBlocks):
# the scheduler claims the next ready tile this many k-blocks before the current tile's last
# load, so the claim's chain of global accesses overlaps the tile; -1: no lookahead (claim
# after the loads, as before 2026-12-03: 2.6 us per tile lost on the host fabric), a large
# value: at the tile's first load (ready tiles then went to busy WGs: copy-bound FC1 2-3.5%
# slower). 24 keeps both: run37 (results/issue4-h200-20261203/, session 18:11-21:11) 70b FC1 8k
# 2246-2256 us (tile start 2320), 405b FC1 8k 4884 (none 4982).
DEFAULT_AHEAD_BLOCKS = 24
# Split tiles (sm90 builder; KOSMOS_SPLIT_K="bands:parts", e.g. "4:4"; "0": none): the last
# `bands` remote bands are one-band groups whose tiles are `parts` K-parts each (schedule
# AG_PART), so that the work left when the last band lands is a part of a tile on up to parts x
# tiles CTAs instead of the last K-slice of a tile on as many CTAs as tiles. Off: on 70b FC1
# (8k / 16k tokens) every setting lengthened the tail after the last byte (79-143 us vs 53-82,
# results/issue4-h200-20261203/probes/tail_probe-7-split, -8-split-ahead): a quarter part runs
# 31-36 us, not the ~23 of a quarter tile (fill, fp32 partial out, fence, the last part's sum of
# 4 x 128 KB), so split bands cost ~45% more CTA time and their parts queue behind each other
# (probes/split_trace-70b-fc1-8k.parquet). An ablation.
DEFAULT_SPLIT_K = "0"
# SM-streamed tail (sm90 + copy-engine movers; KOSMOS_CE_SM_TAIL="bands:slices", e.g. "8:16";
# "0": none): the last `bands` remote bands are pulled by the CTAs themselves (schedule
# AG_PULL_K: one item per band and K-slice, released in K order) in groups of one wave of
# tiles, once the copy engine's last copy has landed; the engine copies the rest (whole bands
# unless KOSMOS_CE_SLICES says otherwise). Their tiles then stream K as it arrives slice by
# slice, without the engine's ~2.5 us per copy, so the work left at the last byte is one
# slice of each tile instead of half a tile (~50 us at K = 8192). The SMs pull pinned host
# memory at 48-50 GB/s against the engine's 52-53 (probes/pcie_aggregate-*), which those bands
# pay. Off: inside the fused call they pulled at only 33-41 GB/s (16 MB in 415-440 us; 14-40
# mover slots, 4-32 slices per band: the CTAs pulling are the ones not waiting inside tail tiles,
# each claim costs a chain of global round trips), so every setting lost 25-100 us on 70b FC1
# 8k to what the engine would have moved (results/issue4-h200-20261203/probes/tail_probe-9-groups,
# calls 2-3). Correct and bitwise equal to the engine's plan (tests/test_kosmos_gpu.py). An
# ablation.
DEFAULT_CE_SM_TAIL = "0"


def _bands_colon(name: str, default: str, what: str, env=None) -> tuple[int, int] | None:
    """A "0" or "bands:<what>" knob (both >= 1, e.g. 4:4): None for "0"."""
    v = (os.environ if env is None else env).get(name, default).strip()
    if v in ("", "0"):
        return None
    try:
        bands, n = (int(x) for x in v.split(":"))
    except ValueError:
        bands = n = 0
    if bands < 1 or n < 1:
        raise ValueError(f"{name}={v!r}: expected 0 or bands:{what} with both >= 1 (e.g. 4:4)")
    return bands, n


def split_k_setting(env=None) -> tuple[int, int]:
    """(bands, parts) of KOSMOS_SPLIT_K ("0" or "bands:parts"; (0, 1): no split)."""
    v = _bands_colon("KOSMOS_SPLIT_K", DEFAULT_SPLIT_K, "parts", env)
    return v if v and v[1] > 1 else (0, 1)


def sm_tail_setting(env=None) -> tuple[int, int]:
    """(bands, slices) of KOSMOS_CE_SM_TAIL ("0" or "bands:slices"; (0, 0): off)."""
    return _bands_colon("KOSMOS_CE_SM_TAIL", DEFAULT_CE_SM_TAIL, "slices", env) or (0, 0)


# Sleep between two polls of a flag spin (Params.spin_ns; KOSMOS_SPIN_NS).
DEFAULT_SPIN_NS = 32

# The CE plans' two streams (copies, flag releases), made once per device and process
# (kosmos_stream_create: non-blocking, never used by anything but CE plans) and shared by every
# runner. Streams made per runner left every second runner of a process 5% slower, call after
# call (70b FC1 8k: 2238 / 2360 / 2236 / 2357 us for four runners made one after another, with
# or without address reuse; results/issue4-h200-20261203/probes/b2b_runner_parity.parquet), and
# torch's pool streams are worse (t14: releases behind earlier copies). Runners of one device run
# one after another, so one pair in stream order is enough.
_PLAN_STREAMS: dict[int, list[int]] = {}


def make_stream_pair(lib, dev_index: int, n: int = 2) -> list[int]:
    """n (two) new kosmos_stream_create streams on device dev_index (none left behind on failure)."""
    import torch

    made: list[int] = []
    with torch.cuda.device(dev_index):
        for _ in range(n):
            h = ctypes.c_void_p()
            if lib.kosmos_stream_create(ctypes.byref(h)) != 0:
                from .. import kernels

                why = kernels.last_error(lib)
                for m in made:
                    lib.kosmos_stream_destroy(ctypes.c_void_p(m))
                raise RuntimeError(f"kosmos_stream_create failed: {why}")
            made.append(h.value)
    return made


def plan_streams(lib, dev_index: int) -> list[int]:
    """The CE plans' [copy stream, flag stream] handles on device dev_index (made on first use)."""
    if dev_index not in _PLAN_STREAMS:
        _PLAN_STREAMS[dev_index] = make_stream_pair(lib, dev_index)
    return _PLAN_STREAMS[dev_index]


_KERNEL_STREAMS: dict[int, int] = {}


def kernel_stream(lib, dev_index: int) -> int:
    """The stream the fused kernel runs on with KOSMOS_CE_KERNEL_SIDE=1 (one per device, shared
    like the plan's pair)."""
    if dev_index not in _KERNEL_STREAMS:
        _KERNEL_STREAMS[dev_index] = make_stream_pair(lib, dev_index, 1)[0]
    return _KERNEL_STREAMS[dev_index]


def ce_regime(n_loc: int, builders: int) -> str:
    """'copy-bound', 'link-bound' or 'compute': which CE-plan defaults a host-fabric shape gets
    (above; the runner and the simulator decide the same way)."""
    from ..kernels import ag_sm90

    rho = S.link_compute_ratio(n_loc, builders, "host", ag_sm90.schedule_model("host"))
    return "copy-bound" if rho < COPY_BOUND_RHO else ("link-bound" if rho < S.BALANCED_RHO[0] else "compute")


def copy_bound_tail_bands(n_loc: int, builders: int) -> int:
    """Bands of a copy-bound shape's last (K-sliced) group: enough that one K-slice of the
    group's bands takes the link at least as long as a CTA needs for that slice of its tile
    (that per-CTA compute/link ratio is rho * builders / tiles per band, ~2.2 on the H200 host
    fabric), so every tile has only its last slice's k-blocks left when the last byte lands; at
    most one wave of tiles. A 1-band last group's 5-9 tiles kept most of their K: tail 52-112 us
    after the last byte on the QKV layers, 31-56 us with 2-4 bands, calls 0.4-0.9% shorter
    (results/issue4-h200-20261203/probes/tail_probe-5-qkv.parquet)."""
    from ..kernels import ag_sm90

    nt = S.cdiv(n_loc, ag_sm90.BN)
    rho = S.link_compute_ratio(n_loc, builders, "host", ag_sm90.schedule_model("host"))
    return max(1, min(math.ceil(rho * builders / nt), builders // nt))


def _band_group_env(env) -> int | str | None:
    """KOSMOS_BAND_GROUP: bands per remote demand group (0: the schedule's rule) or "peer"
    (groups aligned to peer shards: schedule.peer_groups)."""
    n = env_int("KOSMOS_BAND_GROUP", 0, env=env, words=(S.PEER_GROUPS,))
    return n or None


def peer_runs_setting(env=None) -> bool:
    """KOSMOS_PEER_RUNS=1: a demand group that straddles two peers has its tiles peer by peer
    (schedule._peer_runs); default 0: column by column over the whole group. An ablation: on
    405b FC1 8k (6-band groups, most straddling two peers) the sweep took 4907 / 4914 us with it
    and 4898 / 4896 without (results/issue4-h200-20261204/run48-*), although a traced call had
    busy CTAs dip to 76-87 of 132 where such groups started; with it, 11-band groups ran as fast
    as 6 (4902 / 4973 us), which the simulator predicts too."""
    return _env_bool("KOSMOS_PEER_RUNS", os.environ if env is None else env, default=0)


def local_halve_setting(env=None) -> bool:
    """KOSMOS_LOCAL_HALVE (default 0): the rank's own bands (ready at entry) in regular demand
    groups (8 own bands: one group; world 1: 11, ..., 11, 9); 1: groups that halve toward their
    end like the remote ones (4, 2, 1, 1; world 1: 11, 11, 11, 11, 10, 5, 3, 1, 1). Halving buys
    nothing where nothing arrives, and every group streams B from HBM again: at the 700 W limit
    on 405b FC1's rank GEMM (8192x13312x16384, K = 16384) the world-1 kernel took 5396-5412 us
    regular against 5458-5460 halving (5348 vs 5402 in another process), the landed host kernel
    5606-5628 vs 5636-5669; in the host sweep together with no ramp: 4812 / 4813 us against
    4837-4976 (results/issue4-h200-20261204b/)."""
    return _env_bool("KOSMOS_LOCAL_HALVE", os.environ if env is None else env, default=0)


def local_group_setting(env=None) -> int:
    """KOSMOS_LOCAL_GROUP: bands per regular demand group of the rank's own bands (0, the
    default: as the remote groups when KOSMOS_BAND_GROUP or the regime sets them, else
    ~sqrt(builders): 11 of 132 CTAs). An ablation of the tile raster at world 1 and of the own
    bands, where nothing waits for a copy and only L2 reuse (HBM traffic, hence power at the
    700 W limit) depends on the group."""
    n = env_int("KOSMOS_LOCAL_GROUP", 0, env=os.environ if env is None else env)
    if n < 0:
        raise ValueError(f"KOSMOS_LOCAL_GROUP={n}: expected >= 0")
    return n


def fill_bands_setting(env=None) -> int:
    """KOSMOS_FILL_BANDS (default 0): the rank's last n own bands go to the fill queue
    (schedule ``fill_bands``): a CTA whose next remote tile is not ready yet takes one of their
    tiles instead of waiting, so the waits for a whole group's copy and the end game's idle CTAs
    do own work that would otherwise run at the start."""
    n = env_int("KOSMOS_FILL_BANDS", 0, env=os.environ if env is None else env)
    if n < 0:
        raise ValueError(f"KOSMOS_FILL_BANDS={n}: expected >= 0")
    return n


def _env_bool(name: str, env, default: int = 1) -> bool:
    """A 0/1 knob (default 1 unless said)."""
    v = env_int(name, default, env=env)
    if v not in (0, 1):
        raise ValueError(f"{name}={v!r}: expected 0 or 1")
    return bool(v)


@dataclass(frozen=True)
class CeSettings:
    """How a runner with copy-engine movers cuts its plan (ce_plan.build) and groups its bands:
    the defaults, the copy-bound regime's and the KOSMOS_* knobs, decided once for the GPU
    runner and the simulator alike (``ce_settings``)."""

    k_stream: bool  # the last group(s) arrive in K-slices the builders stream (sm90 + ce)
    regime: str  # "copy-bound", "compute", or "" (no K-streaming / not on the host fabric)
    split: tuple[int, ...]  # slices per copy of the sliced groups (sum = slices)
    merge: bool  # one copy per peer before the sliced groups
    band_group: int | str | None  # schedule.build_schedule band_group
    slice_bytes: int  # > 0: every other remote group streamed in slices of about that size
    tail_groups: int  # groups sliced at the end
    tail_bands: int | None  # bands of the last remote group (None: one wave of tiles)
    head_main: bool = False  # the first band's copy on the main stream, before the kernel
    ramp: bool | None = None  # remote groups start small and double (KOSMOS_BAND_RAMP; None: schedule.ramp_needed)
    halve: bool = True  # remote groups shrink toward the end (KOSMOS_BAND_HALVE)
    sm_tail_bands: int = 0  # the last remote bands the CTAs pull in K-slices (AG_PULL_K)
    sm_tail_slices: int = 0
    kernel_side: bool = False  # the plan's copies on the caller's stream, the kernel on its own
    shared_release: bool = True  # one flag release per copy (ce_plan.share_flags)
    peer_runs: bool = False  # a straddling demand group's tiles peer by peer (KOSMOS_PEER_RUNS)
    local_halve: bool = False  # the own bands' groups halve toward their end (KOSMOS_LOCAL_HALVE)
    local_group: int = 0  # bands per own-band group, 0: the schedule's rule (KOSMOS_LOCAL_GROUP)
    fill_bands: int = 0  # own bands held back as fill tiles (KOSMOS_FILL_BANDS)

    @property
    def slices(self) -> int:
        return sum(self.split)


def ce_settings(n_loc: int, builders: int, streams: bool, host: bool, ce_slices=None,
                env=None) -> CeSettings:
    """The CE plan's settings for a rank GEMM of n_loc columns on ``builders`` CTAs.
    ``streams``: copy-engine movers with the sm90 builder (the only builder with a slice wait);
    ``ce_slices`` (argument) and the environment's KOSMOS_CE_SLICES / _MERGE / _SLICE_MB /
    _TAIL_GROUPS / _TAIL_BANDS and KOSMOS_BAND_GROUP win over the copy-bound defaults."""
    from .. import ce_plan

    env = os.environ if env is None else env
    spec = ce_slices if ce_slices is not None else env.get("KOSMOS_CE_SLICES", DEFAULT_CE_SLICES)
    split = ce_plan.parse_split(int(spec) if isinstance(spec, str) and spec.strip().isdigit() else spec)
    slice_bytes = int(float(env.get("KOSMOS_CE_SLICE_MB", "0")) * 2 ** 20)
    if slice_bytes < 0:
        raise ValueError(f"KOSMOS_CE_SLICE_MB={slice_bytes / 2 ** 20}: expected >= 0")
    tail_groups = int(env.get("KOSMOS_CE_TAIL_GROUPS", "1"))
    tail_bands = int(env.get("KOSMOS_CE_TAIL_BANDS", "0")) or None
    if tail_bands is not None and tail_bands < 1:
        raise ValueError(f"KOSMOS_CE_TAIL_BANDS={tail_bands}: expected >= 1 (0: one wave of tiles)")
    merge = bool(int(env.get("KOSMOS_CE_MERGE", DEFAULT_CE_MERGE)))
    band_group = _band_group_env(env)
    head_main = env.get("KOSMOS_CE_HEAD_MAIN", DEFAULT_CE_HEAD_MAIN)
    if head_main not in ("0", "1"):
        raise ValueError(f"KOSMOS_CE_HEAD_MAIN={head_main!r}: expected 0 or 1")
    sm_bands, sm_slices = sm_tail_setting(env)
    if sm_bands and not (streams and host):
        raise ValueError("KOSMOS_CE_SM_TAIL: the SM-streamed tail needs copy-engine movers, the sm90 builder and "
                         "the host fabric")
    if sm_bands and ce_slices is None and "KOSMOS_CE_SLICES" not in env:
        split = (1,)  # the engine's last group lands whole: the SM tail streams after it
    k_stream = streams and (sum(split) > 1 or slice_bytes > 0 or sm_bands > 0)
    regime = ce_regime(n_loc, builders) if k_stream and host else ""
    if regime == "copy-bound":  # explicit settings win
        if ce_slices is None and "KOSMOS_CE_SLICES" not in env and not sm_bands:
            split = (1,) * COPY_BOUND_SLICES
        if "KOSMOS_CE_MERGE" not in env:
            merge = True
        if "KOSMOS_BAND_GROUP" not in env:
            band_group = 1
        if "KOSMOS_CE_TAIL_BANDS" not in env:
            tail_bands = copy_bound_tail_bands(n_loc, builders)
    elif regime == "link-bound":  # explicit settings win
        if ce_slices is None and "KOSMOS_CE_SLICES" not in env and not sm_bands:
            split = (1,) * LINK_BOUND_SLICES
        if "KOSMOS_BAND_GROUP" not in env:
            band_group = LINK_BOUND_GROUP
    # ramp: KOSMOS_BAND_RAMP forces it on / off; unset, the schedule decides (ramp_needed)
    ramp = _env_bool("KOSMOS_BAND_RAMP", env) if "KOSMOS_BAND_RAMP" in env else None
    halve = _env_bool("KOSMOS_BAND_HALVE", env)
    if regime == "link-bound" and "KOSMOS_BAND_RAMP" not in env:
        ramp = False
    side = env.get("KOSMOS_CE_KERNEL_SIDE", DEFAULT_CE_KERNEL_SIDE)
    if side not in ("0", "1") or (side == "1" and head_main == "1"):
        raise ValueError(f"KOSMOS_CE_KERNEL_SIDE={side!r}: expected 0 or 1 (and not with KOSMOS_CE_HEAD_MAIN=1)")
    shared = env.get("KOSMOS_CE_SHARED_RELEASE", DEFAULT_CE_SHARED_RELEASE)
    if shared not in ("0", "1"):
        raise ValueError(f"KOSMOS_CE_SHARED_RELEASE={shared!r}: expected 0 or 1")
    return CeSettings(k_stream, regime, split, merge, band_group, slice_bytes, tail_groups, tail_bands,
                      head_main == "1", ramp, halve, sm_bands, sm_slices, side == "1", shared == "1",
                      peer_runs_setting(env), local_halve_setting(env), local_group_setting(env),
                      fill_bands_setting(env))


class WatchdogError(RuntimeError):
    """A spin-wait in a kosmos kernel timed out (missing peer, protocol bug)."""


def _policy(p: Point) -> str:
    return p.policy or "self"


class KosmosImpl:
    name = "kosmos"
    # op gemm (world 1) is the builder role alone: the Hopper wgmma/TMA builder's standalone
    # persistent kernel (kernels/sm90_gemm.py), measured against cuBLAS by sweeps/builder.yaml.
    ops = ("ag-gemm", "gemm-rs", "gemm")
    fabrics = ("local", "host", "nvlink")

    def available(self, backend: str) -> tuple[bool, str]:
        if backend != "gpu":
            return False, f"kosmos kernels run on backend=gpu (backend={backend}; the simulator models them)"
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible"
        if getattr(torch.version, "hip", None):
            return False, "no HIP build of the kosmos kernels yet"
        major, _ = torch.cuda.get_device_capability()
        if major < 9:
            return False, f"kosmos kernels are built for sm_90a (this GPU is sm_{major}x)"
        from .. import kernels

        if kernels.find_lib(kernels.detect_arch()) is None and shutil.which("nvcc") is None:
            return False, "no prebuilt kosmos library matches the sources and nvcc is not on PATH to build it"
        return True, ""

    def unsupported(self, point: Point) -> str | None:
        why = common_unsupported(self, point)
        if why:
            return why
        if point.dtype != "bf16":
            return f"kosmos kernels are bf16 only (dtype={point.dtype})"
        if point.op == "gemm":
            from ..kernels import ag_sm90, sm90_gemm

            ok, why = sm90_gemm.available()
            if not ok:
                return why
            if os.environ.get("KOSMOS_GEMM_KERNEL", "fused") == "standalone":
                return sm90_gemm.validate_shape(point.M, point.N, point.K)
            return ag_sm90.validate(point.M, point.N, point.K, 1)
        if (point.builder or os.environ.get("KOSMOS_BUILDER")) == "sm90":
            from ..kernels import ag_sm90

            if point.op != "ag-gemm":
                return f"builder sm90: the Hopper-builder variant is ag-gemm only (op={point.op})"
            why = ag_sm90.validate(point.M, point.N, point.K, point.world)
            if why:
                return why
        why = S.validate(point.op, point.M, point.N, point.K, point.world, chunk=point.chunk or 1)
        if why:
            return why
        pol = _policy(point)
        if (point.mover or os.environ.get("KOSMOS_MOVER")) == "ce":
            if point.fabric != "host" or point.op != "ag-gemm":
                return f"mover ce: copy-engine movers are host-fabric ag-gemm only (fabric={point.fabric}, op={point.op})"
            if pol != "self":
                return f"mover ce: the copy engine does every move, so WG role policies do not apply (policy={pol})"
        if pol.startswith("fixed:"):
            try:
                k = int(pol.split(":", 1)[1])
            except ValueError:
                return f"policy {pol!r}: k is not an integer"
            wgs = _guess_wgs_per_rank(point)
            if wgs is not None and k >= wgs:
                return f"policy {pol}: k={k} leaves no builder among {wgs} WGs per rank"
        return None

    def prepare(self, point: Point, ctx, inputs, **kw) -> "KosmosRunner":
        if point.op == "gemm":
            return _prepare_gemm(point, ctx, inputs, **kw)
        kw.setdefault("builder", point.builder)
        kw.setdefault("mover", point.mover)
        return KosmosRunner(point, ctx, inputs, **kw)


def _gemm_kernel(kw: dict) -> str:
    kernel = kw.pop("gemm_kernel", None) or os.environ.get("KOSMOS_GEMM_KERNEL", "fused")
    if kernel not in ("fused", "standalone"):
        raise ValueError(f"gemm_kernel={kernel!r}: expected 'fused' or 'standalone'")
    return kernel


def _prepare_gemm(point: Point, ctx, inputs, **kw):
    """op gemm (world 1): 'fused' (default) runs the KOSMOS AG+GEMM kernel with the sm90
    builder at world 1 — the same persistent kernel, claims, flags and exit protocol, with no
    communication items; 'standalone' ($KOSMOS_GEMM_KERNEL or gemm_kernel=) the builder's own
    persistent GEMM (kernels/sm90_gemm.py), which isolates the builder from the protocol."""
    import torch

    if _gemm_kernel(kw) == "fused":
        fused = point.replace(op="ag-gemm", fabric="local", builder="sm90", policy="self", mover=None)
        r = KosmosRunner(fused, ctx, inputs, builder="sm90", **kw)
        r.info["gemm_kernel"] = "fused ag-gemm sm90, world 1"
        return r
    from ..kernels import sm90_gemm
    from .base import FnRunner

    A, B = inputs.A[ctx.rank], inputs.B[ctx.rank]
    out = torch.empty((point.M, point.N), dtype=A.dtype, device=ctx.device)
    return FnRunner(lambda: sm90_gemm.gemm(A, B, out=out), {ctx.rank: out},
                    info={"builder": "sm90", "gemm_kernel": "standalone sm90 persistent GEMM"})


def _guess_wgs_per_rank(point: Point) -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        sms = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001
        return None
    return sms // point.world if point.fabric == "local" else sms


def _i32(dev, a: np.ndarray):
    import torch

    a = np.ascontiguousarray(a, dtype=np.int32)
    if a.size == 0:
        a = np.zeros(1, dtype=np.int32)
    return torch.from_numpy(a.copy()).to(dev)


class KosmosRunner:
    """Buffers, schedules and launch parameters of one point (see the module docstring)."""

    def __init__(self, point: Point, ctx, inputs, **kw):
        # what close() releases, set first so that a failed set-up releases what it made
        self.closed, self.outputs = False, {}
        self._keep: list = []  # tensors whose pointers the kernel holds
        self._mapped: list[int] = []  # kosmos_alloc_mapped host pointers
        self._runner_streams: list[int] = []  # KOSMOS_CE_PLAN_STREAMS=runner: this runner's own pair
        self.sm90_handle = None
        self.ahead_blocks = None  # sm90 builder: the lookahead claim (KOSMOS_AHEAD_BLOCKS)
        self.ce_plan = None  # C handle (kosmos_ce_plan_create) when the copy engine moves
        try:
            self._setup(point, ctx, inputs, **kw)
        except BaseException:
            self.close()
            raise

    def _setup(self, point: Point, ctx, inputs, *, num_wgs: int | None = None, timeout_s: float | None = None,
               debug_skip_rank: int | None = None, trace_cap: int = DEFAULT_TRACE_CAP,
               max_inflight: int | None = None, mover_bulk: bool | None = None, mover: str | None = None,
               builder: str | None = None, ce_slices: int | str | tuple | None = None):
        import torch

        from .. import kernels
        from ..kernels import abi, ag_sm90

        self.point, self.ctx = point, ctx
        self.dev = ctx.device
        self.lib = kernels.load()
        # 'mma': the main library's kernels. 'sm90' (ag-gemm; the default on sm_90 when the shape
        # suits TMA): the Hopper builder kernel of kernels/ag_sm90.py; same buffers, schedule
        # arrays and protocol.
        bulk_asked = bool(mover_bulk) or (mover_bulk is None and bool(int(os.environ.get("KOSMOS_MOVER_BULK", "0"))))
        self.builder = ag_sm90.builder_choice(builder, point.op, (point.M, point.N, point.K, point.world),
                                              torch.cuda.get_device_capability(self.dev), bulk_asked)
        self.sm90 = None
        if self.builder == "sm90":
            if point.op != "ag-gemm":
                raise ValueError(f"builder='sm90' is implemented for ag-gemm only (op={point.op})")
            why = ag_sm90.validate(point.M, point.N, point.K, point.world)
            if why:
                raise ValueError(why)
            if mover_bulk or (mover_bulk is None and bool(int(os.environ.get("KOSMOS_MOVER_BULK", "0")))):
                raise ValueError("builder='sm90' has no mover_bulk path (no shared memory beside the builder)")
            mover_bulk = False
            self.sm90 = ag_sm90.load()
        self.abi = abi
        op, W, M, N, K = point.op, point.world, point.M, point.N, point.K
        fabric = point.fabric
        self.fabric = fabric
        self.op_code = abi.OP_CODES[op]
        # 'sm': WGs move (the KOSMOS design); 'ce' (host fabric, ag-gemm): the copy engine moves
        # each band (cudaMemcpyAsync on a side stream) and releases its flag with a stream
        # memory operation; every WG builds.
        self.mover = mover or os.environ.get("KOSMOS_MOVER", "sm")
        if self.mover not in ("sm", "ce"):
            raise ValueError(f"mover={self.mover!r}: expected 'sm' or 'ce'")
        if self.mover == "ce" and (fabric != "host" or op != "ag-gemm"):
            raise ValueError("mover='ce' is implemented for ag-gemm on the host fabric only")
        # Copy-engine movers + sm90 builders: the last remote group arrives in K-slices that the
        # builders stream (Params.k_stream; kosmos_bench/ce_plan.py); the mma builder has no
        # slice wait: it always gets whole bands. ce_settings (below, once the CTA count is
        # known) decides slices, merging and groups from the defaults, the copy-bound regime
        # and the KOSMOS_CE_* / KOSMOS_BAND_GROUP knobs, as the simulator does.
        self.spin_ns = int(os.environ.get("KOSMOS_SPIN_NS", DEFAULT_SPIN_NS))
        if not 0 <= self.spin_ns <= 1_000_000:
            raise ValueError(f"KOSMOS_SPIN_NS={self.spin_ns}: expected 0..1000000 ns")
        self.calls = 0  # completed launches since the last reset (epoch of the next = calls + 1)
        dev_index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
        self.dev_index = dev_index
        with torch.cuda.device(dev_index):
            mx = ctypes.c_int(0)
            if self.sm90 is not None:
                self._call(self.sm90.kosmos_sm90_ag_max_wgs(dev_index, ctypes.byref(mx)), "kosmos_sm90_ag_max_wgs")
            else:
                self._call(self.lib.kosmos_max_wgs(self.op_code, dev_index, ctypes.byref(mx)), "kosmos_max_wgs")
        G = min(int(num_wgs or mx.value), mx.value)
        ranks = list(range(W)) if fabric == "local" else [ctx.rank if fabric == "nvlink" else 0]
        if fabric == "local":
            starts = S.wg_starts(G, W)
        else:
            starts = np.array([0, G], dtype=np.int32)
        self.ranks, self.grid, self.starts = ranks, G, starts
        sizes = np.diff(starts)
        ce = ce_settings(N // W, int(sizes.min()), self.mover == "ce" and self.sm90 is not None, fabric == "host",
                         ce_slices)
        self.ce, self.k_stream = ce, ce.k_stream
        band_group = ce.band_group
        kw = dict(BM=128, BN=ag_sm90.BN if self.sm90 is not None else 128, chunk=point.chunk or 1, policy=_policy(point),
                  queue_order=point.queue_order or "demand", seed=point.seed, local_first=point.local_first,
                  fabric="host" if fabric == "host" else ("local" if fabric == "local" else "nvlink"),
                  stream_k=self.k_stream, band_group=band_group, tail_bands=ce.tail_bands, ramp=ce.ramp,
                  halve=ce.halve, peer_runs=ce.peer_runs, local_halve=ce.local_halve,
                  local_group=ce.local_group or None, fill_bands=min(ce.fill_bands, S.cdiv(M // W, 128)))
        if self.sm90 is not None:  # loader-warpgroup movers, CTA builders
            kw["model"] = ag_sm90.schedule_model(kw["fabric"])
        self.split_bands, self.split_k = split_k_setting()
        if self.split_k > 1:
            if self.sm90 is None:
                raise ValueError("KOSMOS_SPLIT_K: split tiles need the sm90 builder")
            if self.split_k > S.cdiv(K, ag_sm90.BK):
                raise ValueError(f"KOSMOS_SPLIT_K: {self.split_k} parts > {S.cdiv(K, ag_sm90.BK)} k-blocks of K={K}")
            kw.update(split_bands=self.split_bands, split_k=self.split_k)
        if ce.sm_tail_bands:
            if ce.sm_tail_slices > S.cdiv(K, ag_sm90.BK):
                raise ValueError(f"KOSMOS_CE_SM_TAIL: {ce.sm_tail_slices} slices > {S.cdiv(K, ag_sm90.BK)} k-blocks "
                                 f"of K={K}")
            kw.update(sm_tail_bands=ce.sm_tail_bands, sm_tail_slices=ce.sm_tail_slices)
        self.scheds = [S.build_schedule(op, M, N, K, W, r, num_wgs=int(sizes[i]), **kw) for i, r in enumerate(ranks)]
        dt = torch.bfloat16
        m_loc = M // W
        nf = self.scheds[0].flags.num_flags

        # ---- state, error record, trace ----
        n_exec = len(ranks)
        self.state = torch.zeros(4 + abi.NUM_CTR * n_exec, dtype=torch.int32, device=self.dev)
        host, devp = ctypes.c_void_p(), ctypes.c_void_p()
        self._call(self.lib.kosmos_alloc_mapped(ctypes.sizeof(abi.ErrorRecord), ctypes.byref(host), ctypes.byref(devp)),
                   "kosmos_alloc_mapped")
        self._mapped.append(host.value)
        self.err = abi.ErrorRecord.from_address(host.value)
        self.err_dev = devp.value
        self.err_seen = int(self.err.count)
        self.trace_cap = int(trace_cap)
        self.trace_buf = None
        self.trace_count = None

        # ---- buffers per fabric ----
        flags: dict[int, object] = {}
        scratch_flags = None
        self.symm = None
        if fabric == "nvlink":
            sym_ptrs, off_data = self._symmetric(op, W, M, N, K, nf)
            for p in range(W):
                flags[p] = sym_ptrs[p]
        else:
            for r in ranks:
                t = torch.zeros(nf, dtype=torch.int32, device=self.dev)
                self._keep.append(t)
                flags[r] = t.data_ptr()
            if fabric == "host":
                scratch_flags = torch.zeros(nf, dtype=torch.int32, device=self.dev)
                self._keep.append(scratch_flags)
                for p in range(W):
                    flags.setdefault(p, scratch_flags.data_ptr())
        self.flag_tensors = [t for t in self._keep]  # zeroed after an abort

        self.outputs: dict[int, torch.Tensor] = {}
        A, B = inputs.A, inputs.B
        per_rank: dict[int, dict] = {}
        if op == "ag-gemm":
            n_loc = N // W
            peer_A = {}
            if fabric == "local":
                peer_A = {p: A[p].data_ptr() for p in range(W)}
            elif fabric == "host":  # the same pinned pages as the baselines and copy-alone
                from . import nccl as nccl_impls

                shards = nccl_impls.host_peers(point, ctx, inputs).shards
                peer_A[0] = A[0].data_ptr()
                self._host_A = {p: shards[p] for p in range(1, W)}
                for p in range(1, W):
                    self._keep.append(shards[p])
                    peer_A[p] = self._dev_ptr(shards[p])
            else:
                for p in range(W):
                    peer_A[p] = sym_ptrs[p] + off_data
                mine = self.symm_buf[off_data:off_data + m_loc * K * 2].view(dt).view(m_loc, K)
                mine.copy_(A[ctx.rank])
                torch.cuda.synchronize(self.dev)
                self._barrier()
            for r in ranks:
                C = torch.empty(M, n_loc, dtype=dt, device=self.dev)
                work = torch.empty(M, K, dtype=dt, device=self.dev)
                self._keep += [C, work]
                self.outputs[r] = C
                if self.mover == "ce":
                    self._ce_plan(self.scheds[0], work, flags[r], m_loc, K)
                per_rank[r] = dict(A=A[r].data_ptr(), B=B[r].data_ptr(), C=C.data_ptr(), work=work.data_ptr(),
                                   peer_A=[peer_A.get(p, 0) for p in range(W)])
        else:
            slot_bytes = m_loc * N * 2
            recv = {}
            if fabric == "local":
                for r in ranks:
                    recv[r] = torch.empty(W * m_loc, N, dtype=dt, device=self.dev)
                    self._keep.append(recv[r])
            for r in ranks:
                Cr = torch.empty(m_loc, N, dtype=dt, device=self.dev)
                work = torch.empty(M, N, dtype=dt, device=self.dev)
                self._keep += [Cr, work]
                self.outputs[r] = Cr
                d = dict(A=A[r].data_ptr(), B=B[r].data_ptr(), C=Cr.data_ptr(), work=work.data_ptr(),
                         push_dst=[0] * W, slot=[0] * W, proxy_src=[0] * W)
                if fabric == "local":
                    for q in range(W):
                        d["push_dst"][q] = recv[q].data_ptr() + r * slot_bytes
                        d["slot"][q] = recv[r].data_ptr() + q * slot_bytes
                elif fabric == "host":
                    own = torch.empty(W * m_loc, N, dtype=dt, device=self.dev)
                    self._keep.append(own)
                    send = torch.empty(max(1, W - 1) * m_loc, N, dtype=dt).pin_memory()
                    self._keep.append(send)
                    send_dev = self._dev_ptr(send)
                    for q in range(W):
                        d["slot"][q] = own.data_ptr() + q * slot_bytes
                        if q != r:
                            d["push_dst"][q] = send_dev + (q - 1) * slot_bytes
                    for s in range(1, W):  # peers' static contributions to band 0
                        part = (A[s][:m_loc].float() @ B[s].float()).to(dt)
                        d["proxy_src"][s] = self._pinned(part)
                        del part
                else:
                    for q in range(W):
                        d["push_dst"][q] = sym_ptrs[q] + off_data + r * slot_bytes
                        d["slot"][q] = sym_ptrs[r] + off_data + q * slot_bytes
                per_rank[r] = d

        # ---- rank args ----
        ra_arr = (abi.RankArgs * n_exec)()
        state_ptr = self.state.data_ptr()
        for i, (r, sch) in enumerate(zip(ranks, self.scheds)):
            a = ra_arr[i]
            arrs = sch.arrays()
            for q, name in enumerate(("builder", "mover", "reduce")):
                queue = arrs[f"{name}_queue"]
                if q == S.Q_MOVE and self.mover == "ce":  # the copy engine moves; WGs build and pull the SM tail
                    queue = queue[len(queue) - sch.meta["sm_movers"]:]
                ti, tq = _i32(self.dev, arrs[f"{name}_items"]), _i32(self.dev, np.ascontiguousarray(queue))
                self._keep += [ti, tq]
                a.items[q], a.queue[q] = ti.data_ptr(), tq.data_ptr()
                a.count[q] = len(queue)
            if self.mover == "ce":  # band flags count the copy engine's releases (ce_plan.build)
                arrs["flag_mult"] = arrs["flag_mult"].copy()
                for f, m in self.ce_flag_mult.items():
                    arrs["flag_mult"][f] = m
                if getattr(self, "ce_alias", None):  # a copy's bands wait on the one flag it releases
                    arrs["deps"] = np.array([self.ce_alias.get(int(f), int(f)) for f in arrs["deps"]], dtype=np.int32)
            for name in ("deps", "peer_flags", "flag_mult"):
                t = _i32(self.dev, arrs[name])
                self._keep.append(t)
                setattr(a, name, t.data_ptr())
            a.ctr = state_ptr + 4 * (4 + abi.NUM_CTR * i)
            d = per_rank[r]
            a.A, a.B, a.C, a.work = d["A"], d["B"], d["C"], d["work"]
            for p in range(W):
                a.flags[p] = flags[p]
                if op == "ag-gemm":
                    a.peer_A[p] = d["peer_A"][p] or None
                else:
                    a.push_dst[p] = d["push_dst"][p] or None
                    a.slot[p] = d["slot"][p] or None
                    a.proxy_src[p] = d["proxy_src"][p] or None
            a.rank = r
            a.wg_begin, a.wg_end = int(starts[i]), int(starts[i + 1])
            a.num_mover_wgs = int(sch.num_movers or 0)
            a.max_inflight_movers = int(sch.max_inflight if max_inflight is None or sch.num_movers
                                        else min(max(0, max_inflight), int(sizes[i]) - 1))
            a.num_peer_flags = len(sch.peer_flags)
            a.skip = 1 if (debug_skip_rank is not None and r == debug_skip_rank) else 0
        self._ra_arr = ra_arr
        raw = np.frombuffer(bytes(ra_arr), dtype=np.uint8)
        self.rank_args = torch.from_numpy(raw.copy()).to(self.dev)
        if self.sm90 is not None:  # TMA descriptors over A_r, the gathered buffer and B_r of every executed rank
            self.sm90_handle = self.sm90.kosmos_sm90_ag_create()
            if not self.sm90_handle:
                raise MemoryError("kosmos_sm90_ag_create failed")
            self.ahead_blocks = env_int("KOSMOS_AHEAD_BLOCKS", DEFAULT_AHEAD_BLOCKS, lo=-1)
            self._call(self.sm90.kosmos_sm90_ag_set_ahead(ctypes.c_void_p(self.sm90_handle), self.ahead_blocks),
                       "kosmos_sm90_ag_set_ahead")
            for i, r in enumerate(ranks):
                d = per_rank[r]
                self._sm90_set_rank(i, d["A"], d["work"], d["B"], d["C"])
                tiles = self.scheds[i].meta["split_tiles"]
                if tiles:  # fp32 partials of the split tiles: [tile][part][128 x 256]
                    ws = torch.empty(tiles * self.split_k * ag_sm90.BM * ag_sm90.BN, dtype=torch.float32, device=self.dev)
                    self._keep.append(ws)
                    self._call(self.sm90.kosmos_sm90_ag_set_split(ctypes.c_void_p(self.sm90_handle), i,
                                                                  ctypes.c_void_p(ws.data_ptr()),
                                                                  self.scheds[i].flags.split),
                               "kosmos_sm90_ag_set_split")

        self.mover_bulk = bool(int(os.environ.get("KOSMOS_MOVER_BULK", "0"))) if mover_bulk is None else bool(mover_bulk)
        self.timeout_ns = int((timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S) * 1e9)
        self.params = self._params(trace=False)
        k = self.scheds[0].num_movers
        self.info = {"num_movers": k, "num_wgs": int(G), "wgs_per_rank": int(sizes.min()),
                     "max_inflight_movers": int(ra_arr[0].max_inflight_movers), "mover_bulk": self.mover_bulk,
                     "mover": self.mover, "builder": self.builder,
                     "ce_copies": int(getattr(self, "ce_copies", 0)),
                     "ce_slices": self.ce.slices if self.k_stream else (1 if self.mover == "ce" else 0),
                     "ce_split": ",".join(map(str, self.ce.split)) if self.k_stream else "",
                     "ce_slice_mb": self.ce.slice_bytes / 2 ** 20 if self.k_stream else 0.0,
                     "ce_tail_groups": self.ce.tail_groups if self.k_stream else 0,
                     "ce_tail_bands": (self.ce.tail_bands or 0) if self.k_stream else 0,
                     "ce_head_main": int(self.ce.head_main), "ce_kernel_side": int(self.ce.kernel_side),
                     "ce_releases": len(getattr(self, "ce_entries", ())), "peer_runs": int(self.ce.peer_runs),
                     "local_halve": int(self.ce.local_halve),
                     "local_group": int(self.ce.local_group),
                     "band_ramp": int(self.scheds[0].meta.get("ramp", False)),
                     "fill_bands": int(self.scheds[0].meta.get("fill_bands", 0)),
                     "ce_merge": self.ce.merge if self.mover == "ce" else False,
                     "ce_regime": self.ce.regime, "band_group": -1 if band_group == S.PEER_GROUPS else int(band_group or 0),
                     "spin_ns": self.spin_ns, "ahead_blocks": self.ahead_blocks,
                     "split_k": f"{self.split_bands}:{self.split_k}" if self.split_k > 1 else "0",
                     "ce_sm_tail": f"{self.ce.sm_tail_bands}:{self.ce.sm_tail_slices}" if self.ce.sm_tail_bands else "0",
                     "kosmos_policy": _policy(point), "trace_dropped": 0}
        torch.cuda.synchronize(self.dev)

    # ---- helpers ----
    def _call(self, rc: int, what: str) -> None:
        if rc != 0:
            from .. import kernels

            if what.startswith("kosmos_sm90"):
                from ..kernels import ag_sm90

                raise RuntimeError(f"{what} failed ({rc}): {ag_sm90.last_error(self.sm90)}")
            raise RuntimeError(f"{what} failed ({rc}): {kernels.last_error(self.lib)}")

    def _sm90_set_rank(self, i: int, A: int, work: int, B: int, C: int) -> None:
        p = self.point
        P = ctypes.c_void_p
        self._call(self.sm90.kosmos_sm90_ag_set_rank(P(self.sm90_handle), i, P(A), P(work), P(B), P(C), p.M, p.N,
                                                     p.K, p.world), "kosmos_sm90_ag_set_rank")

    def _dev_ptr(self, t) -> int:
        out = ctypes.c_void_p()
        self._call(self.lib.kosmos_host_device_ptr(ctypes.c_void_p(t.data_ptr()), ctypes.byref(out)),
                   "kosmos_host_device_ptr")
        return int(out.value)

    def _pinned(self, t) -> int:
        h = t.detach().to("cpu").contiguous().pin_memory()
        self._keep.append(h)
        return self._dev_ptr(h)

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.ctx.group is not None:
            dist.barrier(group=self.ctx.group)

    def _symmetric(self, op, W, M, N, K, nf):
        import torch
        import torch.distributed._symmetric_memory as symm

        if self.ctx.group is None:
            raise RuntimeError("nvlink fabric needs a process group (ctx.group)")
        m_loc = M // W
        off_data = (nf * 4 + 255) // 256 * 256
        data = m_loc * K * 2 if op == "ag-gemm" else W * m_loc * N * 2
        buf = symm.empty(off_data + data, dtype=torch.uint8, device=self.dev)
        buf.zero_()
        group = self.ctx.group
        hdl = symm.rendezvous(buf, getattr(group, "group_name", group))
        torch.cuda.synchronize(self.dev)
        self._barrier()
        self.symm, self.symm_buf = hdl, buf
        self._keep.append(buf)
        return [int(p) for p in hdl.buffer_ptrs], off_data

    def _params(self, trace: bool):
        abi = self.abi
        p = abi.Params()
        p.ranks = self.rank_args.data_ptr()
        p.state = self.state.data_ptr()
        p.err = self.err_dev
        if trace:
            p.trace = self.trace_buf.data_ptr()
            p.trace_count = self.trace_count.data_ptr()
            p.trace_cap = self.trace_cap
        p.timeout_ns = self.timeout_ns
        p.op = self.op_code
        p.num_ranks = len(self.ranks)
        p.world = self.point.world
        p.M, p.N, p.K = self.point.M, self.point.N, self.point.K
        p.sys_scope = 1 if self.fabric == "nvlink" else 0
        p.static_peers = 1 if self.fabric == "host" else 0
        p.grid = self.grid
        p.mover_bulk = 1 if self.mover_bulk else 0
        p.k_stream = 1 if self.k_stream else 0
        p.spin_ns = self.spin_ns
        return p

    def _ce_plan(self, sch, work, flag_base: int, m_loc: int, K: int) -> None:
        """Copy-engine movers: kosmos_bench/ce_plan.py's entries as addresses (copies of the
        pinned A_p into the gathered buffer, 2-D for K-slices; flag addresses)."""
        import torch

        from .. import ce_plan
        from ..kernels import ag_sm90

        entries, self.ce_flag_mult = ce_plan.build(sch, K, self.ce.slices if self.k_stream else 1, bk=ag_sm90.BK,
                                                   split=self.ce.split if self.k_stream else None,
                                                   slice_bytes=self.ce.slice_bytes if self.k_stream else 0,
                                                   tail_groups=self.ce.tail_groups, merge=self.ce.merge,
                                                   split_head=self.ce.head_main)
        self.ce_alias = {}
        if self.ce.shared_release:
            entries, self.ce_alias = ce_plan.share_flags(entries)
        pitch = K * 2
        cols = {n: [] for n in ("dst", "src", "width", "height", "pitch", "flag")}
        for e in entries:
            copy = e.rows > 0
            cols["dst"].append(work[e.peer * m_loc + e.row0, e.col0:].data_ptr() if copy else 0)
            cols["src"].append(self._host_A[e.peer][e.row0, e.col0:].data_ptr() if copy else 0)
            cols["width"].append(e.cols * 2 if copy else 0)
            cols["height"].append(e.rows)
            cols["pitch"].append(pitch)
            cols["flag"].append(flag_base + 4 * e.flag)
        self.ce_entries, self.ce_work = entries, work
        self.ce_copies = sum(1 for e in entries if e.rows)
        copies = [i for i, e in enumerate(entries) if e.rows]
        if not copies:  # the SM tail takes every remote band: nothing for the engine
            return
        # Entries enqueued before the kernel launch: copies until KOSMOS_CE_HEAD_MB (default 0: the
        # first copy only; more keeps the engine busy while the host launches the kernel (32 KB
        # of parameters) and enqueues the rest: not yet measured on the device).
        head_bytes = float(os.environ.get("KOSMOS_CE_HEAD_MB", "0")) * 2 ** 20
        head, acc = len(entries), 0
        for j, i in enumerate(copies):
            if j > 0 and acc >= head_bytes:
                head = i
                break
            acc += entries[i].rows * entries[i].cols * 2
        # copies, flag releases; KOSMOS_CE_INLINE_RELEASE=1: both on the copy stream (no events).
        # The process's plan streams, not torch's pool (plan_streams says why).
        inline = os.environ.get("KOSMOS_CE_INLINE_RELEASE", "0") == "1"
        which = os.environ.get("KOSMOS_CE_PLAN_STREAMS", "process")
        if which not in ("process", "runner"):
            raise ValueError(f"KOSMOS_CE_PLAN_STREAMS={which!r}: expected 'process' (default) or 'runner'")
        if which == "runner":  # ablation: a pair per runner
            handles = self._runner_streams = make_stream_pair(self.lib, self.dev_index)
        else:
            handles = plan_streams(self.lib, self.dev_index)
        self.ce_streams = [torch.cuda.ExternalStream(h, device=self.dev) for h in handles]
        if inline:
            self.ce_streams[1] = self.ce_streams[0]
        self.ce_cols = [np.ascontiguousarray(np.array(cols[n], dtype=np.uint64)) for n in cols]
        self.ce_mult = np.array([e.mult for e in entries], dtype=np.uint32)
        self.ce_back = np.array([e.back for e in entries], dtype=np.uint32)  # a test holds one release back
        self.ce_head = head
        # The last copy's releases on the copy stream (no event hop; KOSMOS_CE_TAIL_INLINE=0: off).
        tail_inline = os.environ.get("KOSMOS_CE_TAIL_INLINE", DEFAULT_CE_TAIL_INLINE)
        if tail_inline not in ("0", "1"):
            raise ValueError(f"KOSMOS_CE_TAIL_INLINE={tail_inline!r}: expected 0 or 1")
        self.ce_inline_from = copies[-1] if tail_inline == "1" else len(entries)
        self._ce_commit()

    def _ce_commit(self) -> None:
        """(Re)create the C plan from ce_cols / ce_mult / ce_back (copied in)."""
        u64, u32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        if self.ce_plan:
            self.lib.kosmos_ce_plan_destroy(self.ce_plan)
            self.ce_plan = None
        h = self.lib.kosmos_ce_plan_create(ctypes.c_void_p(self.ce_streams[0].cuda_stream),
                                           ctypes.c_void_p(self.ce_streams[1].cuda_stream), len(self.ce_mult),
                                           *(a.ctypes.data_as(u64) for a in self.ce_cols),
                                           self.ce_mult.ctypes.data_as(u32), self.ce_back.ctypes.data_as(u32),
                                           self.ce_head, self.ce_inline_from, int(self.ce.head_main))
        if not h:
            from .. import kernels

            raise RuntimeError(f"kosmos_ce_plan_create failed: {kernels.last_error(self.lib)}")
        self.ce_plan = h

    def _launch(self, params) -> None:
        import torch

        main = torch.cuda.current_stream(self.dev).cuda_stream
        epoch = self.calls + 1
        ctx = contextlib.nullcontext() if torch.cuda.current_device() == self.dev_index else \
            torch.cuda.device(self.dev_index)
        with ctx:
            # The first copy goes in before the kernel launch and the rest after it:
            # enqueueing a whole plan from Python used to delay the first band by ~100 us.
            side = kernel_stream(self.lib, self.dev_index) if self.ce_plan and self.ce.kernel_side else None
            if side:  # the copies on main, the kernel on its own stream (runtime.cu says why)
                self._call(self.lib.kosmos_ce_plan_begin_side(self.ce_plan, main, side, epoch),
                           "kosmos_ce_plan_begin_side")
            elif self.ce_plan:
                self._call(self.lib.kosmos_ce_plan_begin(self.ce_plan, main, epoch), "kosmos_ce_plan_begin")
            on = side or main
            if self.sm90 is not None:
                self._call(self.sm90.kosmos_sm90_ag_launch(self.sm90_handle, ctypes.byref(params), on),
                           "kosmos_sm90_ag_launch")
            else:
                self._call(self.lib.kosmos_launch(ctypes.byref(params), on), "kosmos_launch")
            if side:
                self._call(self.lib.kosmos_ce_plan_end_side(self.ce_plan, main, side, epoch), "kosmos_ce_plan_end_side")
            elif self.ce_plan:
                self._call(self.lib.kosmos_ce_plan_end(self.ce_plan, main, epoch), "kosmos_ce_plan_end")
        self.calls += 1

    def run_ce_plan_alone(self, epoch: int = 1) -> None:
        """The copy-engine plan of one call without the kernel (timing its copies apart from it).
        Its flag releases make the next kernel call of this runner wrong: use a spare runner."""
        import torch

        main = torch.cuda.current_stream(self.dev).cuda_stream
        self._call(self.lib.kosmos_ce_plan_begin(self.ce_plan, main, epoch), "kosmos_ce_plan_begin")
        self._call(self.lib.kosmos_ce_plan_end(self.ce_plan, main, epoch), "kosmos_ce_plan_end")

    def _raise_if_timed_out(self) -> None:
        import torch

        if self.closed:
            raise RuntimeError("kosmos runner used after close()")
        e = self.err
        if int(e.count) == self.err_seen:
            return
        torch.cuda.synchronize(self.dev)
        self.err_seen = int(e.count)
        qn = self.abi.QUEUE_NAMES[e.queue] if 0 <= e.queue < 4 else str(e.queue)
        msg = (f"kosmos watchdog: rank {e.rank} WG {e.wg} waited {e.waited_ns / 1e6:.1f} ms on flag {e.flag} "
               f"of rank {e.flag_rank} (expected >= {e.expected}, saw {e.seen}) for {qn} item {e.item} "
               f"in call {e.epoch} [{self.point.op}, fabric={self.fabric}, world={self.point.world}]")
        if self.fabric != "nvlink":  # fresh protocol state: the next call starts at epoch 1
            for t in self.flag_tensors:
                if t.dtype == torch.int32:
                    t.zero_()
            self.state.zero_()
            self.calls = 0
            torch.cuda.synchronize(self.dev)
        raise WatchdogError(msg)

    def set_debug_skip(self, rank: int | None) -> None:
        """Test hook: make emulated rank `rank` never signal (None: everyone works)."""
        import torch

        for i, r in enumerate(self.ranks):
            self._ra_arr[i].skip = 1 if (rank is not None and r == rank) else 0
        raw = np.frombuffer(bytes(self._ra_arr), dtype=np.uint8)
        self.rank_args.copy_(torch.from_numpy(raw.copy()))
        torch.cuda.synchronize(self.dev)

    def rebind(self, A, B, C) -> None:
        """Point the (single executed) rank at new operands/output (torch custom ops).

        A, B: this rank's shards (layouts of Point); C: output tensor (out_shape), bf16,
        contiguous. ag-gemm on nvlink copies A into the symmetric buffer (stream-ordered).
        """
        import torch

        if len(self.ranks) != 1:
            raise RuntimeError("rebind is for fabrics with one executed rank (nvlink, host)")
        a = self._ra_arr[0]
        if self.point.op == "ag-gemm" and self.fabric == "nvlink":
            m_loc, K = self.point.M // self.point.world, self.point.K
            off = int(a.peer_A[self.ranks[0]]) - int(self.symm_buf.data_ptr())
            self.symm_buf[off:off + m_loc * K * 2].view(torch.bfloat16).view(m_loc, K).copy_(A)
        else:
            a.A = A.data_ptr()
        a.B, a.C = B.data_ptr(), C.data_ptr()
        if self.sm90 is not None:  # the TMA descriptors hold the operand addresses
            self._sm90_set_rank(0, int(a.A), int(a.work), int(a.B), int(a.C))
        raw = torch.from_numpy(np.frombuffer(bytes(self._ra_arr), dtype=np.uint8).copy())
        self.rank_args.copy_(raw.pin_memory(), non_blocking=True)
        self.outputs = {self.ranks[0]: C}

    # ---- Runner interface ----
    def run(self) -> None:
        """One call (asynchronous). Raises WatchdogError if an earlier call timed out."""
        self._raise_if_timed_out()
        self._launch(self.params)

    def check(self) -> None:
        """Synchronize and raise WatchdogError if any call so far timed out."""
        import torch

        torch.cuda.synchronize(self.dev)
        self._raise_if_timed_out()

    def run_traced(self):
        """Run one call with role tracing; returns a DataFrame (rank, wg, sm, role, item, t0_ns, t1_ns)."""
        import pandas as pd
        import torch

        if self.trace_buf is None:
            self.trace_buf = torch.empty(self.grid * self.trace_cap * self.abi.TRACE_RECORD_BYTES, dtype=torch.uint8,
                                         device=self.dev)
            self.trace_count = torch.zeros(self.grid, dtype=torch.int32, device=self.dev)
        self._raise_if_timed_out()
        self.trace_count.zero_()
        self._launch(self._params(trace=True))
        self.check()
        counts = self.trace_count.cpu().numpy().astype(np.int64)
        rec = np.frombuffer(self.trace_buf.cpu().numpy().tobytes(), dtype=np.dtype(
            [("t0", "<u8"), ("t1", "<u8"), ("item", "<i4"), ("role", "<u2"), ("sm", "<u2")])).reshape(
            self.grid, self.trace_cap)
        self.info["trace_dropped"] = int(np.maximum(counts - self.trace_cap, 0).sum())
        rows = []
        for g in range(self.grid):
            n = int(min(counts[g], self.trace_cap))
            if n == 0:
                continue
            i = int(np.searchsorted(self.starts, g, side="right") - 1)
            r = self.ranks[i]
            chunk = rec[g, :n]
            rows.append(pd.DataFrame({"rank": r, "wg": g - int(self.starts[i]), "sm": chunk["sm"].astype(np.int32),
                                      "role": np.array(S.ROLE_NAMES)[chunk["role"]], "item": chunk["item"],
                                      "t0_ns": chunk["t0"].astype(np.int64), "t1_ns": chunk["t1"].astype(np.int64)}))
        cols = ["rank", "wg", "sm", "role", "item", "t0_ns", "t1_ns"]
        if not rows:
            return pd.DataFrame(columns=cols)
        df = pd.concat(rows, ignore_index=True)
        t_min = int(df["t0_ns"].min())
        df["t0_ns"] -= t_min
        df["t1_ns"] -= t_min
        return df[cols]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            import torch

            torch.cuda.synchronize(self.dev)
        except Exception:  # noqa: BLE001
            pass
        for h in self._mapped:
            self.lib.kosmos_free_mapped(ctypes.c_void_p(h))
        self._mapped.clear()
        if self.sm90_handle:
            self.sm90.kosmos_sm90_ag_destroy(ctypes.c_void_p(self.sm90_handle))
            self.sm90_handle = None
        if self.ce_plan:
            self.lib.kosmos_ce_plan_destroy(self.ce_plan)
            self.ce_plan = None
        for h in self._runner_streams:
            self.lib.kosmos_stream_destroy(ctypes.c_void_p(h))
        self._runner_streams.clear()
        self._keep.clear()
        self.outputs = {}


IMPLS = [KosmosImpl()]
