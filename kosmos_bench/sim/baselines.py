"""Closed-form models of what the baselines do, from the same hardware profile.

They mirror `impls/nccl.py` stream by stream:

* GEMM alone (cuBLAS): (tiles / G) waves of one tile at the profile's per-SM rate (its
  persistent / stream-K kernels make a partial last wave nearly free); below one wave
  (tiles < G) split-K / stream-K recover part of the idle SMs: utilisation 0.4 + 0.6 x
  tiles / G. Plus the launch.
* collective alone: nvlink -> NCCL at its bus bandwidth (nccl-tests: t = lat + S (W-1)/W / busbw);
  host -> the copy engine moving the (W-1) peer pieces over PCIe (H2D, and D2H in parallel
  on a second engine for gemm-rs).
* `nccl-seq`: the collective then the GEMM (gemm-rs: the GEMM then the collective, plus the
  owner's reduction on the host fabric).
* `nccl-overlap`: W chunks on two streams; chunk GEMMs run on the SMs the collective leaves
  (NCCL takes `nccl.sms` SMs while a transfer is in flight; the copy engine takes none).

All times in microseconds.
"""
from __future__ import annotations

import math

from ..ops.base import ELEM_BYTES
from ..point import Point


def _tile(prof: dict, builder: bool) -> tuple[int, int]:
    """The KOSMOS builder's tile (profile tile_m x tile_n) or cuBLAS's (profile cublas_tile,
    default 128 x 256, its usual Hopper tile), which only matters below one wave."""
    if builder:
        return int(prof["tile_m"]), int(prof["tile_n"])
    bm, bn = prof.get("cublas_tile") or (128, 256)
    return int(bm), int(bn)


def tile_us(prof: dict, dtype: str, k: int, builder: bool = False) -> float:
    """One tile (builder's or cuBLAS's) with depth k on one SM (us)."""
    tflops = float(prof["gemm_tflops"][dtype])
    if builder:
        tflops *= float(prof.get("builder_efficiency", 1.0))
    per_sm = tflops * 1e12 / prof["num_sms"]  # FLOP/s of one SM in a full wave
    bm, bn = _tile(prof, builder)
    return 2.0 * bm * bn * k / per_sm * 1e6 + prof.get("tile_overhead_ns", 0.0) / 1e3


def tiles(prof: dict, m: int, n: int, builder: bool = False) -> int:
    bm, bn = _tile(prof, builder)
    return math.ceil(m / bm) * math.ceil(n / bn)


def cublas_us(prof: dict, dtype: str, m: int, n: int, k: int, sms: int | None = None, launch: bool = True) -> float:
    """cuBLAS-class GEMM (m x n x k) on `sms` SMs (default: all)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    g = sms or prof["num_sms"]
    waves = tiles(prof, m, n) / g
    util = 1.0 if waves >= 1.0 else 0.4 + 0.6 * waves
    t = waves / util * tile_us(prof, dtype, k)
    return t + (prof["launch_overhead_us"] if launch else 0.0)


def local_gemm_shape(p: Point) -> tuple[int, int, int]:
    """(m, n, k) of one rank's whole GEMM."""
    W = p.world
    if p.op == "ag-gemm":
        return p.M, p.N // W, p.K
    return p.M, p.N, p.K // W


def gemm_alone_us(p: Point, prof: dict) -> float:
    return cublas_us(prof, p.dtype, *local_gemm_shape(p))


def _elem(p: Point) -> int:
    return ELEM_BYTES[p.dtype]


def _piece_bytes(p: Point) -> float:
    """Bytes of one rank's piece that crosses the link (an A shard, or a partial C band)."""
    m = p.M // p.world
    return float(m * (p.K if p.op == "ag-gemm" else p.N) * _elem(p))


def _ce(prof: dict, direction: str) -> float:
    ce = prof.get("copy_engine_GBps") or {}
    bw = ce.get(direction) or prof["link"].get(f"{direction}_GBps")
    if not bw:
        raise ValueError(f"profile {prof['name']}: no copy-engine {direction} bandwidth")
    return float(bw)


def _copy_us(prof: dict, nbytes: float, direction: str) -> float:
    """One copy-engine transfer (cudaMemcpyAsync) over PCIe."""
    lat = prof["link"].get("copy_latency_ns", prof["link"].get("latency_ns", 0.0))
    return lat / 1e3 + nbytes / (_ce(prof, direction) * 1e3)


def _duplex_us(prof: dict, p: Point) -> float:
    """The least time the two copy engines need for gemm-rs's host collective, (W-1) pieces
    each way at once: ``copy_engine_GBps.duplex`` where the host caps the pair below the sum of
    the directions (an H100 host: D2H 40 GB/s alone, 66 both ways; profile h100-host-pcie), else 0."""
    bw = (prof.get("copy_engine_GBps") or {}).get("duplex")
    return 2 * (p.world - 1) * _piece_bytes(p) / (float(bw) * 1e3) if bw else 0.0


def _nccl_busbw(prof: dict, p: Point) -> float:
    key = "allgather_busbw_GBps" if p.op == "ag-gemm" else "reduce_scatter_busbw_GBps"
    bw = prof["nccl"].get(key)
    if not bw:
        raise ValueError(f"profile {prof['name']}: no nccl.{key}")
    return float(bw)


def _reduce_us(prof: dict, p: Point) -> float:
    """Owner's elementwise sum of W contributions of its (M/W x N) band, fp32 accumulate."""
    m = p.M // p.world
    nbytes = (p.world + 1) * m * p.N * _elem(p)  # read W inputs, write one output
    return nbytes / (prof["hbm_GBps"] * 1e3) + prof["launch_overhead_us"]


def comm_alone_us(p: Point, prof: dict) -> float:
    """The collective alone on this fabric (0 when world == 1)."""
    W = p.world
    if W == 1:
        return 0.0
    if p.fabric == "host":
        piece = _piece_bytes(p)
        h2d = (W - 1) * _copy_us(prof, piece, "h2d")
        if p.op == "ag-gemm":
            return h2d + prof["launch_overhead_us"]
        d2h = (W - 1) * _copy_us(prof, piece, "d2h")
        return max(h2d, d2h, _duplex_us(prof, p)) + prof["launch_overhead_us"]
    if p.fabric == "local":  # W emulated ranks copy (W-1) pieces each through one GPU's HBM
        return W * (W - 1) * _piece_bytes(p) / (prof["hbm_GBps"] / 2.0 * 1e3) + prof["launch_overhead_us"]
    size = float(p.M * (p.K if p.op == "ag-gemm" else p.N) * _elem(p))
    return prof["nccl"]["latency_us"] + size * (W - 1) / W / (_nccl_busbw(prof, p) * 1e3)


def concurrent_us(p: Point, prof: dict) -> float:
    """The GEMM alone and the collective alone issued together, no dependency (the harness's
    t_concurrent_us): the GEMM runs on the SMs the collective leaves (all of them on the host
    fabric, where the copy engine moves) until the collective ends, then on all SMs."""
    if p.world == 1:
        return gemm_alone_us(p, prof)
    c = comm_alone_us(p, prof)
    m, n, k = local_gemm_shape(p)
    G = prof["num_sms"]
    sms = G if p.fabric in ("host", "local") else max(1, G - int(prof["nccl"].get("sms", 0)))
    g_shared = cublas_us(prof, p.dtype, m, n, k, sms=sms)
    if g_shared <= c:
        return c
    return c + (1.0 - c / g_shared) * gemm_alone_us(p, prof)


def seq_us(p: Point, prof: dict) -> float:
    """`nccl-seq`."""
    W = p.world
    if W == 1:
        return gemm_alone_us(p, prof)
    if p.fabric == "host" and p.op == "gemm-rs":
        # impls/nccl.py: GEMM, then D2H push and H2D pull alternate on ONE stream, then reduce
        piece = _piece_bytes(p)
        copies = (W - 1) * (_copy_us(prof, piece, "d2h") + _copy_us(prof, piece, "h2d"))
        return gemm_alone_us(p, prof) + copies + _reduce_us(prof, p)
    return comm_alone_us(p, prof) + gemm_alone_us(p, prof)


def _chunk_comm_us(p: Point, prof: dict) -> float:
    """One ring step's transfer of one piece (host: copy engine; nvlink: NCCL p2p)."""
    piece = _piece_bytes(p)
    if p.fabric == "host":
        return _copy_us(prof, piece, "h2d")
    bw = prof["nccl"].get("p2p_GBps") or _nccl_busbw(prof, p)
    return prof["nccl"]["latency_us"] + piece / (float(bw) * 1e3)


def overlap_us(p: Point, prof: dict, acc_elems: int = 0) -> float:
    """`nccl-overlap`: the W-chunk decomposition of impls/nccl.py on two streams. ``acc_elems``:
    ag-wgrad (as ag-gemm, ``as_forward``), whose chunks are partials of the whole C_r, summed
    into an fp32 accumulator after each chunk GEMM on the main stream (part -> acc: 6 bytes an
    element, then acc += part: 10), and acc -> C at the end (6): HBM passes over C_r that the
    ag-gemm chunks (disjoint rows of C) do not make."""
    W = p.world
    if W == 1:
        return gemm_alone_us(p, prof)
    m = p.M // W
    G = prof["num_sms"]
    sms_busy = G if p.fabric == "host" else max(1, G - int(prof["nccl"].get("sms", 0)))
    c = _chunk_comm_us(p, prof)
    if p.op == "ag-gemm":
        n = p.N // W
        g_full = cublas_us(prof, p.dtype, m, n, p.K)              # no transfer in flight
        g_shared = cublas_us(prof, p.dtype, m, n, p.K, sms=sms_busy)  # next chunk in flight
        # side stream: transfers back to back (ring forwarding / host copies), chunk s has
        # arrived at s*c; main: GEMM of chunk s once it has arrived and GEMM s-1 is done.
        def acc_pass(nbytes: int) -> float:
            return nbytes * acc_elems / (prof["hbm_GBps"] * 1e3) + prof["launch_overhead_us"] if acc_elems else 0.0

        main = 0.0
        for s in range(W):
            main = max(main, s * c)
            main += g_shared if s + 1 < W and s * c + c > main else g_full
            main += acc_pass(6 if s == 0 else 10)
        return main + acc_pass(6)
    # gemm-rs
    n, k = p.N, p.K // W
    g_shared = cublas_us(prof, p.dtype, m, n, k, sms=sms_busy)
    g_full = cublas_us(prof, p.dtype, m, n, k)
    if p.fabric == "host":
        # pulls of peers' contributions (H2D) from t=0 on one stream; GEMM per destination
        # band (peers first, own last), each pushed D2H on a side stream; reduce at the end.
        pulls = (W - 1) * _copy_us(prof, _piece_bytes(p), "h2d")
        d2h = _copy_us(prof, _piece_bytes(p), "d2h")
        main, pushed = 0.0, 0.0
        for s in range(W):
            main += g_full
            if s + 1 < W:
                pushed = max(pushed, main) + d2h
        return max(main, pushed, pulls, _duplex_us(prof, p)) + _reduce_us(prof, p)
    # nvlink ring reduce-scatter: GEMM band s, add the accumulator received, pass it on
    add = 3 * m * n * _elem(p) / (prof["hbm_GBps"] * 1e3) + prof["launch_overhead_us"]
    main, sent = g_shared, None
    sent = main + c
    for s in range(1, W):
        main += g_shared if s + 1 < W else g_full
        main = max(main, sent) + add
        if s + 1 < W:
            sent = main + c
    return main + m * n * _elem(p) * 2 / (prof["hbm_GBps"] * 1e3)
