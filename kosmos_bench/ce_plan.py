"""Copy-engine movers (host fabric, ag-gemm, ``mover='ce'``): the copies and flag releases
that one call enqueues (``kosmos_ce_plan_begin``/``_end``, csrc/runtime.cu), derived from a rank's
schedule. Pure: rows and columns, no pointers (the runner turns them into addresses).

* Copies go in mover (consumer-demand) order. Consecutive bands of one peer that the
  builders need together (one of the schedule's remote band groups, ``meta["remote_groups"]``)
  travel as one copy: a copy costs the engine ~5 us of setup (2 MB copies ran at 0.85-0.9x
  of one big copy), so few large copies.
* The last remote group (or the last ``tail_groups``) is cut into ``slices`` K-slices, copied slice-major (slice 0 of
  every band of the group, then slice 1, ...; 2-D copies). Each band flag then counts the
  slices there (``mult`` = slices, value ``mult*epoch - back``); with ``Params.k_stream``
  the sm90 builders start the group's tiles on slice 0 and load each k-block once its slice
  is there. Without it, the work left when the last byte lands is whole tiles (~90-180 us
  each on H200 at K = 8192-16384); with it, about a slice's worth of each tile.
* Slice s holds k-blocks ``[s*nkb//slices, (s+1)*nkb//slices)`` of ``bk`` columns
  (``nkb = ceil(K/bk)``) — the kernel's ``SliceWait`` (csrc/ag_gemm_sm90.cu) reads them the
  same way.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def build(sch, K: int, slices: int = 1, bk: int = 64, slice_bytes: int = 0,
          tail_groups: int = 1) -> tuple[list[CeEntry], dict[int, int]]:
    """The plan of one rank and the band flags' multiplicities it implies ({flag: mult};
    they replace the schedule's SM-mover counts in the kernel's flag_mult). ``slices``: K-slices
    of each of the last ``tail_groups`` remote groups; ``slice_bytes`` > 0 also cuts every
    other group into slices of about that many bytes (streams whole groups; each extra copy
    costs the engine setup)."""
    if slices < 1 or slice_bytes < 0 or tail_groups < 1:
        raise ValueError(f"slices={slices}, slice_bytes={slice_bytes}, tail_groups={tail_groups}: expected "
                         "slices >= 1, slice_bytes >= 0, tail_groups >= 1")
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
    # runs: contiguous bands of one peer inside one group, each run one copy (per slice)
    runs: list[list] = []
    for b in bands:
        prev = runs[-1][-1] if runs else None
        if prev and b[0] == prev[0] and b[1] == prev[1] + prev[2] and \
                group_of.get((b[0], b[1] // BM)) == group_of.get((prev[0], prev[1] // BM)):
            runs[-1].append(b)
        else:
            runs.append([b])
    nkb = S.cdiv(K, bk)
    last = max(group_of.values(), default=-1)
    plan: list[CeEntry] = []
    mult: dict[int, int] = {}
    i = 0
    while i < len(runs):  # one group (its runs are consecutive: mover order = demand order)
        g = group_of.get((runs[i][0][0], runs[i][0][1] // BM))
        j = i
        while j < len(runs) and group_of.get((runs[j][0][0], runs[j][0][1] // BM)) == g:
            j += 1
        grp = runs[i:j]
        nbytes = sum(b[2] for run in grp for b in run) * K * 2
        ks = slices if g is not None and g > last - tail_groups else \
            (max(1, round(nbytes / slice_bytes)) if slice_bytes else 1)
        ks = max(1, min(ks, nkb))
        for s, (c0, c1) in enumerate(slice_cols(K, ks, bk)):  # slice-major over the group's runs
            for run in grp:
                for n, b in enumerate(run):
                    rows = sum(x[2] for x in run) if n == 0 else 0
                    plan.append(CeEntry(run[0][0], run[0][1], rows, c0, c1 - c0, b[3], ks, ks - 1 - s))
                    mult[b[3]] = ks
        i = j
    return plan, mult
