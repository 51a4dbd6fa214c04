"""The one interface every implementation family sits behind.

The harness (``kosmos_bench/harness.py``) drives an implementation like this, in every
process that takes part in a point::

    impl = get_impl(point.impl)
    ok, why = impl.available(point.backend)       # -> 'skipped' row when not ok
    why = impl.unsupported(point)                 # -> 'skipped' row when a string
    runner = impl.prepare(point, ctx, inputs)     # allocate, rendezvous, build kernels
    runner.run()                                  # one call; writes runner.outputs in place
    runner.close()

``inputs`` are this process's shards (``ops.base.RankInputs``); ``runner.outputs`` maps each
rank this process computes to its output tensor, which the harness poisons (NaN) before the
correctness call and compares with the op's reference afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from ..point import Point


class SkipPoint(Exception):
    """Raised by prepare() when the point cannot run here for a reason only found while
    preparing (e.g. symm-mem in shared-GPU mode when torch refuses the rendezvous): the harness
    writes a 'skipped' row with the message. Every rank must raise it (a collective failed)."""


@dataclass
class RankCtx:
    """Where this process stands in a point.

    rank/world are *logical* ranks of the op. ``procs`` is how many real processes take
    part: W for the nvlink and gloo fabrics (one per rank), 1 for the single-GPU fabrics
    (``local``: this process emulates all W ranks; ``host``: this process is rank 0 and the
    peers' data is static in pinned host memory).
    """

    rank: int
    world: int
    procs: int
    device: torch.device
    fabric: str
    backend: str
    group: Any = None  # torch.distributed ProcessGroup when procs > 1, else None
    # nvlink fabric with several rank processes time-sharing a GPU (sharing.py): gloo group,
    # peers through symmetric memory / CUDA IPC on the same device, timings emulated
    shared_gpu: bool = False

    @property
    def ranks_here(self) -> list[int]:
        """Logical ranks whose outputs this process produces."""
        if self.fabric == "local":
            return list(range(self.world))
        return [self.rank]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Runner(Protocol):
    outputs: dict[int, torch.Tensor]

    def run(self) -> None: ...

    def close(self) -> None: ...


def close_quietly(runner: Runner | None) -> None:
    """Release a runner after its point ended (ok or not): a failing close never hides the
    point's own result."""
    if runner is None:
        return
    try:
        runner.close()
    except Exception:  # noqa: BLE001
        pass


@dataclass
class FnRunner:
    """A Runner from a plain callable; most baselines need nothing more."""

    fn: Callable[[], None]
    outputs: dict[int, torch.Tensor]
    on_close: Callable[[], None] | None = None
    # Extra columns to store with the point (e.g. the kosmos kernel's chosen mover count).
    info: dict = field(default_factory=dict)

    def run(self) -> None:
        self.fn()

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


class Impl(Protocol):
    name: str
    ops: tuple[str, ...]
    # Which fabrics this family can run on (others are 'skipped' with a reason).
    fabrics: tuple[str, ...]

    def available(self, backend: str) -> tuple[bool, str]:
        """(True, '') when usable on this backend, else (False, one-line reason)."""
        ...

    def unsupported(self, point: Point) -> str | None:
        """None when this point can run, else the one-line reason it is skipped."""
        ...

    def prepare(self, point: Point, ctx: RankCtx, inputs) -> Runner: ...


def common_unsupported(impl: Impl, point: Point) -> str | None:
    """Checks shared by all families: op and fabric coverage."""
    if point.op not in impl.ops:
        return f"{impl.name} does not implement {point.op}"
    if point.fabric not in impl.fabrics:
        return f"{impl.name} does not run on the {point.fabric} fabric (runs on: {', '.join(impl.fabrics)})"
    return None
