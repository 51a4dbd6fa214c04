"""Shared-GPU mode of the `nvlink` fabric: W rank processes on fewer GPUs than ranks.

The nvlink fabric runs one process per rank. When a point has more ranks than visible GPUs
(e.g. world 2 on one H200), or when asked explicitly (``launch.run_points(shared_gpu=True)``),
the ranks share GPUs instead of failing in NCCL's "Duplicate GPU detected":

* devices: rank r on GPU ``r % n_gpus`` (round-robin; all on cuda:0 with one GPU, and all on
  cuda:0 when sharing is forced);
* process group: gloo (host-side handshakes only: barriers, the handle exchange, the max of
  the per-rank times); NCCL only where every rank has its own GPU;
* peer memory: torch symmetric memory if its rendezvous works over that group, else CUDA IPC
  handles exchanged over it (impls/kosmos.py ``_peer_memory``; the row says which and why);
* the kernels of different processes are time-sliced by the driver, not co-resident: every
  cross-rank spin polls with the watchdog deadline, and the default watchdog is longer
  (``SHARED_GPU_TIMEOUT_S``) so a peer that is merely descheduled never trips it;
* rows say ``shared_gpu: true`` and ``emulated: true``: these timings measure nothing about
  NVLink. Baselines that need NCCL (nccl-seq, nccl-overlap, te-ub, flux, deepep) are skipped
  with the reason; symm-mem runs (torch symmetric memory over the gloo group).

Everything here but ``visible_gpus`` is pure (CPU tests: tests/test_sharing.py).
"""
from __future__ import annotations

from dataclasses import dataclass

# Watchdog default (seconds) of kosmos kernels in shared-GPU mode: time slices are ms, but a
# peer process may still be in Python (prepare, a gloo barrier) while this one's kernel spins.
SHARED_GPU_TIMEOUT_S = 30.0

EMULATED_NOTE = ("nvlink fabric in SHARED-GPU mode: the rank processes time-share one GPU; "
                 "these timings measure nothing about NVLink")

# Set in each worker process by launch (explicit request); None = decide from the GPU count.
_FORCED: bool | None = None


@dataclass(frozen=True)
class Layout:
    """How the processes of a point are placed."""

    shared_gpu: bool
    group_backend: str | None  # 'nccl' | 'gloo' | None (no process group: one process)
    devices: tuple[int, ...]  # GPU index per rank (empty on the cpu backend)
    reason: str = ""


def layout(fabric: str, backend: str, world: int, n_gpus: int, force_shared: bool | None = None) -> Layout:
    """The placement decision (pure)."""
    if fabric not in ("nvlink", "gloo"):
        return Layout(False, None, tuple([0] if backend == "gpu" and n_gpus else []), "one process")
    if backend != "gpu":
        return Layout(False, "gloo", (), "cpu backend: gloo")
    if fabric == "gloo":  # (as before: the gloo fabric's group on the gpu backend is NCCL's)
        return Layout(False, "nccl", tuple(r % max(1, n_gpus) for r in range(world)), "gloo fabric on GPUs")
    if n_gpus < 1:
        return Layout(False, "nccl", (), "no visible GPU")
    if force_shared:
        return Layout(True, "gloo", tuple(0 for _ in range(world)),
                      f"shared-GPU mode requested: all {world} ranks on cuda:0, gloo group")
    if force_shared is None and world > n_gpus:
        return Layout(True, "gloo", tuple(r % n_gpus for r in range(world)),
                      f"world {world} > {n_gpus} visible GPU(s): ranks round-robin over them, gloo group")
    return Layout(False, "nccl", tuple(range(world)), "one GPU per rank: NCCL group")


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def set_forced(value: bool | None) -> None:
    global _FORCED
    _FORCED = value


def forced() -> bool | None:
    return _FORCED


def layout_of(point, n_gpus: int | None = None) -> Layout:
    """The placement of `point` in this process (its forced setting, the visible GPUs)."""
    return layout(point.fabric, point.backend, point.world, visible_gpus() if n_gpus is None else n_gpus, _FORCED)


def is_shared(point, n_gpus: int | None = None) -> bool:
    return layout_of(point, n_gpus).shared_gpu


def needs_nccl_reason(name: str) -> str:
    return (f"{name} needs NCCL with one GPU per rank, and this is the nvlink fabric in shared-GPU mode "
            "(NCCL refuses two ranks on one GPU: 'Duplicate GPU detected')")
