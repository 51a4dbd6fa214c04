"""Hardware profiles for the simulator, shipped as JSON data next to this file.

A profile describes one GPU and how it reaches its peers (fields documented in each file's
``notes``; see ``h200-nvlink-x8.json``):

    num_sms, tile_m, tile_n        persistent grid (one WG per SM) and builder tile shape
    gemm_tflops[dtype]             cuBLAS-class rate on large GEMMs (baselines, t_gemm)
    builder_efficiency             KOSMOS builder per-SM tile rate relative to that
    tile_overhead_ns               fixed cost per builder tile (prologue/epilogue)
    topology                       'switch' (per-GPU port shared by all peers), 'mesh' (one
                                   link per peer pair) or 'host' (rank 0 <-> pinned host memory)
    link                           bw_GBps (switch/mesh) or h2d_GBps/d2h_GBps (host), wg_GBps
                                   (what one WG can drive), latency_ns (a mover's first byte)
    flag_latency_ns                {local, remote}: release -> acquire visibility
    claim_ns, launch_overhead_us   queue claim (atomic) and kernel launch costs
    hbm_GBps, wg_hbm_GBps          local memory (reductions)
    nccl                           baseline collectives: busbw, p2p rate, latency, SMs taken
    copy_engine_GBps               {h2d, d2h[, duplex]} on the host fabric (the baselines'
                                   "collective"; duplex: both directions at once, where capped)
    moe                            {kernel_efficiency, grouped_mm_efficiency}: the MoE expert
                                   GEMMs' rate relative to gemm_tflops (the KOSMOS MoE kernels',
                                   torch._grouped_mm's); 1 where absent
    memory_GB                      device memory per GPU (10^9 bytes); a point whose inputs and
                                   outputs do not fit is refused (sim.check_memory); None: no check

`load(name)` accepts a shipped name or a path to a JSON file (e.g. one `calibrate` wrote).
"""
from __future__ import annotations

import json
from pathlib import Path

_DIR = Path(__file__).resolve().parent
REQUIRED = ("name", "topology", "num_sms", "tile_m", "tile_n", "gemm_tflops", "link", "flag_latency_ns",
            "launch_overhead_us", "nccl")
_DEFAULTS = {"builder_efficiency": 1.0, "tile_overhead_ns": 0.0, "claim_ns": 0.0, "hbm_GBps": 3000.0,
             "wg_hbm_GBps": 100.0, "copy_engine_GBps": None, "memory_GB": None, "world": 8, "measured": False, "notes": []}


def names() -> list[str]:
    """Shipped profile names."""
    return sorted(p.stem for p in _DIR.glob("*.json"))


def load(name: str) -> dict:
    """The profile `name` (shipped) or the JSON file at path `name`, validated, with defaults."""
    path = _DIR / f"{name}.json"
    if not path.exists():
        p = Path(name)
        if p.suffix == ".json" and p.exists():
            path = p
        else:
            raise KeyError(f"unknown simulator profile {name!r}; shipped: {', '.join(names())} "
                           "(or give a path to a profile .json)")
    prof = json.loads(path.read_text())
    missing = [k for k in REQUIRED if k not in prof]
    if missing:
        raise ValueError(f"profile {path}: missing keys {missing}")
    if prof["topology"] not in ("switch", "mesh", "host"):
        raise ValueError(f"profile {path}: topology must be switch | mesh | host, got {prof['topology']!r}")
    return {**_DEFAULTS, **prof}


def default_for(fabric: str, world: int) -> str:
    """The shipped profile to use for a fabric: host -> h200-host-pcie (rank-0 view),
    local -> h200-host-pcie (its HBM figures model emulated ranks on one GPU),
    nvlink / gloo -> h200-nvlink-x8 (scaled to any world: the switch port is per GPU)."""
    del world  # every shipped profile scales with W (per-GPU figures)
    if fabric in ("host", "local"):
        return "h200-host-pcie"
    return "h200-nvlink-x8"
