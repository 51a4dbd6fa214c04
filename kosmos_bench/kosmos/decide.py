"""The reference WG decision of policy 'self' (csrc/kosmos/persistent.cuh decide(); the rules
in schedule.py's docstring "Queues and the WG loop"). One Python source for the rule:
``schedule.simulate_steps`` (unit steps) and ``sim/engine.py`` (event-driven) both call
:func:`decide` with a small view of their state.

The view (``v``) answers, for the WG deciding and its rank:

* ``v.head(q)``: the item at queue q's head, None when the queue is exhausted;
* ``v.claim(q)``: claim the head (advance the counter), returning it (None when exhausted);
* ``v.ready(q, i)``: whether item i of queue q has its dependencies met;
* ``v.under_cap()``: whether a mover slot is free (``max_inflight`` 0: always);
* ``v.cap``: the rank's mover cap (0: none);
* ``v.pending`` / ``v.pending = (q, i)``: the WG's pending claim (at most one) or None.

``decide`` returns ``(q, i)`` (the WG runs item i of queue q, or waits on it when it is not
ready), :data:`IDLE` (poll: a mover is wanted and no slot is free) or None (nothing left: the
WG exits). Taking the pending item clears ``v.pending``.
"""
from __future__ import annotations

Q_BUILD, Q_MOVE, Q_REDUCE = range(3)  # as schedule.Q_*
IDLE = (-1, -1)


def decide(op: str, v):
    """The next item of a policy-'self' WG (see the module docstring)."""
    for _ in range(4):  # at most one re-decision after parking a claim as pending
        got = _once(op, v)
        if got is not _AGAIN:
            return got
    raise RuntimeError("decide: no decision")  # unreachable


_AGAIN = object()


def _take_pending(v):
    pend = v.pending
    v.pending = None
    return pend


def _mover_with_slot(v):
    if v.head(Q_MOVE) is None or not v.under_cap():
        return None
    return Q_MOVE, v.claim(Q_MOVE)


def _once(op: str, v):
    pend = v.pending
    if pend is not None and pend[0] != Q_MOVE and v.ready(*pend):
        return _take_pending(v)
    if op in ("ag-gemm", "ag-wgrad"):  # ag-wgrad: tile items always ready (waits inside); band items: their deps
        # [cap: mover if a slot is free] > builder head ready ? claim it : mover if a slot is free >
        # [no slot: poll] > block on the pending / next builder (movers exhausted) > done
        if v.cap:
            m = _mover_with_slot(v)
            if m:
                return m
        if pend is None:
            i = v.head(Q_BUILD)
            if i is not None and v.ready(Q_BUILD, i):
                i = v.claim(Q_BUILD)  # the kernel peeks, claims and checks again
                if v.ready(Q_BUILD, i):
                    return Q_BUILD, i
                v.pending = (Q_BUILD, i)
                return _AGAIN
        if v.head(Q_MOVE) is not None:
            return _mover_with_slot(v) or IDLE
        if pend is not None:
            return _take_pending(v)
        i = v.claim(Q_BUILD)
        return (Q_BUILD, i) if i is not None else None
    # gemm-rs: pending ready > reduce head ready > next mover (unready: pending) > next builder >
    # pending mover (slot) > mover if a slot is free > [no slot: poll] > pending / next reduce > done
    if pend is not None and pend[0] == Q_MOVE and v.ready(*pend) and v.under_cap():
        return _take_pending(v)
    if pend is None:
        i = v.head(Q_REDUCE)
        if i is not None and v.ready(Q_REDUCE, i):
            i = v.claim(Q_REDUCE)
            if v.ready(Q_REDUCE, i):
                return Q_REDUCE, i
            v.pending = (Q_REDUCE, i)
            return _AGAIN
        i = v.claim(Q_MOVE)
        if i is not None:
            if v.ready(Q_MOVE, i) and v.under_cap():
                return Q_MOVE, i
            v.pending = (Q_MOVE, i)
            return _AGAIN
    i = v.claim(Q_BUILD)
    if i is not None:
        return Q_BUILD, i
    if pend is not None and pend[0] == Q_MOVE:
        return _take_pending(v) if v.under_cap() else IDLE
    if v.head(Q_MOVE) is not None:
        return _mover_with_slot(v) or IDLE
    if pend is not None:
        return _take_pending(v)
    i = v.claim(Q_REDUCE)
    return (Q_REDUCE, i) if i is not None else None


def parse_policy(policy: str) -> tuple[str, int | None]:
    """'self' -> ('self', None); 'fixed:4' -> ('fixed', 4); 'predicted' -> ('predicted', None)."""
    if policy in ("self", "predicted"):
        return policy, None
    if policy.startswith("fixed:"):
        try:
            k = int(policy.split(":", 1)[1])
        except ValueError:
            k = -1
        if k >= 1:
            return "fixed", k
    raise ValueError(f"policy {policy!r}: expected 'self', 'predicted' or 'fixed:<k>' with k >= 1")
