"""Copy-engine movers (host fabric, ``mover='ce'``; ag-gemm, and gemm-rs in ``build_rs`` at the
end): the copies and flag releases
that one call enqueues (``kosmos_ce_plan_begin``/``_end``, csrc/runtime.cu), derived from a rank's
schedule. Pure: rows and columns, no pointers (the runner turns them into addresses).

* Copies go in mover (consumer-demand) order. Consecutive bands of one peer that the
  builders need together (one of the schedule's remote band groups, ``meta["remote_groups"]``)
  travel as one copy: a copy costs the engine ~5 us of setup (2 MB copies ran at 0.85-0.9x
  of one big copy), so few large copies.
* The last remote group is cut into ``slices`` K-slices, copied slice-major (slice 0 of
  every band of the group, then slice 1, ...; 2-D copies). Each band flag then counts the
  slices there (``mult`` = slices, value ``mult*epoch - back``); with ``Params.k_stream``
  the sm90 builders start the group's tiles on slice 0 and load each k-block once its slice
  is there. Without it, the work left when the last byte lands is whole tiles (~90-180 us
  each on H200 at K = 8192-16384); with it, about a slice's worth of each tile.
* Slice s holds k-blocks ``[s*nkb//slices, (s+1)*nkb//slices)`` of ``bk`` columns
  (``nkb = ceil(K/bk)``) — the kernel's ``SliceWait`` (csrc/ag_gemm_sm90.cu) reads them the
  same way.
* ``split`` (e.g. ``(3, 1)``) copies consecutive slices together: 4 slices in two copies, the
  first of 3/4 of K (one release: "3 slices there"), the last of 1/4. The work left when the
  last byte lands is then a quarter of each tile's K, with one copy more per band than whole
  bands (uniform slices 4 would need four, of narrower rows: 2-D copies of narrow rows run
  slower). The kernel is unchanged: it sees ``sum(split)`` uniform slices.
* ``share_flags``: one release per copy. Every release is a fenced stream write, and on the H200
  they land ~11 us apart while copies are in flight, so an 8-band copy released its last band
  ~80 us after its first (tile starts in probes/split_trace_items-10-tail.parquet). The bands of
  a copy then share its first band's flag (the runner points their builders' deps at it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import schedule as S


@dataclass(frozen=True)
class CeEntry:
    """One copy (rows > 0: A_peer[row0:row0+rows, col0:col0+cols] into the gathered buffer
    at row peer*m_loc + row0) and/or one flag release (flag := mult*epoch - back)."""

    peer: int
    row0: int
    rows: int  # 0: release only, after the latest copy
    col0: int
    cols: int
    flag: int
    mult: int
    back: int

    def value(self, epoch: int) -> int:
        return (self.mult * epoch - self.back) & 0xFFFFFFFF


def slice_cols(K: int, slices: int, bk: int) -> list[tuple[int, int]]:
    """Column ranges [c0, c1) of the K-slices (k-block aligned; the last one ends at K)."""
    nkb = S.cdiv(K, bk)
    lo = [s * nkb // slices * bk for s in range(slices)] + [K]
    return [(lo[s], min(K, lo[s + 1])) for s in range(slices)]


def parse_split(spec) -> tuple[int, ...]:
    """K-slicing of the last groups as slices per copy: an int S (S copies of one slice each),
    a string "3,1" or a tuple; every part >= 1."""
    if isinstance(spec, int):
        parts = (1,) * spec if spec >= 1 else ()
    elif isinstance(spec, str):
        try:
            parts = tuple(int(x) for x in spec.replace(" ", "").split(",") if x)
        except ValueError:
            parts = ()
    else:
        parts = tuple(int(x) for x in spec)
    if not parts or min(parts) < 1:
        raise ValueError(f"K-slice split {spec!r}: expected a slice count >= 1 or parts >= 1 like '3,1'")
    return parts


def halving(run: list) -> list[list]:
    """A run of bands cut into copies of ..., 4, 2, 1 bands (the first takes the remainder):
    the tiles a copy releases then finish about when the copies after it land, so the work
    left after the last byte stays one band's."""
    sizes, n, k = [], len(run), 1
    while n > 0:
        sizes.append(min(k, n))
        n -= sizes[-1]
        k *= 2
    if len(sizes) > 1 and sizes[-1] < sizes[-2]:  # fold a short remainder into the biggest copy
        rest = sizes.pop()
        sizes[-1] += rest
    out, b = [], 0
    for m in reversed(sizes):
        out.append(run[b:b + m])
        b += m
    return out


def build(sch, K: int, slices: int = 1, bk: int = 64, split: tuple[int, ...] | None = None,
          merge: bool = False) -> tuple[list[CeEntry], dict[int, int]]:
    """The plan of one rank and the band flags' multiplicities it implies ({flag: mult};
    they replace the schedule's mover counts in the kernel's flag_mult). ``slices``: K-slices
    of the last remote group; ``split``: slices per copy there (sums to ``slices``; default one
    each). ``merge``: before the sliced group, a copy takes every contiguous band of one peer
    regardless of groups (one copy per peer instead of one per group and peer; a group's
    earlier bands are released with the peer's later ones), except that the last such run is
    cut in ``halving`` copies (..., 4, 2, 1 bands)."""
    if slices < 1:
        raise ValueError(f"slices={slices}: expected >= 1")
    explicit = split is not None
    split = parse_split(split) if explicit else (1,) * slices
    if sum(split) != slices:
        raise ValueError(f"split {split} does not add up to {slices} slices")
    if explicit and max(split) > 1 and slices > S.cdiv(K, bk):  # (plain slice counts are clamped to K's k-blocks)
        raise ValueError(f"split {split}: {slices} slices need K >= {slices * bk} (K = {K})")
    groups = sch.meta["remote_groups"]
    group_of = {key: g for g, grp in enumerate(groups) for key in grp}
    BM, tab = sch.BM, sch.movers.table
    bands, seen = [], set()  # (peer, m0, rows, flag) in mover order
    for i in sch.movers.queue:
        row = tab[i]
        key = (int(row[S.F["peer"]]), int(row[S.F["m0"]]))
        if key not in seen:
            seen.add(key)
            bands.append((key[0], key[1], int(row[S.F["rows"]]), int(row[S.F["rel_flag"]])))
    last = max(group_of.values(), default=-1)
    merged = -2  # the segment id of every merged (unsliced) group

    def seg(run_or_band) -> int | None:
        """Copies never span two segments: a group, or all merged groups."""
        b = run_or_band[0] if isinstance(run_or_band, list) else run_or_band
        g = group_of.get((b[0], b[1] // BM))
        return merged if merge and g is not None and g < last else g

    # runs: contiguous bands of one peer inside one segment, each run one copy (per slice)
    runs: list[list] = []
    for b in bands:
        prev = runs[-1][-1] if runs else None
        if prev and b[0] == prev[0] and b[1] == prev[1] + prev[2] and seg(b) == seg(prev):
            runs[-1].append(b)
        else:
            runs.append([b])
    merged_runs = [i for i, run in enumerate(runs) if seg(run) == merged]
    if merged_runs:  # the last merged copy halves toward the tail: ..., 4, 2, 1 bands
        i = merged_runs[-1]
        runs[i:i + 1] = halving(runs[i])
    nkb = S.cdiv(K, bk)
    plan: list[CeEntry] = []
    mult: dict[int, int] = {}
    i = 0
    while i < len(runs):  # one segment (its runs are consecutive: mover order = demand order)
        g = seg(runs[i])
        j = i
        while j < len(runs) and seg(runs[j]) == g:
            j += 1
        grp = runs[i:j]
        tail = g is not None and g != merged and g == last
        ks = max(1, min(slices if tail else 1, nkb))
        parts = split if tail and ks == slices else (1,) * ks
        cols = slice_cols(K, ks, bk)
        s1 = 0
        for n_sl in parts:  # slice-major over the group's runs; a copy takes n_sl slices
            s0, s1 = s1, s1 + n_sl
            c0, c1 = cols[s0][0], cols[s1 - 1][1]
            for run in grp:
                for n, b in enumerate(run):
                    rows = sum(x[2] for x in run) if n == 0 else 0
                    plan.append(CeEntry(run[0][0], run[0][1], rows, c0, c1 - c0, b[3], ks, ks - s1))
                    mult[b[3]] = ks
        i = j
    return plan, mult


def share_flags(plan: list[CeEntry]) -> tuple[list[CeEntry], dict[int, int]]:
    """One release per copy: a release-only entry's flag is folded into the flag of the copy it
    follows ({band flag: copy flag}; the runner points the builders' deps at the latter) and the
    entry dropped. A flag is folded only where that is exact: it is never a copy's own flag,
    every release of it follows a copy of the same flag with the same count (mult, back), and
    that flag's copies release exactly those counts in the same order (so the shared flag reads
    "k slices there" exactly when the band's own flag would have)."""
    own: dict[int, list] = {}  # copy flag -> [(mult, back)] of its copies, in plan order
    rel: dict[int, list] = {}  # release-only flag -> [(copy flag, mult, back, same count as the copy)]
    cur = None
    for e in plan:
        if e.rows:
            cur = e
            own.setdefault(e.flag, []).append((e.mult, e.back))
        elif cur is not None:
            rel.setdefault(e.flag, []).append((cur.flag, e.mult, e.back, (e.mult, e.back) == (cur.mult, cur.back)))
    alias = {}
    for f, rs in rel.items():
        to = rs[0][0]
        if f not in own and all(r[0] == to and r[3] for r in rs) and [r[1:3] for r in rs] == own[to]:
            alias[f] = to
    return [e for e in plan if e.rows or e.flag not in alias], alias


# ---- GEMM+RS (host fabric): pushes device -> host and the peers' contributions host -> device ----

# Push copies: each copy costs the engine ~2.5 us of setup and needs every tile of its bands built
# before it starts, so they ramp up from one band (the link starts after ~one band's tiles), double
# up to this many bytes, and halve again toward the end (the work left after the last byte stays
# about one band's when the builders are the slower side).
RS_PUSH_MAX_BYTES = 16 << 20
F_PEER, F_M0 = S.F["peer"], S.F["m0"]


@dataclass(frozen=True)
class RsPush:
    """One device -> host copy: ``rows`` rows from row ``row0`` of destination band ``dest``
    (staging rows ``dest*m_loc + row0 ...``, all N columns; it may run on into the next
    destinations' bands) into the host buffer at the same place, after the builder counter
    ``wait`` reaches ``tiles * epoch`` (every tile of the copy built)."""

    dest: int
    row0: int
    rows: int
    wait: int
    tiles: int


@dataclass
class RsPlan:
    """The copy engine's part of a GEMM+RS call on the host fabric (rank r's view).

    * ``pushes``: device -> host, in the builders' demand order (destination r+1, r+2, ...,
      band-major), each after its builder counter; no release (peers do not execute).
    * ``proxies``: host -> device, peers' contributions to band r (RS_PROXY's traffic) as
      ``CeEntry`` copies (peer, rows, all N columns), one per peer in ring order, each
      releasing the arrival flag of its first band (every reduce reads whole bands).
    * ``built_alias``: {builder flag: counter flag} for the tiles of other destinations (the
      builders of one push add to its first tile's flag); ``flag_mult``: {counter: tiles}.
    * ``arrival_alias``: {arrival flag: the flag its proxy copy releases} (reduce deps).
    """

    pushes: list
    proxies: list
    built_alias: dict
    flag_mult: dict
    arrival_alias: dict


def ramp_sizes(n: int, cap: int) -> list[int]:
    """n bands cut into copies of 1, 2, 4, ... bands up to ``cap``, then ``cap``-band copies,
    then ..., 4, 2, 1 at the end (the middle takes the remainder, never more than ``cap``)."""
    front, back, k, left = [], [], 1, n
    while left > 0 and k < cap:
        for side in (front, back):
            if left > 0:
                side.append(min(k, left))
                left -= side[-1]
        k *= 2
    middle = [] if left == 0 else [len(x) for x in np.array_split(np.arange(left), -(-left // cap))]
    return front + middle + back[::-1]


def build_rs(sch, max_bytes: int = RS_PUSH_MAX_BYTES) -> RsPlan:
    """The copy plan of one rank of a gemm-rs schedule built with ``fabric='host'``. Pushes run
    over the bands of the other destinations in the builders' demand order; consecutive bands
    that are contiguous in the staging buffer and in the host buffer (the next band of the same
    destination, or band 0 of the next destination after a destination's last band) share a copy
    (``ramp_sizes``, ``max_bytes``)."""
    if sch.op != "gemm-rs":
        raise ValueError(f"build_rs: a gemm-rs schedule, not {sch.op}")
    lay, W, r = sch.flags, sch.world, sch.rank
    mt_n, nt_n, nb = sch.meta["m_tiles"], sch.meta["n_tiles"], sch.meta["num_bands"]
    m_loc, BM, chunk, N = sch.meta["m_loc"], sch.BM, sch.chunk, sch.N

    def built(d, mt, nt):
        return lay.built + (d * mt_n + mt) * nt_n + nt

    def arrived(s, j, nt):
        return lay.arrived + (s * nb + j) * nt_n + nt

    def host_slot(d):  # the host fabric's send buffer: slot d - 1 for rank 0 (impls/kosmos.py)
        return d - 1 if d > r else d

    # bands of other destinations in the order the builders reach their last tile
    tab = sch.builders.table
    seen, order = set(), []
    for i in sch.builders.queue:
        d, m0 = int(tab[i, F_PEER]), int(tab[i, F_M0])
        key = (d, m0 // BM // chunk)
        if d != r and key not in seen:
            seen.add(key)
            order.append(key)

    def follows(a, b):  # band b right after band a in staging rows and in the host buffer
        return (b[0] == a[0] and b[1] == a[1] + 1) or (
            b[0] == a[0] + 1 and a[1] == nb - 1 and b[1] == 0 and host_slot(b[0]) == host_slot(a[0]) + 1)

    runs: list = []
    for band in order:
        if runs and follows(runs[-1][-1], band):
            runs[-1].append(band)
        else:
            runs.append([band])
    cap = max(1, max_bytes // (chunk * BM * N * S.ELEM_BYTES))
    pushes, alias, mult = [], {}, {}
    for run in runs:
        b = 0
        for size in ramp_sizes(len(run), cap):
            part, b = run[b:b + size], b + size
            tiles = [(d, mt) for d, j in part for mt in range(j * chunk, min(mt_n, (j + 1) * chunk))]
            counter = built(*tiles[0], 0)
            for d, mt in tiles:
                for nt in range(nt_n):
                    alias[built(d, mt, nt)] = counter
            mult[counter] = len(tiles) * nt_n
            d0, mt0 = tiles[0]
            d1, mt1 = tiles[-1]
            rows = (d1 - d0) * m_loc + min(m_loc, (mt1 + 1) * BM) - mt0 * BM
            pushes.append(RsPush(d0, mt0 * BM, rows, counter, len(tiles) * nt_n))
    proxies, arr = [], {}
    for s in [(r + i) % W for i in range(1, W)]:
        f = arrived(s, 0, 0)
        proxies.append(CeEntry(s, 0, m_loc, 0, N, f, 1, 0))
        for j in range(nb):
            for nt in range(nt_n):
                arr[arrived(s, j, nt)] = f
    return RsPlan(pushes, proxies, alias, mult, arr)

