"""KOSMOS schedules: the items, their dependencies and the priority-ordered queues.

One source of truth for "what order", two consumers: the CUDA kernels (which receive the
int32 arrays of :meth:`RankSchedule.arrays`) and the simulator (which reads the same
tables plus the per-item FLOPs and bytes). Pure Python + numpy; no torch.

Conventions (``W`` = world, ``r`` = rank, shapes as in :class:`kosmos_bench.point.Point`)
------------------------------------------------------------------------------------------
* ``m_loc = M / W``. Builder tiles are ``BM x BN``; partial tiles at the M / N edges are
  ordinary items with fewer ``rows`` / ``cols``. A *band* is ``chunk`` builder-tile rows
  (``BM * chunk`` rows) of one rank's ``m_loc`` rows; the last band may be shorter.
* Every rank has one **flag array** of ``num_flags`` uint32 words (layout in
  :class:`FlagLayout`) and a multiplicity ``flag_mult[f]`` (how many items release f; 1
  except AG band flags, released once per slice). A flag is *ready* in call ``e`` when it
  reaches ``e * flag_mult[f]`` (epoch counters, never reset between calls: a release adds
  one, or stores ``e`` when the multiplicity is 1). After a watchdog abort the host zeroes
  flags and epoch (local/host fabrics; an aborted nvlink communicator must be re-prepared). Items wait only on flags of their **own** rank's array (``deps``, indices
  into that array); they release one flag, possibly in another rank's array
  (``rel_rank``, ``rel_flag``; ``rel_flag = -1`` releases nothing).

Items (one int32 row of ``ITEM_FIELDS`` per item; the id of an item is its row index in
its table; tables are in *natural* order, queues are permutations of the ids)
--------------------------------------------------------------------------------------
ag-gemm (pull), rank r: gathered A is ``M x K``; rank p's rows are ``[p*m_loc, (p+1)*m_loc)``.

* mover ``AG_PULL`` (p != r, band j, slice s): the band (rows ``[m0, m0+rows)`` of A_p, all K
  columns) is one contiguous byte range, cut into ``n0 = s`` of ``cols = S`` slices of
  ``ceil(ceil(bytes/16)/S)*16`` bytes (the last slice shorter; slices past the end empty) (``S = ceil(band bytes / mover_bytes)``, default 256 KiB, so
  that many WGs cooperate on the head band and bands arrive in order over a slow link);
  copy the slice into the gathered buffer at row ``p*m_loc + m0``; release band flag (p, j)
  of rank r, whose multiplicity is S.
* builder ``AG_BUILD`` (p, mt, nt): C_r rows ``p*m_loc + m0 ..`` (``m0`` is the row inside
  shard p), cols ``n0 .. n0+cols``; A rows come from A_r itself when p == r (no deps), else
  from the gathered buffer (dep: band flag (p, mt // chunk)). K = full K.

ag-wgrad (pull along the GEMM's K), rank r: the gathered operand is At (``K x M``, row-major:
tokens x features, C_r = At^T @ B_r is ``M x N/W``); rank p's rows are ``[p*k_loc, (p+1)*k_loc)``,
``k_loc = K / W``. A *band* is ``BM * chunk`` rows of one rank's ``k_loc`` rows (tokens).

* mover ``AG_PULL`` (p != r, band j, slice s): as ag-gemm's, over At: the band (rows
  ``[m0, m0+rows)`` of At_p, all M columns) is one contiguous byte range in slices; copied into
  the gathered buffer at row ``p*k_loc + m0``; releases band flag (p, j) of rank r (multiplicity S).
* builder ``AGW_BUILD`` (mt, nt): C_r rows ``m0 ..``, cols ``n0 ..``, reducing over ALL of K in
  one fixed order: the own rows first, then rank r+1's, r+2's, ... (ring order, the order the
  movers deliver). Its deps are the remote band flags in that order (one list shared by every
  tile; ``kpart`` = rows per band): the tile is claimed without them (ready at entry) and its
  loads wait for each band in turn inside the tile (the kernel's per-k-block waits), so tiles
  start on the own rows and take peers' bands as they arrive. The order is by rank, never by
  arrival: each rank's result is bitwise the same every call.
* builder ``AGW_BAND`` (``wgrad_items='band'``; group g, tile (mt, nt)): C tile's partial over
  the K rows of band group g (``wgrad_groups``: the own shard whole, then each ring shard in
  the tiles' order cut into ``wgrad_group`` bands, ``peer`` = the shard's rank, ``kpart`` = the
  group's first row in it; a group of more than a shard's bands: whole ring shards, ``peer`` =
  the first; a whole-shard group's ``kpart`` = -shards),
  added in fp32 to the rank's carry buffer (``M x N/W`` fp32): group 0 stores the carry, later
  groups load + add + store it, the last stores bf16 C. Deps: the group's band flags (none for
  the own shard) and the order flag of (g-1, mt, nt); it releases order flag (g, mt, nt) of its
  own rank (the last group releases nothing). Per tile the groups add in one fixed order:
  bitwise deterministic whatever the arrival order.

gemm-rs (push, owner reduces), rank r: A_r is ``M x K/W``, partials are ``M x N``.

* builder ``RS_BUILD`` (d, mt, nt): partial tile of destination band d (``m0`` is the row
  inside band d), K = K/W; written to recv[r][slot r] when d == r, else to the local
  staging buffer (row ``d*m_loc + m0``); releases builder flag (d, mt, nt) of rank r.
* mover ``RS_PUSH`` (d != r, band j, nt): copy the ``rows x cols`` partial from staging to
  recv[d][slot r] (same ``m0``, ``n0``); deps: the builder flags of its ``chunk`` tiles;
  releases arrival flag (r, j, nt) **of rank d**.
* mover ``RS_PROXY`` (host fabric only; s != r, band j, nt): rank r copies peer s's
  (static, host-resident) contribution to its own band into recv[r][slot s] and releases
  arrival flag (s, j, nt) of rank r, i.e. it performs the peer's push on its behalf so
  that both PCIe directions carry the traffic they would on a real fabric.
* reduce ``RS_REDUCE`` (mt, nt): ``C_r[m0:m0+rows, n0:n0+cols] = sum_{s=0..W-1} slot s``
  (fp32, in rank order: bitwise deterministic); deps: arrival flags (s, mt // chunk, nt)
  for s != r and builder flag (r, mt, nt).

Queues and the WG loop (the kernels implement exactly this; the simulator should too)
------------------------------------------------------------------------------------
Queue orders (``queue_order``): ``demand`` (below), ``fifo`` (natural id order),
``reverse`` (demand reversed), ``random`` (seeded permutation, ``seed + 7919*rank``).

* ag-gemm demand: builder bands in order [local bands if local_first] + [remote bands in
  ring order r+1, r+2, ... (all bands of one peer, in band order)] + [local bands if not
  local_first]; bands in groups of ~sqrt(builders) (``band_groups``), each group's tiles
  column by column (all of the group's bands for N tile 0, then tile 1, ...: L2 reuse of
  both operands), groups halving toward the end. Mover order = remote bands in the same
  ring order (= the order builders need them).
* ag-wgrad demand: tiles in groups of ~sqrt(builders) tile rows, each group column by column
  (every tile needs all of K: no band order to follow); movers as ag-gemm's. Band variant:
  group g's tiles (in that raster) after group g-1's, i.e. in the order the movers deliver;
  every other queue order is corrected so that each tile's groups keep their order
  (``_tile_order``: a WG never claims (g, t) before (g-1, t) was claimed).
* gemm-rs demand: builders by destination r+1, r+2, ..., r (local last; ``local_first``
  puts the local destination first instead — an ablation), band-major within a
  destination; movers in the order their builder tiles finish (the host fabric interleaves
  push and proxy items 1:1); reduces in band-major order.

WG loop (``policy='self'``): one thread per WG decides, the WG executes. Claims are atomic
increments of per-queue counters (never a compare-and-swap on a readiness check, which
serialises all WGs on one head: measured 2.6x slower). A WG that claimed a builder/reduce
that is not ready yet keeps it *pending* (at most one) and does other work first; it
blocks on it only once nothing else can be claimed. Movers take one of ``max_inflight``
*slots* (hard cap per rank, :func:`max_inflight_movers`; 0 = unlimited); with a cap the
rule is *link-first*: a WG takes a mover whenever a slot is free (keeping the link
saturated, the other WGs build), without a cap (the local fabric) builder-first.

* ag-gemm: pending ready > [cap: mover if a slot is free] > builder head ready ? claim the
  next builder (ready: run, else pending) : mover if a slot is free >
  [no slot: poll] > block on the pending / next builder (movers exhausted) > done.
* ag-wgrad: ag-gemm's rule; its tile builders are always ready to claim (their waits are inside
  the tile), its band items (``wgrad_items='band'``) are ready when their deps are (the group's
  band flags and the tile's previous order flag; the kernel's deps_in_tile is tile items only). It always has a mover cap (>= 1, every fabric: ``max_inflight_movers``): the WGs
  holding mover slots return to the loop and take the next mover, so movers progress while
  every other WG waits inside a tile (with no cap every WG could be in a tile, none moving).
* gemm-rs: pending ready (a mover also needs a free slot) > reduce head ready ? claim the
  next reduce (else pending) > claim the next mover (ready and a slot free: run it, else it
  becomes pending, so an unready push never holds back the ready items behind it) > next
  builder (builders never wait) > pending mover (slot; wait: builders exhausted) > mover if
  a slot is free (wait) > [no slot: poll] > block on the pending / next reduce (movers
  exhausted) > done. (Builders are always ready, so a
  builder-first rule would run the whole GEMM before any push; ready movers go first.)

Lookahead (the sm90 AG kernel): while a WG's tile loads are being issued, its scheduling
thread claims the next builder if one is ready right now (same rules; never a mover, never a
wait; an unready claim becomes pending), so a claim's global round trips overlap the tile.

``policy='fixed:k'``: on each rank, WGs 0..k-1 only claim movers (and wait on them), the
others only builders then reduces. ``'predicted'`` is fixed with k = :func:`predicted_movers`.
Both loops are deadlock-free for *every* queue order: a WG blocks on an item only once
every item that item can depend on has been claimed by a WG that never blocks on it
(tests/test_schedule.py checks this by simulation).

Kernel-side bookkeeping (documented here for the simulator): queue counters are reset by
the last WG of each call; flags are epoch-based and never reset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .kosmos import decide as _decide

OPS = ("ag-gemm", "gemm-rs", "ag-wgrad")
AG_OPS = ("ag-gemm", "ag-wgrad")  # pull movers (AG_PULL) over band flags
QUEUE_ORDERS = ("demand", "fifo", "reverse", "random")

# Item kinds (column 'kind' of an item row).
AG_PULL, AG_BUILD, RS_BUILD, RS_PUSH, RS_PROXY, RS_REDUCE, AGW_BUILD, AGW_BAND = range(8)
KIND_NAMES = ("AG_PULL", "AG_BUILD", "RS_BUILD", "RS_PUSH", "RS_PROXY", "RS_REDUCE", "AGW_BUILD", "AGW_BAND")
WGRAD_ITEMS = ("tile", "band")  # ag-wgrad builders: one tile over all of K | (band group, tile) partials
WGRAD_GROUP_ROWS = 2048  # band variant, auto group: K rows per group (carry traffic <= 1/8 of the operands')
# Roles in traces (TRACE_COLUMNS 'role').
ROLE_MOVE, ROLE_BUILD, ROLE_REDUCE, ROLE_WAIT = range(4)
ROLE_NAMES = ("MOVE", "BUILD", "REDUCE", "WAIT")
# Queue indices (the kernel's per-rank queue slots).
Q_BUILD, Q_MOVE, Q_REDUCE = range(3)

ITEM_FIELDS = ("kind", "peer", "m0", "rows", "n0", "cols", "dep_begin", "dep_count", "rel_rank", "rel_flag",
               "kpart")
ITEM_STRIDE = len(ITEM_FIELDS)  # int32 words per item row; must match csrc/kosmos/queue.cuh
# kpart: AGW_BUILD: rows of At per band (the granularity of the tile's waits); AGW_BAND: the
# group's first row inside its peer's shard (rows: meta["group_rows"], the last group of a
# shard shorter), or -n for a group of n whole shards from ``peer`` on (ring order); else 0.
F = {name: i for i, name in enumerate(ITEM_FIELDS)}

ELEM_BYTES = 2  # bf16

# Default cost-model parameters for predicted_movers (per fabric). Units in the keys.
# The simulator's hardware profiles can pass their own dict with the same keys.
#   link_gbs            one direction of the rank's link
#   link_duplex         2.0 when both directions carry traffic at full rate (gemm-rs pushes + pulls)
#   alpha_us            per-item latency (flag round trip + claim)
#   wg_copy_gbs         one mover WG's rate on contiguous bands (ag-gemm)
#   wg_tile_copy_gbs    one mover WG's rate on 128x128 partial tiles (gemm-rs)
#   wg_tflops           one builder WG's GEMM rate
#   wg_reduce_gbs       one WG's reduce rate (bytes read + written)
# Host values measured on one H200 (2026-12-02, scripts/device_kernels.py at f4e2aab): fixed:1 moves
# ag-gemm bands at ~13 GB/s and gemm-rs tiles at ~4.9 GB/s per WG; the link saturates near
# 46 GB/s (SM loads) and collapses with >= 32 concurrent ag-gemm movers.
MODEL_DEFAULTS: dict[str, dict[str, float]] = {
    # one H200, peers' data in pinned host memory over PCIe gen5 (~54 GB/s copy-engine H2D)
    "host": {"link_gbs": 46.0, "link_duplex": 2.0, "alpha_us": 2.0, "wg_copy_gbs": 7.0, "wg_tile_copy_gbs": 3.0,
             "wg_tflops": 2.5, "wg_reduce_gbs": 40.0},
    # W emulated ranks on one GPU: "links" are HBM copies
    "local": {"link_gbs": 1500.0, "link_duplex": 1.0, "alpha_us": 1.0, "wg_copy_gbs": 30.0, "wg_tile_copy_gbs": 20.0,
              "wg_tflops": 2.5, "wg_reduce_gbs": 40.0},
    # 8x H200 NVLink 4 (~450 GB/s per direction per GPU, practical ~360)
    "nvlink": {"link_gbs": 360.0, "link_duplex": 2.0, "alpha_us": 1.5, "wg_copy_gbs": 30.0, "wg_tile_copy_gbs": 20.0,
               "wg_tflops": 2.5, "wg_reduce_gbs": 40.0},
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FlagLayout:
    """Per-rank flag array layout (uint32 words; same on every rank).

    * ``[entry, entry+W)``: entry flag of rank s ("my inputs are written, you may read/write
      my buffers"), written by s into every rank's array at ``entry + s``.
    * ``[exit, exit+W)``: exit flag of rank s ("I will not touch your buffers again this
      call"), written by s into every rank's array at ``exit + s``.
    * ag-gemm, ag-wgrad: band flag (p, j) at ``band + p*num_bands + j``; ag-wgrad band variant:
      order flag (g, mt, nt) at ``built + g*m_tiles*n_tiles + mt*n_tiles + nt``.
    * gemm-rs: builder flag (d, mt, nt) at ``built + (d*mt_per_band_set + mt)*nt_n + nt``
      (``mt_per_band_set = m_tiles``), arrival flag (s, j, nt) at
      ``arrived + (s*num_bands + j)*nt_n + nt``.
    """

    world: int
    entry: int
    exit: int
    band: int = -1
    built: int = -1
    arrived: int = -1
    num_flags: int = 0


@dataclass
class ItemTable:
    """One kind-group of items (builders, movers or reduces) of one rank.

    table: int32 (n, ITEM_STRIDE) rows (see ITEM_FIELDS), natural order, id = row index.
    queue: int32 (n,) item ids in priority order (a permutation of arange(n)).
    flops, bytes: float64 (n,) cost of each item (bytes = bytes moved through the link for
    movers, bytes read + written for builders / reduces).
    """

    table: np.ndarray
    queue: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def col(self, name: str) -> np.ndarray:
        return self.table[:, F[name]]

    def deps_of(self, i: int, deps: np.ndarray) -> np.ndarray:
        b, c = self.table[i, F["dep_begin"]], self.table[i, F["dep_count"]]
        return deps[b:b + c]


@dataclass
class RankSchedule:
    """Everything rank ``rank`` executes in one call (see the module docstring)."""

    op: str
    M: int
    N: int
    K: int
    world: int
    rank: int
    BM: int
    BN: int
    chunk: int
    num_wgs: int  # WGs of THIS rank
    policy: str
    num_movers: int | None  # k for fixed/predicted, None for self
    max_inflight: int  # policy self: soft cap on concurrent mover items of this rank (0 = none)
    queue_order: str
    local_first: bool
    fabric: str
    flags: FlagLayout
    builders: ItemTable
    movers: ItemTable
    reduces: ItemTable
    deps: np.ndarray  # int32 flat list of flag indices (own flag array)
    # Flags of this rank's array that *peers* release (entry/exit/arrivals); on the host
    # fabric, where peers do not execute, the kernel sets these to the epoch at entry.
    peer_flags: np.ndarray
    flag_mult: np.ndarray  # int32 (num_flags,) releases needed per call (see module doc)
    meta: dict = field(default_factory=dict)

    @property
    def queues(self) -> tuple[ItemTable, ItemTable, ItemTable]:
        """(builders, movers, reduces), indexed by Q_BUILD, Q_MOVE, Q_REDUCE."""
        return self.builders, self.movers, self.reduces

    def arrays(self) -> dict[str, np.ndarray]:
        """The int32 arrays the kernel receives (contiguous)."""
        out = {}
        for name, t in (("builder", self.builders), ("mover", self.movers), ("reduce", self.reduces)):
            out[f"{name}_items"] = np.ascontiguousarray(t.table, dtype=np.int32).reshape(-1)
            out[f"{name}_queue"] = np.ascontiguousarray(t.queue, dtype=np.int32)
        out["deps"] = np.ascontiguousarray(self.deps, dtype=np.int32)
        out["peer_flags"] = np.ascontiguousarray(self.peer_flags, dtype=np.int32)
        out["flag_mult"] = np.ascontiguousarray(self.flag_mult, dtype=np.int32)
        return out

    def total_flops(self) -> float:
        return float(sum(t.flops.sum() for t in self.queues))

    def link_bytes(self) -> float:
        return float(self.movers.bytes.sum())


# ---------------------------------------------------------------------------------------
# WG assignment and the mover count


def wg_ranks(num_wgs: int, world: int) -> np.ndarray:
    """Rank of each WG on the ``local`` fabric: contiguous blocks, sizes differ by <= 1.

    Returns int32 (num_wgs,). Rank r owns WGs [starts[r], starts[r+1]) of wg_starts().
    """
    return np.repeat(np.arange(world, dtype=np.int32), np.diff(wg_starts(num_wgs, world)))


def wg_starts(num_wgs: int, world: int) -> np.ndarray:
    """int32 (world+1,) first WG of each rank on the local fabric (last entry = num_wgs)."""
    if num_wgs < world:
        raise ValueError(f"{num_wgs} WGs cannot host {world} emulated ranks")
    base, extra = divmod(num_wgs, world)
    sizes = [base + (1 if r < extra else 0) for r in range(world)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)


def _comm_and_compute(op: str, M: int, N: int, K: int, world: int) -> tuple[float, float, float]:
    """(link bytes, builder FLOPs, reduce bytes) of one rank."""
    W = world
    if op == "ag-gemm":
        return (W - 1) * (M // W) * K * ELEM_BYTES, 2.0 * M * (N // W) * K, 0.0
    if op == "gemm-rs":
        red = (M // W) * N * ELEM_BYTES * (W + 1)
        return (W - 1) * (M // W) * N * ELEM_BYTES, 2.0 * M * N * (K // W), red
    if op == "ag-wgrad":
        return (W - 1) * (K // W) * M * ELEM_BYTES, 2.0 * M * (N // W) * K, 0.0
    raise ValueError(f"unknown op {op!r}")


def _model(fabric: str, model: dict | None) -> dict:
    p = dict(MODEL_DEFAULTS.get(fabric, MODEL_DEFAULTS["host"]))
    p.update(model or {})
    return p


def _link_and_wg_rate(op: str, p: dict) -> tuple[float, float]:
    """(link bytes/s as the op uses it, one mover WG's bytes/s)."""
    if op == "gemm-rs":
        return p["link_gbs"] * 1e9 * p.get("link_duplex", 1.0), p.get("wg_tile_copy_gbs", p["wg_copy_gbs"]) * 1e9
    return p["link_gbs"] * 1e9, p["wg_copy_gbs"] * 1e9


def predicted_movers(op: str, M: int, N: int, K: int, world: int, num_wgs: int,
                     model: dict | None = None, fabric: str = "host", num_items: int | None = None,
                     slack: float = 0.02) -> int:
    """Mover WG count k (1 <= k <= num_wgs-1) of the 'predicted' policy.

    Alpha-beta + GEMM-rate model of one rank with ``num_wgs`` WGs:
    ``t_comm(k) = alpha * items / k + bytes / min(k * wg_copy_bw, link_bw)`` and
    ``t_build(k) = flops / ((num_wgs - k) * wg_rate) + reduce_bytes / ((num_wgs - k) * wg_reduce_bw)``;
    k is the fewest movers whose ``max(t_comm, t_build)`` is within ``slack`` of the best
    (extra movers past link saturation only add contention). ``model`` keys are those of
    ``MODEL_DEFAULTS[fabric]`` (missing keys fall back to them).
    """
    if num_wgs < 2:
        raise ValueError("predicted policy needs at least 2 WGs per rank")
    p = _model(fabric, model)
    nbytes, flops, red = _comm_and_compute(op, M, N, K, world)
    if num_items is None:
        num_items = max(1, (world - 1) * cdiv((K if op == "ag-wgrad" else M) // world, 128))
    link, wg_bw = _link_and_wg_rate(op, p)
    ts = []
    for k in range(1, num_wgs):
        t_comm = p["alpha_us"] * 1e-6 * num_items / k + nbytes / min(k * wg_bw, link)
        b = num_wgs - k
        t_build = flops / (b * p["wg_tflops"] * 1e12) + red / (b * p["wg_reduce_gbs"] * 1e9)
        ts.append(max(t_comm, t_build))
    best = min(ts)
    return next(k for k, t in enumerate(ts, start=1) if t <= best * (1 + slack))


def max_inflight_movers(op: str, fabric: str, num_wgs: int, model: dict | None = None,
                        override: int | None = None) -> int:
    """Hard cap on concurrent mover items ("slots") of policy 'self' (0 = none).

    A link property, not a role split: the WGs that saturate the link
    (``ceil(link_bw / wg_copy_bw)``, at most num_wgs - 1 so that builders always progress),
    on every fabric with a link: host and nvlink. The host PCIe link needs it (measured on
    one H200: ag-gemm with 48 mover WGs ran 1.5x slower than with 8; gemm-rs tile pushes
    took 3-5x longer each with ~80 concurrent movers). On NVLink the simulator showed the
    same (h200-nvlink-x8, sm90 ag-gemm: uncapped, idle WGs all became movers on the
    saturated link, kosmos[self] 21% behind 'predicted' at 16384x18432x16384; capped, level
    with it or ahead on every shape of sweeps/ag-gemm.yaml and gemm-rs.yaml,
    tests/test_sim_point.py). Only ``local`` (copies within one GPU's HBM) runs uncapped.
    The kernels (RankArgs.max_inflight_movers, via kosmos.plan), ``kosmos.decide`` (its
    ``v.cap``) and the simulator all read this value from the RankSchedule.
    ``override`` (the configuration's ``max_inflight``) replaces the rule on every fabric
    (0: no cap). ag-wgrad is capped on every fabric, local included, and never below 1 (an
    override of 0 is 1): its builders wait for the movers inside their tiles, so the WGs
    holding mover slots are what keeps the movers going (module docstring).
    """
    floor = 1 if op == "ag-wgrad" else 0
    if override is not None:
        return max(floor, min(int(override), num_wgs - 1))
    if fabric == "local" and op != "ag-wgrad":
        return 0
    p = _model(fabric, model)
    link, wg_bw = _link_and_wg_rate(op, p)
    return int(max(1, min(num_wgs - 1, math.ceil(link / wg_bw))))


def resolve_movers(policy: str, op: str, M: int, N: int, K: int, world: int, num_wgs: int,
                   model: dict | None = None, fabric: str = "host") -> int | None:
    """k for 'fixed:k' / 'predicted' (validated against num_wgs), None for 'self'."""
    if policy == "self":
        return None
    if policy == "predicted":
        return predicted_movers(op, M, N, K, world, num_wgs, model, fabric)
    from .kosmos.decide import parse_policy

    kind, k = parse_policy(policy)
    if kind == "fixed":
        if k >= num_wgs:
            raise ValueError(f"policy {policy!r}: k={k} leaves no builder among {num_wgs} WGs per rank")
        return k
    raise ValueError(f"policy {policy!r}: expected 'self', 'predicted' or 'fixed:<k>'")


# ---------------------------------------------------------------------------------------
# Builders of the item tables


class _Tab:
    def __init__(self):
        self.rows: list[list[int]] = []
        self.flops: list[float] = []
        self.bytes: list[float] = []

    def add(self, kind, peer, m0, rows, n0, cols, deps_list, deps, rel_rank, rel_flag, flops, nbytes,
            kpart: int = 0) -> int:
        self.rows.append([kind, peer, m0, rows, n0, cols, len(deps), len(deps_list), rel_rank, rel_flag, kpart])
        deps.extend(deps_list)
        self.flops.append(float(flops))
        self.bytes.append(float(nbytes))
        return len(self.rows) - 1

    def done(self, order: list[int]) -> ItemTable:
        t = np.asarray(self.rows, dtype=np.int32).reshape(-1, ITEM_STRIDE)
        return ItemTable(t, np.asarray(order, dtype=np.int32), np.asarray(self.flops), np.asarray(self.bytes))


def _tiles(m_extent: int, bm: int, n_extent: int, bn: int):
    """(mt, m0, rows, nt, n0, cols) of every bm x bn tile of an m_extent x n_extent grid, row
    band by row band; the last band / column tile is partial."""
    for mt in range(cdiv(m_extent, bm)):
        m0 = mt * bm
        rows = min(bm, m_extent - m0)
        for nt in range(cdiv(n_extent, bn)):
            n0 = nt * bn
            yield mt, m0, rows, nt, n0, min(bn, n_extent - n0)


def band_groups(num_bands: int, builders: int, ramp: bool = False, tail: int = 1, size: int | None = None,
                halve: bool = True) -> list[slice]:
    """Consecutive groups of bands whose tiles the ag-gemm demand order rasters column by
    column. A wave of ``builders`` concurrent tiles then reads g A-panels and builders/g
    B-panels (g ~ sqrt(builders)) instead of the whole of B for every band or two (band-major
    order: B re-streamed from HBM per wave, measured 0.72-0.80x cuBLAS on wide-N layers).
    Groups halve toward the end so the work left after the last band arrives stays about
    one band; with ``ramp`` (bands that arrive one after another) they also start at one
    band and double, so the first arrivals are not held back by a whole group. ``tail``: the
    smallest group the halving goes down to (streamed K-slices, ``stream_k``: the last group
    is one wave of tiles that all start on its first slice, not one band). ``size``: the
    regular group size instead of ~sqrt(builders) (smaller groups wait less for their last
    band, larger ones reread B less). ``halve=False``: no halving (only the ``tail`` group
    and the remainder are smaller than ``size``)."""
    last = []
    if tail > 1 and num_bands > tail:  # exactly `tail` bands last (a smaller remainder would end it)
        num_bands, last = num_bands - tail, [slice(num_bands - tail, num_bands)]
    g = max(1, int(size) if size else int(round(math.sqrt(max(1, builders)))))
    out, b, grow = [], 0, 1 if ramp else g
    while b < num_bands:
        n = min(grow, g, num_bands - b, max(1, tail, (num_bands - b + 1) // 2) if halve else g)
        out.append(slice(b, b + n))
        b += n
        grow *= 2
    return out + last


def peer_groups(peers: int, per_peer: int, tail: int = 1) -> list[slice]:
    """Remote demand-order groups that never straddle two peers (copy-engine movers copy a
    group's bands of one peer as one copy, and every copy beyond one per peer costs the engine
    ~2.5 us: results/issue4-h200-20261203/probes/copy_split-*): the first peer ramps 1, 2, 4, ...
    bands (its remainder joins the last ramp group), every middle peer is one group, and the
    last peer halves down to ``tail`` bands (``band_groups``). Bands are numbered peer-major."""
    if peers < 2:
        return band_groups(per_peer * peers, 0, ramp=True, tail=tail, size=per_peer)
    out, b, k = [], 0, 1
    while b < per_peer:  # the ramp inside the first peer
        n = k if per_peer - b - k >= 2 * k else per_peer - b
        out.append(slice(b, b + n))
        b, k = b + n, 2 * k
    out += [slice(i * per_peer, (i + 1) * per_peer) for i in range(1, peers - 1)]
    lo = (peers - 1) * per_peer
    return out + [slice(lo + g.start, lo + g.stop) for g in band_groups(per_peer, 0, tail=tail, size=per_peer)]


PEER_GROUPS = "peer"  # band_group: remote groups aligned to peer shards (peer_groups)
BALANCED_GROUP = 6  # bands per demand-order group when link and builders are balanced
BALANCED_RHO = (0.7, 2.0)  # rho window called balanced (measured: 0.47 -> sqrt, 0.88 -> 6)


def link_compute_ratio(n_loc: int, builders: int, fabric: str, model: dict | None = None) -> float:
    """rho = time all builders need for one band's tiles / time the link needs to bring one
    band, at the fabric model's nominal rates (``link_gbs``, ``wg_tflops`` per builder):
    n_loc * link / (builders * tflops). Independent of K and of the band height."""
    p = _model(fabric, model)
    return n_loc * p["link_gbs"] * 1e9 / (max(1, builders) * p["wg_tflops"] * 1e12)


def demand_group(n_loc: int, builders: int, fabric: str, model: dict | None = None) -> int:
    """Bands per remote demand-order group. ~sqrt(builders) keeps a wave of tiles on few A
    and B panels (L2 reuse), but its tiles need the group's last band, which arrives
    (g - 1) band-copies after its first. That wait only costs when link and builders are
    balanced (BALANCED_RHO): slower builders have a backlog of arrived bands, a slower link
    leaves them idle anyway. There the groups are BALANCED_GROUP bands (host fabric, 405b
    FC1, 1x H200: 3-bands groups 3-7% faster than sqrt groups in single traced calls,
    results/issue4-h200-20261203/timeline/; back to back, where the 700 W limit sets the clock,
    6-band groups 2-4% faster than 3 (they stream B from HBM half as often) and ~1.5% than 11:
    probes/b2b_groups-405b.parquet, energy_groups.parquet).
    Host fabric only so far: on NVLink a band arrives in ~6 us, so an 11-band group waits
    ~60 us, and whether that beats the L2 reuse is unmeasured (no multi-GPU box yet)."""
    lo, hi = BALANCED_RHO
    if fabric == "host" and lo <= link_compute_ratio(n_loc, builders, fabric, model) <= hi:
        return BALANCED_GROUP
    return max(1, round(math.sqrt(max(1, builders))))


def ramp_needed(own_bands: int, n_loc: int, builders: int, group: int, fabric: str, model: dict | None = None) -> bool:
    """Whether the remote demand groups must start small (1, 2, 4, ... bands: ``band_groups``'
    ramp) so that the builders are not idle while the first regular group's copy arrives. Not
    on the host fabric where the ``own_bands`` (ready at entry, built first) take the builders at
    least as long as the link takes for ``group`` bands (own_bands * rho >= group): there the
    ramp only adds demand groups, and every group streams B from HBM once (405b FC1, K = 16384:
    436 MB a group; a 1-2 band group is HBM-bound). Measured on 405b FC1 8k, host fabric (rho
    0.88, 8 own bands, 6-band groups): no ramp and regular own groups 4812 / 4813 us against
    4837 / 4976 with both (results/issue4-h200-20261204b/). Other fabrics: unmeasured, ramp kept."""
    if fabric != "host":
        return True
    return own_bands * link_compute_ratio(n_loc, builders, fabric, model) < group


def _order(natural: list[int], demand: list[int], queue_order: str, rng: np.random.Generator) -> list[int]:
    if queue_order == "demand":
        return list(demand)
    if queue_order == "fifo":
        return list(natural)
    if queue_order == "reverse":
        return list(reversed(demand))
    if queue_order == "random":
        return [int(i) for i in rng.permutation(np.asarray(natural, dtype=np.int64))]
    raise ValueError(f"queue_order {queue_order!r}: expected one of {', '.join(QUEUE_ORDERS)}")


def _tile_order(q: list[int], key: dict[int, tuple]) -> list[int]:
    """``q`` with each tile's items in group order (key: item -> (tile, group)); the positions
    a tile's items take in ``q`` stay its positions."""
    by_tile: dict = {}
    for i in q:
        by_tile.setdefault(key[i][0], []).append(i)
    for v in by_tile.values():
        v.sort(key=lambda i: key[i][1])
    nxt = {t: iter(v) for t, v in by_tile.items()}
    return [next(nxt[key[i][0]]) for i in q]


def wgrad_group_bands(band_rows: int, bands_per_shard: int, group: int | None = None) -> int:
    """Bands per ag-wgrad band-variant group: ``group`` when given, else the fewest bands with
    at least WGRAD_GROUP_ROWS K rows (a 128 x 256 tile's fp32 carry load + store is 8*128*256
    bytes against 2*k*(128+256) of operands: 1/8 or less from k = 2048 on), at most a shard.
    A ``group`` of more than a shard's bands: groups of whole remote shards (``wgrad_groups``)."""
    return max(1, int(group) if group else min(cdiv(WGRAD_GROUP_ROWS, band_rows), bands_per_shard))


def wgrad_groups(r: int, ring: list[int], nb: int, gb: int) -> list[tuple[list[int], int, int]]:
    """ag-wgrad band groups in the tiles' K order, each (shards, j0, j1): bands [j0, j1) of each
    shard in ``shards``. The own shard first, always one group: it is there at entry, and cutting
    it only adds fp32 carry passes over C_r (world 1, M 16384 x N 53248 x K 8192 on an H100: 32.4
    ms in 2048-row groups, 22.0 as one, cuBLAS 20.5). Then the ring's shards: gb <= nb (a shard's
    bands) cut into groups of gb bands; gb > nb: ceil(gb / nb) whole ring shards a group, fewer
    carry passes (at 8192 tokens a shard is 1024 rows, half the rule's 2048: one group a shard),
    but a group starts only once its last shard is in (H100 host W=8, two shards a group: 405b
    FC1 10.9 ms against 11.6, 16384 x 53248 6.03 against 5.92; docs/notes/wgrad-groups.md)."""
    if gb <= nb:
        return [([r], 0, nb)] + [([p], j0, min(nb, j0 + gb)) for p in ring for j0 in range(0, nb, gb)]
    s = cdiv(gb, nb)
    return [([r], 0, nb)] + [(ring[i:i + s], 0, nb) for i in range(0, len(ring), s)]


def validate(op: str, M: int, N: int, K: int, world: int, BM: int = 128, BN: int = 128, chunk: int = 1) -> str | None:
    """None if the kernels take this problem, else a one-line reason."""
    if op not in OPS:
        return f"unknown op {op!r}"
    if world < 1 or world > 8:
        return f"world={world}: the kosmos kernels support 1..8 ranks"
    if M % world and op != "ag-wgrad":  # ag-wgrad: C_r has all M rows; its shards are K's
        return f"M={M} is not divisible by world={world}"
    if op in AG_OPS and N % world:
        return f"N={N} is not divisible by world={world}"
    if op == "ag-wgrad" and K % world:
        return f"K={K} is not divisible by world={world}"
    if op == "gemm-rs" and K % world:
        return f"K={K} is not divisible by world={world}"
    if min(M, N, K) < 1 or chunk < 1:
        return "M, N, K and chunk must be >= 1"
    if (K if op == "ag-wgrad" else M) // world < 1:
        return "empty shards"
    if M * max(N, K) >= 2 ** 31:
        return f"M*max(N,K)={M * max(N, K)} elements does not fit int32 item offsets"
    return None


def build_schedule(op: str, M: int, N: int, K: int, world: int, rank: int, *, BM: int = 128, BN: int = 128,
                   chunk: int = 1, num_wgs: int = 132, policy: str = "self", queue_order: str = "demand",
                   seed: int = 0, local_first: bool | None = None, fabric: str = "local",
                   model: dict | None = None, mover_bytes: int = 256 * 1024,
                   stream_k: bool = False, band_group: int | str | None = None,
                   tail_bands: int | None = None, ramp: bool | None = None, halve: bool = True,
                   local_group: int | None = None, max_inflight: int | None = None,
                   wgrad_items: str = "band", wgrad_group: int | None = None) -> RankSchedule:
    """The schedule of one rank. ``num_wgs`` is the WG count of THIS rank (on the local
    fabric: ``np.diff(wg_starts(G, W))[rank]``). ``local_first`` defaults to True for
    ag-gemm and False (local destination last) for gemm-rs. ``fabric='host'`` adds the
    RS_PROXY items of gemm-rs; other fabrics share one schedule. ``stream_k`` (ag-gemm,
    copy-engine movers delivering the last remote group in K-slices): remote band groups
    halve only down to one wave of tiles (``builders // n_tiles`` bands), not to one band.
    ``band_group`` (ag-gemm): bands per regular remote demand-order group (default
    ``demand_group``: ~sqrt(builders), fewer when link and builders are balanced), or
    ``PEER_GROUPS`` ("peer"): groups aligned to peer shards (``peer_groups``). ``tail_bands``
    (``stream_k``): bands of the last remote group instead of one wave of tiles. ``ramp`` /
    ``halve`` (ag-gemm): the remote groups start small and double / shrink toward the end
    (``band_groups``); off, every remote group is regular; ``ramp=None`` (default): only where
    the own bands do not cover the first group's copy (``ramp_needed``); the rank's own bands
    (ready at entry) are in regular groups (halving buys nothing where nothing arrives);
    ``local_group`` (ag-gemm): bands per regular group of the own bands (default: as the remote
    ``band_group`` when given, else ~sqrt(builders)); ``max_inflight``: policy self's mover cap
    instead of ``max_inflight_movers``' rule (0: none). ``wgrad_items`` (ag-wgrad): ``tile``
    (AGW_BUILD) or ``band`` (AGW_BAND items of ``wgrad_group`` bands, default
    ``wgrad_group_bands``' rule).
    """
    if wgrad_items not in WGRAD_ITEMS:
        raise ValueError(f"wgrad_items {wgrad_items!r}: expected one of {', '.join(WGRAD_ITEMS)}")
    why = validate(op, M, N, K, world, BM, BN, chunk)
    if why:
        raise ValueError(why)
    if queue_order not in QUEUE_ORDERS:
        raise ValueError(f"queue_order {queue_order!r}: expected one of {', '.join(QUEUE_ORDERS)}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world {world}")
    W, r = world, rank
    if local_first is None:
        local_first = op == "ag-gemm"
    k_movers = resolve_movers(policy, op, M, N, K, W, num_wgs, model, fabric)
    rng = np.random.default_rng(seed + 7919 * rank)
    m_loc = M // W
    mt_n = cdiv(m_loc, BM)
    nb = cdiv(mt_n, chunk)
    band_rows = BM * chunk
    ring = [(r + i) % W for i in range(1, W)]  # remote ranks, ring-staggered
    deps: list[int] = []
    bt, mv, rd = _Tab(), _Tab(), _Tab()
    mult: dict[int, int] = {}

    remote_groups: list = []
    meta_extra: dict = {}
    remote_ramp = False  # ag-gemm: whether the remote groups start small (ramp / ramp_needed)
    if op == "ag-gemm":
        n_loc = N // W
        nt_n = cdiv(n_loc, BN)
        lay = FlagLayout(W, entry=0, exit=W, band=2 * W, num_flags=2 * W + W * nb)
        pull_id = _pulls(mv, mult, deps, lay, W, r, nb, band_rows, m_loc, K, mover_bytes)
        build_id: dict[tuple[int, int, int], int] = {}
        for p in range(W):
            for mt, m0, rows, nt, n0, cols in _tiles(m_loc, BM, n_loc, BN):
                dl = [] if p == r else [lay.band + p * nb + mt // chunk]
                build_id[p, mt, nt] = bt.add(AG_BUILD, p, m0, rows, n0, cols, dl, deps, -1, -1, 2.0 * rows * cols * K,
                                             (rows * K + K * cols + rows * cols) * ELEM_BYTES)
        b_demand = []
        for seg in ([r], ring) if local_first else (ring, [r]):  # local bands ready at entry, remote as they arrive
            bands = [(p, mt) for p in seg for mt in range(mt_n)]
            builders_n = num_wgs - (k_movers or 0)
            # one wave of tiles, at most a regular group (~sqrt(builders) bands)
            by_peer = band_group == PEER_GROUPS and seg is ring
            g = (local_group if seg is not ring and local_group else
                 (mt_n if by_peer else band_group) or (demand_group(n_loc, builders_n, fabric, model) if seg is ring
                                                       else max(1, round(math.sqrt(builders_n)))))
            g = int(g) if isinstance(g, int) else max(1, round(math.sqrt(builders_n)))  # "peer" on the local segment
            tail = (tail_bands or min(max(1, builders_n // nt_n), g)) if (stream_k and seg is ring) else 1
            if seg is ring:
                remote_ramp = bool(ramp) if ramp is not None else ramp_needed(
                    mt_n if local_first else 0, n_loc, builders_n, g, fabric, model)
            # own bands (ready at entry) in regular groups: halving buys nothing where nothing arrives
            groups = (peer_groups(len(ring), mt_n, tail) if by_peer else
                      band_groups(len(bands), builders_n, ramp=remote_ramp and seg is ring, tail=tail, size=g,
                                  halve=halve and seg is ring) if bands else [])
            for grp in groups:  # column by column
                b_demand += [build_id[p, mt, nt] for nt in range(nt_n) for p, mt in bands[grp]]
            if seg is ring:  # tile rows of the remote bands needed together (copy-engine movers copy them together)
                remote_groups = [[(p, mt) for p, mt in bands[grp]] for grp in groups]
        m_demand = [i for p in ring for j in range(nb) for i in pull_id[p, j]]
        builders = bt.done(_order(list(range(len(bt.rows))), b_demand, queue_order, rng))
        movers = mv.done(_order(list(range(len(mv.rows))), m_demand, queue_order, rng))
        reduces = rd.done([])  # ag-gemm has no reduce items
        peer_flags = [lay.entry + s for s in range(W) if s != r] + [lay.exit + s for s in range(W) if s != r]
    elif op == "ag-wgrad":
        k_loc = K // W
        n_loc = N // W
        mt_n, nt_n = cdiv(M, BM), cdiv(n_loc, BN)
        nb = cdiv(k_loc, band_rows)
        lay = FlagLayout(W, entry=0, exit=W, band=2 * W, num_flags=2 * W + W * nb)
        pull_id = _pulls(mv, mult, deps, lay, W, r, nb, band_rows, k_loc, M, mover_bytes)
        builders_n = num_wgs - (k_movers or 0)
        raster = [(mt, nt) for grp in band_groups(mt_n, builders_n, size=local_group, halve=False)
                  for nt in range(nt_n) for mt in range(grp.start, grp.stop)]
        if wgrad_items == "tile":
            # the remote band flags in the tiles' K order (own rows first, then r+1, r+2, ...): one
            # list, shared by every tile (dep_begin / dep_count of each builder row)
            kdeps = [lay.band + p * nb + j for p in ring for j in range(nb)]
            k_begin = len(deps)
            deps.extend(kdeps)
            build_id = {}
            for mt, m0, rows, nt, n0, cols in _tiles(M, BM, n_loc, BN):
                build_id[mt, nt] = bt.add(AGW_BUILD, r, m0, rows, n0, cols, [], deps, -1, -1, 2.0 * rows * cols * K,
                                          (rows * K + K * cols + rows * cols) * ELEM_BYTES, kpart=band_rows)
                bt.rows[-1][F["dep_begin"]], bt.rows[-1][F["dep_count"]] = k_begin, len(kdeps)
            b_demand = [build_id[t] for t in raster]
            b_order = _order(list(range(len(bt.rows))), b_demand, queue_order, rng)
        else:
            gb = wgrad_group_bands(band_rows, nb, wgrad_group)
            groups = wgrad_groups(r, ring, nb, gb)
            ng, tn = len(groups), mt_n * nt_n
            lay = FlagLayout(W, entry=0, exit=W, band=2 * W, built=2 * W + W * nb,
                             num_flags=2 * W + W * nb + ng * tn)
            build_id, key = {}, {}
            for g, (ps, j0, j1) in enumerate(groups):
                # part of a shard: its rows [k0, k0 + krows), kpart = k0; whole shards (the own
                # one, or more than a shard's bands): kpart = -shards
                k0, krows = j0 * band_rows, min(k_loc, j1 * band_rows) - j0 * band_rows
                whole = len(ps) > 1 or (j0 == 0 and j1 == nb)
                kpart, krows = (-len(ps), len(ps) * k_loc) if whole else (k0, krows)
                bdeps = [lay.band + p * nb + j for p in ps if p != r for j in range(j0, j1)]
                for mt, m0, rows, nt, n0, cols in _tiles(M, BM, n_loc, BN):
                    t = mt * nt_n + nt
                    dl = bdeps + ([lay.built + (g - 1) * tn + t] if g else [])
                    carry = rows * cols * ((4 if g else 0) + (2 if g == ng - 1 else 4))
                    build_id[g, mt, nt] = i = bt.add(
                        AGW_BAND, ps[0], m0, rows, n0, cols, dl, deps, r if g < ng - 1 else -1,
                        lay.built + g * tn + t if g < ng - 1 else -1, 2.0 * rows * cols * krows,
                        (rows * krows + krows * cols) * ELEM_BYTES + carry, kpart=kpart)
                    key[i] = ((mt, nt), g)
            b_demand = [build_id[g, mt, nt] for g in range(ng) for mt, nt in raster]
            b_order = _tile_order(_order(list(range(len(bt.rows))), b_demand, queue_order, rng), key)
            meta_extra["group_rows"] = min(gb, nb) * band_rows
            meta_extra["num_groups"] = ng
            # the remote groups' bands as (peer, first row // BM), ag-gemm's keys: copy-engine movers
            # copy a group's bands together (ce_plan.build). Tile items have none: one copy per peer.
            remote_groups = [[(p, j * chunk) for p in ps for j in range(j0, j1)] for ps, j0, j1 in groups if ps != [r]]
        m_demand = [i for p in ring for j in range(nb) for i in pull_id[p, j]]
        builders = bt.done(b_order)
        movers = mv.done(_order(list(range(len(mv.rows))), m_demand, queue_order, rng))
        reduces = rd.done([])
        peer_flags = [lay.entry + s for s in range(W) if s != r] + [lay.exit + s for s in range(W) if s != r]
        meta_extra.update(k_loc=k_loc, band_rows=band_rows, wgrad_items=wgrad_items)
    else:
        k_loc = K // W
        nt_n = cdiv(N, BN)
        built = 2 * W
        arrived = built + W * mt_n * nt_n
        lay = FlagLayout(W, entry=0, exit=W, built=built, arrived=arrived, num_flags=arrived + W * nb * nt_n)

        def built_flag(d, mt, nt):
            return built + (d * mt_n + mt) * nt_n + nt

        def arrived_flag(s, j, nt):
            return arrived + (s * nb + j) * nt_n + nt

        build_id = {}
        for d in range(W):
            for mt, m0, rows, nt, n0, cols in _tiles(m_loc, BM, N, BN):
                build_id[d, mt, nt] = bt.add(RS_BUILD, d, m0, rows, n0, cols, [], deps, r, built_flag(d, mt, nt),
                                             2.0 * rows * cols * k_loc,
                                             (rows * k_loc + k_loc * cols + rows * cols) * ELEM_BYTES)
        push_id = {}
        for d in range(W):
            if d == r:
                continue
            for j, m0, rows, nt, n0, cols in _tiles(m_loc, band_rows, N, BN):
                dl = [built_flag(d, mt, nt) for mt in range(j * chunk, min(mt_n, (j + 1) * chunk))]
                push_id[d, j, nt] = mv.add(RS_PUSH, d, m0, rows, n0, cols, [lay.entry + d] + dl, deps, d,
                                           arrived_flag(r, j, nt), 0, rows * cols * ELEM_BYTES)
        proxy_id = {}
        if fabric == "host":
            for s in range(W):
                if s == r:
                    continue
                for j, m0, rows, nt, n0, cols in _tiles(m_loc, band_rows, N, BN):
                    proxy_id[s, j, nt] = mv.add(RS_PROXY, s, m0, rows, n0, cols, [], deps, r,
                                                arrived_flag(s, j, nt), 0, rows * cols * ELEM_BYTES)
        red_id = {}
        for mt, m0, rows, nt, n0, cols in _tiles(m_loc, BM, N, BN):
            dl = [arrived_flag(s, mt // chunk, nt) for s in range(W) if s != r] + [built_flag(r, mt, nt)]
            red_id[mt, nt] = rd.add(RS_REDUCE, r, m0, rows, n0, cols, dl, deps, -1, -1,
                                    float(rows * cols * (W - 1)), rows * cols * ELEM_BYTES * (W + 1))
        dest_seq = ([r] if local_first else []) + ring + ([] if local_first else [r])
        # Each destination's tiles in groups of ~sqrt(builders) m-tiles rastered column by column
        # (band_groups): a wave reads a few A- and B-panels, not the whole of B per m-tile or two
        # (row-major: 0.55x cuBLAS at world 1 on N = 16384, K = 6656, H100). Pushes follow it.
        builders_n = num_wgs - (k_movers or 0)
        raster = [(mt, nt) for grp in band_groups(mt_n, builders_n, halve=False)
                  for nt in range(nt_n) for mt in range(grp.start, grp.stop)]
        b_demand = [build_id[d, mt, nt] for d in dest_seq for mt, nt in raster]
        # Movers in the order their last builder tile appears in the builder demand order.
        pos = {b: i for i, b in enumerate(b_demand)}
        pushes = sorted(push_id.items(), key=lambda kv: max(
            pos[build_id[kv[0][0], mt, kv[0][2]]] for mt in range(kv[0][1] * chunk, min(mt_n, (kv[0][1] + 1) * chunk))))
        push_order = [i for _, i in pushes]
        proxy_order = [proxy_id[s, j, nt] for s in ring for j in range(nb) for nt in range(nt_n) if (s, j, nt) in proxy_id]
        m_demand = []
        for i in range(max(len(push_order), len(proxy_order))):
            if i < len(push_order):
                m_demand.append(push_order[i])
            if i < len(proxy_order):
                m_demand.append(proxy_order[i])
        r_demand = [red_id[mt, nt] for mt in range(mt_n) for nt in range(nt_n)]
        builders = bt.done(_order(list(range(len(bt.rows))), b_demand, queue_order, rng))
        movers = mv.done(_order(list(range(len(mv.rows))), m_demand, queue_order, rng))
        reduces = rd.done(_order(list(range(len(rd.rows))), r_demand, queue_order, rng))
        peer_flags = ([lay.entry + s for s in range(W) if s != r] + [lay.exit + s for s in range(W) if s != r]
                      + [arrived_flag(s, j, nt) for s in range(W) if s != r for j in range(nb) for nt in range(nt_n)])
        if fabric == "host":  # proxies release the arrivals themselves
            peer_flags = peer_flags[:2 * (W - 1)]

    return RankSchedule(
        op=op, M=M, N=N, K=K, world=W, rank=r, BM=BM, BN=BN, chunk=chunk, num_wgs=num_wgs, policy=policy,
        num_movers=k_movers,
        max_inflight=max_inflight_movers(op, fabric, num_wgs, model, max_inflight) if k_movers is None else 0,
        queue_order=queue_order, local_first=bool(local_first), fabric=fabric, flags=lay,
        builders=builders, movers=movers, reduces=reduces, deps=np.asarray(deps, dtype=np.int32),
        peer_flags=np.asarray(peer_flags, dtype=np.int32), flag_mult=_mult_array(lay.num_flags, mult),
        meta={"m_loc": m_loc, "m_tiles": mt_n, "n_tiles": nt_n, "num_bands": nb, "remote_groups": remote_groups,
              "ramp": remote_ramp, **meta_extra},
    )


def _pulls(mv: "_Tab", mult: dict, deps: list, lay: FlagLayout, W: int, r: int, nb: int, band_rows: int,
           shard_rows: int, row_elems: int, mover_bytes: int) -> dict[tuple[int, int], list[int]]:
    """The AG_PULL items of rank r (ag-gemm: rows of A_p, ag-wgrad: rows of At_p; a row is
    ``row_elems`` elements): {(peer, band): [slice items]}; sets the band flags' multiplicities."""
    pull_id: dict[tuple[int, int], list[int]] = {}
    for p in range(W):
        if p == r:
            continue
        for j in range(nb):
            m0 = j * band_rows
            rows = min(band_rows, shard_rows - m0)
            nbytes = rows * row_elems * ELEM_BYTES
            S = max(1, min(cdiv(nbytes, max(16, mover_bytes)), cdiv(nbytes, 16)))
            S = cdiv(nbytes, cdiv(cdiv(nbytes, 16), S) * 16)
            per = cdiv(cdiv(nbytes, 16), S) * 16  # exactly as csrc/ag_gemm.cu computes it
            mult[lay.band + p * nb + j] = S
            pull_id[p, j] = [mv.add(AG_PULL, p, m0, rows, s, S, [lay.entry + p], deps, r, lay.band + p * nb + j,
                                    0, max(0, min(per, nbytes - s * per))) for s in range(S)]
    return pull_id


def _mult_array(n: int, mult: dict[int, int]) -> np.ndarray:
    a = np.ones(n, dtype=np.int32)
    for f, m in mult.items():
        a[f] = m
    return a


def build_all(op: str, M: int, N: int, K: int, world: int, num_wgs_total: int, **kw) -> list[RankSchedule]:
    """Schedules of all ranks for the local fabric (rank r gets its wg_starts share)."""
    sizes = np.diff(wg_starts(num_wgs_total, world))
    return [build_schedule(op, M, N, K, world, r, num_wgs=int(sizes[r]), **kw) for r in range(world)]


def wgrad_tiles(s: RankSchedule) -> bool:
    """An ag-wgrad schedule of tile-resident items (their waits are inside the tile)."""
    return s.op == "ag-wgrad" and s.meta.get("wgrad_items", "tile") == "tile"


# ---------------------------------------------------------------------------------------
# A step-level model of the WG loop, used by the tests to prove the orders deadlock-free
# (and usable by the simulator as a reference for the claim rules).


def simulate_steps(scheds: list[RankSchedule], durations=None, max_steps: int = 10_000_000,
                   static_peers: bool = False) -> int:
    """Run the kernels' WG loop in unit steps over all ranks' schedules; return the step count.

    An ag-wgrad tile is claimed ready and then holds its WG until every band it waits on inside
    the tile is there (its deps), which is what its per-k-block waits amount to for progress.
    Raises RuntimeError on a deadlock (no progress while work remains). ``durations``:
    optional callable (rank, queue, item) -> int steps (>= 1). ``static_peers``: flags in
    ``peer_flags`` of rank 0 start ready (host fabric, only rank 0 given).
    """
    dur = durations or (lambda rank, q, i: 1)
    W = len(scheds)
    flags = [np.zeros(s.flags.num_flags, dtype=np.int64) for s in scheds]
    if static_peers:
        flags[0][scheds[0].peer_flags] = 1
    # entry flags: every rank signals at start.
    if not static_peers:
        for s in scheds:
            for p in range(W):
                flags[p][s.flags.entry + s.rank] = 1
    ctr = [[0, 0, 0] for _ in scheds]
    inflight = [0 for _ in scheds]
    IDLE = _decide.IDLE
    wgs = []  # [rank, local_idx, state, busy_until, (q, item)]
    for s in scheds:
        for w in range(s.num_wgs):
            wgs.append({"rank": s.rank, "w": w, "cur": None, "until": 0, "done": False, "pend": None})

    def ready(s, q, i):
        t = s.queues[q]
        d = t.deps_of(i, s.deps)
        return bool(np.all(flags[s.rank][d] >= s.flag_mult[d]))

    def release(s, q, i):
        row = s.queues[q].table[i]
        if row[F["rel_flag"]] >= 0:
            tgt = row[F["rel_rank"]]
            if tgt < W and not (static_peers and tgt != 0):
                flags[tgt][row[F["rel_flag"]]] += 1

    def head(s, q):
        c = ctr[s.rank][q]
        t = s.queues[q]
        return (c, int(t.queue[c])) if c < len(t) else (c, None)

    def claim(s, q):
        c, i = head(s, q)
        if i is not None:
            ctr[s.rank][q] += 1
        return i

    def decide(wg, s):
        k = s.num_movers
        if k is not None:
            if wg["w"] < k:
                i = claim(s, Q_MOVE)
                return (Q_MOVE, i) if i is not None else None
            for q in (Q_BUILD, Q_REDUCE):
                i = claim(s, q)
                if i is not None:
                    return q, i
            return None
        return _decide.decide(s.op, _View(wg, s))

    class _View:
        """decide()'s view of one WG (kosmos/decide.py)."""

        def __init__(self, wg, s):
            self.wg, self.s, self.cap = wg, s, s.max_inflight

        def head(self, q):
            return head(self.s, q)[1]

        def claim(self, q):
            return claim(self.s, q)

        def ready(self, q, i):  # claim readiness: ag-wgrad tiles wait for their bands inside (below)
            return (q == Q_BUILD and wgrad_tiles(self.s)) or ready(self.s, q, i)

        def under_cap(self):
            return under_cap(self.s)

        @property
        def pending(self):
            return self.wg["pend"]

        @pending.setter
        def pending(self, v):
            self.wg["pend"] = v

    def under_cap(s):
        return s.max_inflight == 0 or inflight[s.rank] < s.max_inflight

    step, idle_steps = 0, 0
    while True:
        progress = False
        alive = False
        for wg in wgs:
            if wg["done"]:
                continue
            alive = True
            s = scheds[wg["rank"]]
            if wg["cur"] is not None:
                q, i = wg["cur"]
                if wg["until"] == 0:  # waiting on deps
                    if ready(s, q, i):
                        wg["until"] = step + dur(s.rank, q, i)
                        progress = True
                elif step >= wg["until"]:
                    release(s, q, i)
                    if q == Q_MOVE and s.num_movers is None:
                        inflight[s.rank] -= 1
                    wg["cur"] = None
                    progress = True
                else:
                    progress = True  # busy
            if wg["cur"] is None:
                d = decide(wg, s)
                if d is None:
                    wg["done"] = True
                    progress = True
                    continue
                if d == IDLE:
                    continue
                if d[0] == Q_MOVE and s.num_movers is None:
                    inflight[s.rank] += 1
                wg["cur"] = d
                wg["until"] = 0
                if ready(s, *d):
                    wg["until"] = step + dur(s.rank, *d)
                progress = True
        if not alive:
            return step
        step += 1
        idle_steps = 0 if progress else idle_steps + 1
        if idle_steps > 10_000 or step > max_steps:
            stuck = [(w["rank"], w["w"], w["cur"]) for w in wgs if not w["done"]][:8]
            raise RuntimeError(f"schedule deadlock after {step} steps; stuck WGs (rank, wg, (queue, item)): {stuck}")
