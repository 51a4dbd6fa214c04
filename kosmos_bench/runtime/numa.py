"""Keep a host-fabric process on the CPUs (and so the memory) next to its GPU.

Pinned host buffers are placed on the NUMA node of the thread that first touches them; a
process that wanders across sockets gets peers' data on the far node, and the PCIe copies
then cross the socket interconnect (copy-alone moved by up to ~10% between points before
this). Multi-GPU launchers bind ranks the same way (e.g. ``numactl`` per rank).
"""
from __future__ import annotations

import os
from pathlib import Path

_BOUND: dict[int, int | None] = {}


def _parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pci_dir(device_index: int) -> Path | None:
    """/sys/bus/pci/devices/<domain:bus:dev.0> of CUDA device `device_index`, if known."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    d = Path(f"/sys/bus/pci/devices/{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:"
             f"{getattr(props, 'pci_device_id', 0):02x}.0")
    return d if d.exists() else None


def bind_near(device_index: int) -> int | None:
    """Restrict this process to the CPUs local to the GPU (once); returns the NUMA node, or
    None where the platform does not say (no sysfs entry, single node, no permission)."""
    if device_index in _BOUND:
        return _BOUND[device_index]
    node = None
    try:
        d = pci_dir(device_index)
        if d is not None and hasattr(os, "sched_setaffinity"):
            cpus = _parse_cpulist((d / "local_cpulist").read_text()) & os.sched_getaffinity(0)
            n = int((d / "numa_node").read_text().strip())
            if cpus and n >= 0:
                os.sched_setaffinity(0, cpus)
                node = n
    except (OSError, ValueError):
        node = None
    _BOUND[device_index] = node
    return node
