"""Discrete-event model of persistent, self-scheduling kernels: R ranks x G WGs.

The engine knows nothing about GEMMs or collectives. A `Problem` is a set of items laid out
in per-rank queues (int arrays in priority order, exactly as the kernels get them), with

* a kind: BUILD / REDUCE (compute: a fixed duration) or MOVE (a transfer of `nbytes` over a
  path of shared links, after a fixed setup latency);
* dependencies (item ids, any rank), each with a latency: an item is *ready* at the latest
  of (dependency completion + that edge's flag latency) and its `floor_ns` (e.g. the entry
  handshake);
* the WGs' loop rules: for each WG an ordered list of (queue, mode). A free WG walks its
  rules and acts on the first that applies (queue non-empty, and):
    ANY          claim the head; if it is not ready the WG WAITs on it (claims are in queue
                 order, an atomic counter, so a claimed item binds the WG)
    READY        claim the head only if it is ready
    ANY_CAPPED   as ANY, but while the rank's in-flight count of capped claims is at its
                 cap (`inflight_cap`), the WG spins instead (a WAIT with item -1) and
                 re-decides when something changes on its rank
    READY_CAPPED as READY, and only under the cap
  When no rule applies the WG exits. (A mode may also be a bool: True = READY, False = ANY.)
  A rule set may instead be one of the named loops SELF_AG / SELF_RS: the kernels' policy
  'self' with its per-WG *pending* slot (``kosmos.decide.decide``, the rule
  schedule.simulate_steps runs too; queues 0/1/2 = builder/mover/reduce).

Links are a fluid model: every active transfer has a rate, set by max-min fairness over the
links on its path (each of capacity bytes/ns) and a per-transfer cap (what one WG can drive);
rates are recomputed whenever a transfer starts or ends. Optionally a link loses capacity
beyond n0 concurrent transfers (`collapse`).

Output (`SimResult`): per-item claim/start/end times and WG, WAIT intervals, the makespan,
and `timeline()`: the role records (rank, wg, sm, role, item, t0_ns, t1_ns) with the same
schema as the GPU traces (a WAIT record carries the id of the item waited on).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..kosmos import decide as _decide

BUILD, MOVE, REDUCE = 0, 1, 2
ANY, READY, ANY_CAPPED, READY_CAPPED = 0, 1, 2, 3
SELF_AG, SELF_RS = "self:ag-gemm", "self:gemm-rs"  # named loops (policy self of the kernels)
_QB, _QM, _QR = 0, 1, 2
ROLE_NAMES = {BUILD: "BUILD", MOVE: "MOVE", REDUCE: "REDUCE"}

# event types; at equal times completions come first, then readiness, then free WGs pick
_EV_DONE, _EV_FLOW, _EV_JOIN, _EV_READY, _EV_FREE = 0, 1, 2, 3, 4


@dataclass
class Queue:
    """One per-rank queue of item ids in claim order."""

    name: str
    items: np.ndarray  # int64 item ids


@dataclass
class Problem:
    """Items (arrays of length n) + queues + WG rules + links. See the module docstring.

    kind:       int8 (n,)     BUILD | MOVE | REDUCE (the trace role)
    rank:       int32 (n,)    rank that executes the item
    work_ns:    float (n,)    compute time (BUILD/REDUCE) or setup latency (MOVE)
    nbytes:     float (n,)    bytes transferred (MOVE; 0 = no transfer)
    path:       list of n tuples of link ids (MOVE)
    dep_ptr, dep_idx: CSR dependencies: deps of i are dep_idx[dep_ptr[i]:dep_ptr[i+1]]
    dep_lat_ns: float (len(dep_idx),) flag latency of each dependency edge
    floor_ns:   float (n,)    earliest readiness (entry handshake), 0 by default
    end_floor_ns: float (n,)  earliest end of a compute item, 0 by default (a tile streaming
                              K-slices: the last slice's arrival + the work after it)
    end_dep_ptr, end_dep_idx: CSR *stream* dependencies of a compute item: items it needs while it
                              runs, not to start (a tile that waits for its operands' bands
                              inside, in a fixed order: ag-wgrad); it is claimed and started
                              as its other deps allow and ends at the latest of its own end and,
                              per stream dependency, (its completion + end_dep_lat_ns + the
                              work after it, end_dep_tail_ns), holding its WG until then
    label:      int64 (n,)    item id written to the trace (the kernel's item number)
    queues:     per rank, the list of queues (the rules index into it)
    rule_sets:  list of rules; a rule list is [(queue index, mode), ...] (modes above)
    wg_rules:   per rank, int array (G,): which rule set each WG follows
    link_bw:    float (L,)    link capacity, bytes/ns (= GB/s)
    flow_cap:   bytes/ns one transfer (one WG) can drive at most
    collapse:   (n0, gamma) or None: a link carrying n > n0 transfers delivers only
                (n0 / n) ** gamma of its capacity (contention collapse, e.g. many SMs
                reading host memory over PCIe); n0 may be a per-link array (inf: never)
    claim_ns:   cost of one claim (atomic), counted in the claimed item's interval; WGs on
                sm -1 (an agent that is not an SM: the copy engine) claim for free
    sm:         per rank, int array (G,): SM of each WG (default: the WG index)
    inflight_cap: per rank, cap on claimed-not-completed items of capped rules (0 = none)
    """

    kind: np.ndarray
    rank: np.ndarray
    work_ns: np.ndarray
    nbytes: np.ndarray
    path: list
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    dep_lat_ns: np.ndarray
    label: np.ndarray
    queues: list
    rule_sets: list
    wg_rules: list
    link_bw: np.ndarray
    floor_ns: np.ndarray | None = None
    flow_cap: float = float("inf")
    collapse: tuple | None = None
    claim_ns: float = 0.0
    sm: list | None = None
    inflight_cap: list | None = None
    end_floor_ns: np.ndarray | None = None
    end_dep_ptr: np.ndarray | None = None
    end_dep_idx: np.ndarray | None = None
    end_dep_lat_ns: np.ndarray | None = None
    end_dep_tail_ns: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.kind)

    @property
    def num_ranks(self) -> int:
        return len(self.queues)

    def check(self) -> None:
        """Every item in exactly one queue of its own rank; deps and rules valid."""
        n = self.n
        seen = np.zeros(n, dtype=np.int64)
        for r, qs in enumerate(self.queues):
            for q in qs:
                it = np.asarray(q.items, dtype=np.int64)
                if it.size and (it.min() < 0 or it.max() >= n):
                    raise ValueError(f"rank {r}: queue {q.name} item out of range")
                np.add.at(seen, it, 1)
                if it.size and np.any(self.rank[it] != r):
                    raise ValueError(f"rank {r}: queue {q.name} holds another rank's item")
        if np.any(seen != 1):
            bad = np.flatnonzero(seen != 1)[:5]
            raise ValueError(f"items not in exactly one queue: {bad.tolist()} ...")
        if len(self.dep_ptr) != n + 1 or len(self.dep_lat_ns) != len(self.dep_idx):
            raise ValueError("dep_ptr must have n+1 entries and dep_lat_ns one per dependency")
        if self.dep_idx.size and (self.dep_idx.min() < 0 or self.dep_idx.max() >= n):
            raise ValueError("dependency out of range")
        if self.end_dep_ptr is not None:
            m = len(self.end_dep_idx)
            if len(self.end_dep_ptr) != n + 1 or len(self.end_dep_lat_ns) != m or len(self.end_dep_tail_ns) != m:
                raise ValueError("end_dep_ptr must have n+1 entries, end_dep_lat_ns / end_dep_tail_ns one per edge")
            if m and (np.min(self.end_dep_idx) < 0 or np.max(self.end_dep_idx) >= n):
                raise ValueError("stream dependency out of range")
            if m and np.any(self.kind[np.repeat(np.arange(n), np.diff(self.end_dep_ptr))] == MOVE):
                raise ValueError("stream dependencies are for compute items")
        for r, wr in enumerate(self.wg_rules):
            for k in np.unique(np.asarray(wr)):
                rs = self.rule_sets[k]
                if isinstance(rs, str):
                    if rs not in (SELF_AG, SELF_RS) or len(self.queues[r]) != 3:
                        raise ValueError(f"rank {r}: named loop {rs!r} needs builder/mover/reduce queues")
                    continue
                for qi, _ in rs:
                    if not 0 <= qi < len(self.queues[r]):
                        raise ValueError(f"rank {r}: rule set {k} names queue {qi}")


@dataclass
class SimResult:
    problem: Problem
    wg_of: np.ndarray       # (n,) WG that ran each item
    t_claim: np.ndarray     # (n,) claim time
    t_start: np.ndarray     # (n,) start of the item's role interval (claim, or readiness)
    t_end: np.ndarray       # (n,) completion
    t_ready: np.ndarray     # (n,) readiness
    wg_exit: list           # per rank, (G,) exit time of each WG
    makespan_ns: float
    spins: list = field(default_factory=list)  # (rank, wg, t0, t1): spinning at the mover cap
    events: int = 0
    max_movers: int = 0     # most MOVE items in flight at once on one rank
    stats: dict = field(default_factory=dict)

    @property
    def waited(self) -> np.ndarray:
        """Bool (n,): the WG claimed the item before it was ready and waited on it."""
        return self.t_start > self.t_claim

    def timeline(self) -> pd.DataFrame:
        """Role records: rank, wg, sm, role, item, t0_ns, t1_ns (same schema as GPU traces)."""
        p = self.problem
        sm_of = p.sm or [np.arange(len(m)) for m in p.wg_rules]
        rk = p.rank.astype(np.int64)
        wg = self.wg_of.astype(np.int64)
        sm = np.zeros(p.n, dtype=np.int64)
        for r in range(p.num_ranks):
            sel = rk == r
            sm[sel] = np.asarray(sm_of[r])[wg[sel]]
        roles = np.array([ROLE_NAMES[BUILD], ROLE_NAMES[MOVE], ROLE_NAMES[REDUCE]], dtype=object)[p.kind]
        lab = p.label.astype(np.int64)
        df = pd.DataFrame({"rank": rk, "wg": wg, "sm": sm, "role": roles, "item": lab,
                           "t0_ns": self.t_start, "t1_ns": self.t_end})
        w = self.waited
        if w.any():
            dw = pd.DataFrame({"rank": rk[w], "wg": wg[w], "sm": sm[w], "role": "WAIT", "item": lab[w],
                               "t0_ns": self.t_claim[w], "t1_ns": self.t_start[w]})
            df = pd.concat([df, dw], ignore_index=True)
        if self.spins:
            a = np.asarray(self.spins, dtype=float)
            sr, sg = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64)
            ssm = np.array([np.asarray(sm_of[r])[g] for r, g in zip(sr, sg)], dtype=np.int64)
            ds = pd.DataFrame({"rank": sr, "wg": sg, "sm": ssm, "role": "WAIT", "item": -1,
                               "t0_ns": a[:, 2], "t1_ns": a[:, 3]})
            df = pd.concat([df, ds], ignore_index=True)
        df["t0_ns"] = np.round(df["t0_ns"].to_numpy(float)).astype(np.int64)
        df["t1_ns"] = np.round(df["t1_ns"].to_numpy(float)).astype(np.int64)
        return df.sort_values(["rank", "wg", "t0_ns", "t1_ns"], kind="stable").reset_index(drop=True)

    def wg_accounting(self) -> pd.DataFrame:
        """Per WG: busy (role intervals), wait, tail (exit -> makespan); total == makespan."""
        p = self.problem
        key = p.rank.astype(np.int64) * 1_000_000 + self.wg_of
        busy = pd.Series(self.t_end - self.t_start).groupby(key).sum()
        wkey, wdur = key, self.t_start - self.t_claim
        if self.spins:
            a = np.asarray(self.spins, dtype=float)
            wkey = np.concatenate([key, a[:, 0].astype(np.int64) * 1_000_000 + a[:, 1].astype(np.int64)])
            wdur = np.concatenate([wdur, a[:, 3] - a[:, 2]])
        wait = pd.Series(wdur).groupby(wkey).sum()
        rows = []
        for r, rules in enumerate(p.wg_rules):
            for g in range(len(rules)):
                k = r * 1_000_000 + g
                b, w = float(busy.get(k, 0.0)), float(wait.get(k, 0.0))
                tail = self.makespan_ns - float(self.wg_exit[r][g])
                rows.append(dict(rank=r, wg=g, busy_ns=b, wait_ns=w, tail_ns=tail, total_ns=b + w + tail))
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        """Fractions of WG-time (all simulated WGs, 0..makespan) per role."""
        p = self.problem
        total = self.makespan_ns * sum(len(m) for m in p.wg_rules)
        if total <= 0:
            return {}
        d = self.t_end - self.t_start
        out = {f"sim_{ROLE_NAMES[k].lower()}_frac": float(d[p.kind == k].sum() / total) for k in (BUILD, MOVE, REDUCE)}
        spin = sum(t1 - t0 for _, _, t0, t1 in self.spins)
        out["sim_wait_frac"] = float(((self.t_start - self.t_claim).sum() + spin) / total)
        out["sim_idle_frac"] = 1.0 - sum(out[f"sim_{ROLE_NAMES[k].lower()}_frac"] for k in (BUILD, MOVE, REDUCE))
        movers = np.unique(self.wg_of[p.kind == MOVE] + 1_000_000 * p.rank[p.kind == MOVE].astype(np.int64))
        out["sim_mover_wgs"] = int(len(movers))
        out["sim_max_movers"] = int(self.max_movers)
        return out


class _Links:
    """Fluid transfers with max-min fair rates over shared links and a per-transfer cap
    (progressive filling). Paths are kept as a padded (F, m) int array; the pad is a
    virtual link of infinite capacity, so a recomputation is a few numpy passes."""

    def __init__(self, bw: np.ndarray, cap: float, width: int = 2, collapse: tuple | None = None):
        self.bw = np.append(np.asarray(bw, dtype=float), np.inf)  # last: the pad
        self.collapse = collapse
        self.pad = len(self.bw) - 1
        self.cap = float(cap)
        self.width = max(1, int(width))
        self.items: list[int] = []
        self.pl = np.zeros((0, self.width), dtype=np.int64)
        self.remaining = np.zeros(0)
        self.rate = np.zeros(0)
        self.t = 0.0

    def advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0 and self.items:
            self.remaining = self.remaining - self.rate * dt
        self.t = t

    def add(self, item: int, path: tuple, nbytes: float) -> None:
        row = np.full((1, self.width), self.pad, dtype=np.int64)
        row[0, :len(path)] = path
        self.items.append(item)
        self.pl = np.concatenate([self.pl, row])
        self.remaining = np.append(self.remaining, float(nbytes))

    def pop_done(self, tol_ns: float = 1e-6) -> list[int]:
        """Transfers that are done (within `tol_ns` of their end at the current rates)."""
        if not self.items:
            return []
        done = self.remaining <= np.maximum(self.rate * tol_ns, 1e-6)
        if not done.any():
            return []
        out = [self.items[k] for k in np.flatnonzero(done)]
        keep = np.flatnonzero(~done)
        self.items = [self.items[k] for k in keep]
        self.pl = self.pl[keep]
        self.remaining = self.remaining[keep]
        self.rate = self.rate[keep]
        return out

    def recompute(self) -> float:
        """New rates; returns the time of the next completion (inf if none)."""
        if not self.items:
            self.rate = np.zeros(0)
            return float("inf")
        rate = self._waterfill()
        self.rate = rate
        with np.errstate(divide="ignore"):
            ttf = np.where(rate > 0, self.remaining / rate, np.inf)
        return self.t + float(ttf.min())

    def _waterfill(self) -> np.ndarray:
        f, nl = len(self.items), len(self.bw)
        P = self.pl
        rate = np.zeros(f)
        active = np.ones(f, dtype=bool)
        left = self.bw.copy()
        if self.collapse is not None:
            n0, gamma = self.collapse
            n0 = np.append(np.broadcast_to(np.asarray(n0, dtype=float), (nl - 1,)), np.inf)
            n = np.bincount(P.ravel(), minlength=nl).astype(float)
            over = n > n0
            left[over] *= (n0[over] / n[over]) ** gamma
        tol = 1e-9 * np.maximum(self.bw, 1.0)
        tol[self.pad] = -1.0
        cap_hi = self.cap * (1 - 1e-12)
        for _ in range(nl + 2):
            if not active.any():
                break
            users = np.bincount(P[active].ravel(), minlength=nl).astype(float)
            users[self.pad] = 0.0
            share = left / np.maximum(users, 1.0)
            share[users == 0] = np.inf
            delta = min(share.min(), self.cap - rate[active].max())
            if delta == np.inf:  # no link and no cap
                rate[active] = 1e30
                break
            rate[active] += delta
            left = left - delta * users  # the pad stays inf (no users)
            sat = left <= tol
            frozen = sat[P].any(axis=1) | (rate >= cap_hi)
            active &= ~frozen
        return rate


class _PSLinks:
    """Fast path when every transfer crosses at most one link: each link is a processor-
    sharing server (all its transfers get min(cap, bw / n)), tracked by its cumulative
    per-transfer service S; a transfer joining at S0 with b bytes ends when S = S0 + b.
    O(log n) per event instead of a rate recomputation over all transfers."""

    def __init__(self, bw: np.ndarray, cap: float, collapse: tuple | None = None):
        self.bw = [float(x) for x in bw] + [float("inf")]  # last: transfers with no link
        self.n0 = None
        if collapse is not None:
            self.n0 = np.broadcast_to(np.asarray(collapse[0], dtype=float), (len(self.bw) - 1,)).tolist() + [np.inf]
            self.gamma = float(collapse[1])
        L = len(self.bw)
        self.cap = float(cap)
        self.S = [0.0] * L
        self.n = [0] * L
        self.heap: list[list] = [[] for _ in range(L)]
        self.t = 0.0

    def _rate(self, l: int) -> float:
        n = self.n[l]
        if not n:
            return 0.0
        bw = self.bw[l]
        if self.n0 is not None and n > self.n0[l]:
            bw *= (self.n0[l] / n) ** self.gamma
        return min(self.cap, bw / n)

    def advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            for l, k in enumerate(self.n):
                if k:
                    self.S[l] += self._rate(l) * dt
        self.t = t

    def add(self, item: int, path: tuple, nbytes: float) -> None:
        l = path[0] if path else len(self.bw) - 1
        heapq.heappush(self.heap[l], (self.S[l] + float(nbytes), item))
        self.n[l] += 1

    def pop_done(self) -> list[int]:
        out = []
        for l, h in enumerate(self.heap):
            if not h:
                continue
            tol = max(1e-6, self._rate(l) * 1e-6)
            while h and h[0][0] - self.S[l] <= tol:
                out.append(heapq.heappop(h)[1])
                self.n[l] -= 1
        return out

    def recompute(self) -> float:
        nxt = float("inf")
        for l, h in enumerate(self.heap):
            if h:
                r = self._rate(l)
                dt = (h[0][0] - self.S[l]) / r if r > 0 else float("inf")
                nxt = min(nxt, self.t + max(dt, 0.0))
        return nxt


def simulate(p: Problem, check: bool = True) -> SimResult:
    """Run the event loop to completion. Deterministic (ties broken by event order)."""
    if check:
        p.check()
    n, R = p.n, p.num_ranks
    rank_of = p.rank.tolist()
    # reverse dependencies (consumers of each item) with the edge latencies
    ndeps = np.diff(p.dep_ptr).astype(np.int64)
    src = np.repeat(np.arange(n), ndeps)
    order = np.argsort(p.dep_idx, kind="stable")
    cons_idx = src[order].tolist()
    cons_lat = np.asarray(p.dep_lat_ns, dtype=float)[order].tolist()
    cons_ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cons_ptr, np.asarray(p.dep_idx, dtype=np.int64) + 1, 1)
    cons_ptr = np.cumsum(cons_ptr).tolist()
    pending = ndeps.tolist()
    floor = (np.zeros(n) if p.floor_ns is None else np.asarray(p.floor_ns, dtype=float)).tolist()
    ready_at = list(floor)  # running max of (dep end + latency)
    end_floor = (np.zeros(n) if p.end_floor_ns is None else np.asarray(p.end_floor_ns, dtype=float)).tolist()
    # stream dependencies: consumers of each item (with latency + tail), per item the edges left
    # and the running max of (completion + latency + tail); base_end: own end once started
    end_left = [0] * n
    end_at = [0.0] * n
    base_end: list = [None] * n
    econs: list = [[] for _ in range(n)]
    if p.end_dep_ptr is not None:
        eptr = np.asarray(p.end_dep_ptr, dtype=np.int64)
        end_left = np.diff(eptr).tolist()
        for c in np.flatnonzero(np.diff(eptr)).tolist():
            for k in range(int(eptr[c]), int(eptr[c + 1])):
                econs[int(p.end_dep_idx[k])].append((c, float(p.end_dep_lat_ns[k]) + float(p.end_dep_tail_ns[k])))
    work = np.asarray(p.work_ns, dtype=float).tolist()
    nbytes = np.asarray(p.nbytes, dtype=float).tolist()
    kind_l = np.asarray(p.kind).tolist()
    is_move = [k == MOVE for k in kind_l]
    claim_ns = float(p.claim_ns)
    sm_l = p.sm or [np.arange(len(m)) for m in p.wg_rules]
    claim_wg = [[0.0 if int(x) < 0 else claim_ns for x in np.asarray(sm_r).tolist()] for sm_r in sm_l]

    INF = float("inf")
    ready_t = [INF] * n
    t_claim = [0.0] * n
    t_start = [0.0] * n
    t_end = [INF] * n
    wg_of = [-1] * n
    waiting = [-1] * n  # WG bound to a claimed, not-yet-ready item

    queues = [[[np.asarray(q.items, dtype=np.int64).tolist(), 0] for q in qs] for qs in p.queues]
    q_of = [None] * n  # item -> (its queue, its position): only a ready *head* changes decisions
    for qs in queues:
        for q in qs:
            for pos, it in enumerate(q[0]):
                q_of[it] = (q, pos)
    rule_sets = [rs if isinstance(rs, str) else [(int(qi), int(m)) for qi, m in rs] for rs in p.rule_sets]
    pend = [[None] * len(wr) for wr in p.wg_rules]  # per WG: claimed-not-ready item it holds
    rules = [[rule_sets[k] for k in np.asarray(wr).tolist()] for wr in p.wg_rules]
    cap = [int(c) for c in (p.inflight_cap or [0] * R)]
    inflight = [0] * R
    capped_item = [False] * n
    parked: list[dict] = [dict() for _ in range(R)]  # spinning WGs: wg -> since
    spins: list = []
    wg_exit = [np.full(len(wr), np.nan) for wr in p.wg_rules]
    movers_now = [0] * R
    max_movers = 0

    ev: list = []
    seq = 0

    def push(t, typ, a, b=0):
        nonlocal seq
        heapq.heappush(ev, (t, typ, seq, a, b))
        seq += 1

    single = all(len(p.path[i]) <= 1 for i in range(n) if is_move[i])
    if single:
        links = _PSLinks(p.link_bw, p.flow_cap, p.collapse)
    else:
        links = _Links(p.link_bw, p.flow_cap, width=max(len(p.path[i]) for i in range(n) if is_move[i]),
                       collapse=p.collapse)
    for i in range(n):
        if pending[i] == 0:
            push(floor[i], _EV_READY, i)
    for r in range(R):
        for g in range(len(rules[r])):
            push(0.0, _EV_FREE, r, g)

    def start(it, t, t_role):
        """Work of `it` begins at t; its role interval (trace) at t_role (claim included)."""
        nonlocal max_movers
        t_start[it] = t_role
        r = rank_of[it]
        if is_move[it]:
            movers_now[r] += 1
            if movers_now[r] > max_movers:
                max_movers = movers_now[r]
            if nbytes[it] > 0:
                push(t + work[it], _EV_JOIN, it)
                return
        e = max(t + work[it], end_floor[it])
        if end_left[it]:  # stream deps still outstanding: ends once the last one is in (complete)
            base_end[it] = e
            return
        push(max(e, end_at[it]), _EV_DONE, it)

    def head(r, qi):
        items, h = queues[r][qi]
        return items[h] if h < len(items) else None

    def claim(r, qi):
        q = queues[r][qi]
        items, h = q
        if h >= len(items):
            return None
        q[1] = h + 1
        return items[h]

    def under_cap(r):
        return cap[r] == 0 or inflight[r] < cap[r]

    def take(r, g, it, t, is_mover):
        """Make `it` the WG's current item (run it, or wait on it if it is not ready)."""
        wg_of[it] = g
        t_claim[it] = t
        if is_mover and rules[r][g] in (SELF_AG, SELF_RS):
            inflight[r] += 1
            capped_item[it] = True
        if ready_t[it] <= t:
            start(it, t + claim_wg[r][g], t)
        else:
            waiting[it] = g
        return queues[r][_QM if is_mover else _QB]

    class _View:
        """decide()'s view of WG g of rank r at time t (kosmos/decide.py)."""

        __slots__ = ("r", "g", "t", "cap")

        def __init__(self, r, g, t):
            self.r, self.g, self.t, self.cap = r, g, t, cap[r]

        def head(self, q):
            return head(self.r, q)

        def claim(self, q):
            return claim(self.r, q)

        def ready(self, q, i):
            return ready_t[i] <= self.t

        def under_cap(self):
            return under_cap(self.r)

        @property
        def pending(self):
            pd = pend[self.r][self.g]
            return None if pd is None else (_QM if is_move[pd] else _QB, pd)

        @pending.setter
        def pending(self, v):
            pend[self.r][self.g] = None if v is None else v[1]

    def self_decide(r, g, t):
        """The kernels' policy 'self' (kosmos.decide.decide): returns the queue the WG took
        from, None to poll (spin), True when done."""
        got = _decide.decide("ag-gemm" if rules[r][g] == SELF_AG else "gemm-rs", _View(r, g, t))
        if got is None:
            return True
        if got == _decide.IDLE:
            return None
        q, i = got
        return take(r, g, i, t, q == _QM)

    def pick(r, g, t):
        """Walk g's rules: the queue it claimed from, None if it must spin, True if it exited."""
        if isinstance(rules[r][g], str):
            res = self_decide(r, g, t)
            if res is True:
                wg_exit[r][g] = t
            return res
        for qi, mode in rules[r][g]:
            q = queues[r][qi]
            items, h = q
            if h >= len(items):
                continue
            it = items[h]
            rdy = ready_t[it] <= t
            is_capped = mode >= ANY_CAPPED and cap[r] > 0
            full = is_capped and inflight[r] >= cap[r]
            if mode == READY or mode == READY_CAPPED:
                if not rdy or full:
                    continue
            elif full:  # ANY_CAPPED at the cap: spin and re-decide later
                return None
            q[1] = h + 1
            wg_of[it] = g
            t_claim[it] = t
            if is_capped:
                inflight[r] += 1
                capped_item[it] = True
            if rdy:
                start(it, t + claim_wg[r][g], t)
            else:
                waiting[it] = g
            return q
        wg_exit[r][g] = t
        return True

    def pending_parked(r):
        return {pend[r][g] for g in parked[r]}

    def dispatch(r, t):
        """Spinning WGs of rank r re-decide (something changed on r)."""
        for g in list(parked[r]):
            if pick(r, g, t) is not None:
                t0 = parked[r].pop(g)
                if t > t0:
                    spins.append((r, g, t0, t))

    def complete(it, t):
        t_end[it] = t
        r = rank_of[it]
        if is_move[it]:
            movers_now[r] -= 1
        if capped_item[it]:
            inflight[r] -= 1
        for k in range(cons_ptr[it], cons_ptr[it + 1]):
            c = cons_idx[k]
            x = t + cons_lat[k]
            if x > ready_at[c]:
                ready_at[c] = x
            pending[c] -= 1
            if pending[c] == 0:
                push(ready_at[c], _EV_READY, c)
        for c, add in econs[it]:
            if t + add > end_at[c]:
                end_at[c] = t + add
            end_left[c] -= 1
            if end_left[c] == 0 and base_end[c] is not None:
                push(max(base_end[c], end_at[c]), _EV_DONE, c)
        push(t, _EV_FREE, r, wg_of[it])
        if capped_item[it] and parked[r]:
            dispatch(r, t)

    nev = 0
    flow_version = 0
    while ev:
        t, typ, _, a, b = heapq.heappop(ev)
        nev += 1
        if typ == _EV_FREE:
            q = pick(a, b, t)
            if q is None:
                parked[a][b] = t
            elif q is not True and parked[a]:
                h = q[1]
                if h >= len(q[0]) or ready_t[q[0][h]] <= t:  # the claim exposed a ready head
                    dispatch(a, t)
        elif typ == _EV_DONE:
            complete(a, t)
        elif typ == _EV_READY:
            ready_t[a] = t
            if waiting[a] >= 0:
                ts = max(t, t_claim[a] + claim_wg[rank_of[a]][waiting[a]])
                start(a, ts, ts)
            elif parked[rank_of[a]] and (q_of[a][0][1] == q_of[a][1] or a in pending_parked(rank_of[a])):
                dispatch(rank_of[a], t)
        elif typ == _EV_JOIN:
            links.advance(t)
            links.add(a, tuple(p.path[a]), nbytes[a])
            flow_version += 1
            push(links.recompute(), _EV_FLOW, flow_version)
        else:  # _EV_FLOW
            if a != flow_version:
                continue
            links.advance(t)
            done = links.pop_done()
            flow_version += 1
            nxt = links.recompute()
            if nxt < INF:
                push(nxt, _EV_FLOW, flow_version)
            for it in done:
                complete(it, t)

    t_end_a = np.asarray(t_end)
    if not np.isfinite(t_end_a).all():
        stuck = np.flatnonzero(~np.isfinite(t_end_a))[:5].tolist()
        raise RuntimeError(f"simulation deadlocked: items never completed, e.g. {stuck} "
                           "(a queue order inconsistent with the dependencies, or no WG may claim them)")
    makespan = float(max([t_end_a.max() if n else 0.0] + [float(np.nanmax(e)) for e in wg_exit if len(e)]))
    for r in range(R):  # spinning until the end (cannot happen: a spin ends when a capped item completes)
        for g, t0 in parked[r].items():
            spins.append((r, g, t0, makespan))
            wg_exit[r][g] = makespan
    return SimResult(p, np.asarray(wg_of, dtype=np.int64), np.asarray(t_claim), np.asarray(t_start), t_end_a,
                     np.asarray(ready_t), wg_exit, makespan, events=nev, max_movers=max_movers, spins=spins)


# ----------------------------------------------------------------------------- helpers
def csr(deps: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """CSR arrays (dep_ptr, dep_idx) from a list of dependency lists."""
    ptr = np.zeros(len(deps) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(d) for d in deps])
    idx = np.fromiter((x for d in deps for x in d), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx
