"""The MoE backward kernel (``csrc/moe_bwd_sm90.cu``): ctypes mirror of its C ABI, build, load.

One cooperative persistent launch per backward (combine-gradient gather, expert dgrad with the
SwiGLU backward fused, expert wgrad, router and shared expert backward, fold of dx); it reads
the saved state of a forward run by ``csrc/moe_fwd_sm90.cu`` with its pre-activations saved.
The runner is :mod:`kosmos_bench.impls.kosmos_moe_bwd`. Its own shared library
(``libkosmos_moe_bwd_sm90-<hash>-sm_90a.so``), built, cached and loaded by
:mod:`kosmos_bench.kernels.libs` (``libs.MOE_BWD_SM90``).

C ABI: ``kosmos_moe_bwd_{abi_version,fwd_abi_version,last_error,smem_bytes,threads,args_offset,
validate,item_count,create,destroy,set,max_wgs,launch}``; the argument struct is
``KosmosMoeBwdArgs`` of ``csrc/kosmos/moe_bwd_params.h`` (:class:`MoeBwdArgs` here, field by
field, the forward's :class:`~kosmos_bench.kernels.moe_sm90.MoeArgs` as its first field).
"""
from __future__ import annotations

import ctypes as C

from . import libs
from .abi import declare_runner, struct_mismatches
from . import moe_sm90 as fwd

LIB = libs.MOE_BWD_SM90
# Two builds of the kernel, one per math-warpgroup schedule (KosmosConfig.math_wgs, as the
# forward's: kernels/moe_sm90.py), and the n-tile width (kBN) of each.
LIBS = {"joint": libs.MOE_BWD_SM90, "pingpong": libs.MOE_BWD_SM90_PP}
BN = {"joint": 256, "pingpong": 128}
ABI_VERSION = 3
BM = fwd.BM
TOK_BLOCK = fwd.TOK_BLOCK

# Item kinds in claim order (moe_bwd_params.h KosmosMoeBwdKind): the error record's `queue`,
# and the high byte of a trace record's item.
KINDS = ("SHARED_DH", "GATHER", "PEER_GATHER", "PAD", "SHARED_WG2", "DH", "DXR", "DWR", "DX", "PEER_COMBINE",
         "SHARED_DX", "WG2", "SHARED_WG1", "WG1", "FOLD")
# ... and after them the movers' own kind (no peers: world 1, local): every kind an error record or
# a trace record can name. Without peers the movers run the GATHERs (none in the claim sequence).
ITEM_KINDS = KINDS + ("LOGITS",)
# Counter words (KosmosMoeBwdCtr): head, then arrived / dh_done / dx_done [tiles_max],
# lg_done / xr_done / sdh_done / sdx_done / dw_done [route_blocks].
CTR_HEAD = 5
HEAD_NAMES = ("claim", "mover gather claim", "exit", "mover logits claim", "fold claim")
assert len(HEAD_NAMES) == CTR_HEAD  # word_name: the head's names, then the arrays
# Trace roles of this kernel (the kernel's BwdRole).
ROLE_CODES = {0: "GATHER", 1: "EXPERT_DGRAD", 2: "EXPERT_WGRAD", 3: "ROUTER", 4: "SHARED", 5: "FOLD", 6: "COMBINE"}

P = C.c_void_p
I32 = C.c_int32
MAX_PEERS = fwd.MAX_PEERS


class MoeBwdArgs(C.Structure):
    _fields_ = [
        ("f", fwd.MoeArgs),
        ("dy", P), ("w1", P), ("w2", P), ("wr", P), ("ws1", P), ("ws2", P),
        ("dos", P), ("dgus", P), ("dxs", P), ("dlogits", P), ("dxr", P), ("dgush", P), ("dxsh", P),
        ("dx", P), ("dwr", P), ("dw1", P), ("dw2", P), ("dws1", P), ("dws2", P), ("dwc", P),
        ("recv_gout", P * MAX_PEERS), ("recv_dx", P * MAX_PEERS), ("send_gout", P * MAX_PEERS),
        ("send_dx", P * MAX_PEERS),
        ("ctr", P), ("state", P), ("err", P), ("trace", P), ("trace_count", P),
        ("timeout_ns", C.c_uint64),
        ("W", I32), ("T1", I32), ("E8", I32), ("ctr_words", I32),
        ("grid", I32), ("trace_cap", I32), ("spin_ns", I32), ("debug_skip_gather", I32),
    ]


assert C.sizeof(MoeBwdArgs) == C.sizeof(fwd.MoeArgs) + (25 + 4 * MAX_PEERS) * 8 + 8 + 8 * 4, C.sizeof(MoeBwdArgs)


def e8(E: int) -> int:
    """The router gradient's row width: E rounded up to 8 (16-byte rows for TMA)."""
    return -(-E // 8) * 8


def ctr_words(T: int, topk: int, E_tiles: int, peer_rows: int = 0) -> int:
    return CTR_HEAD + 3 * fwd.tiles_max(T, topk, E_tiles, peer_rows) + 5 * -(-T // BM)


def item_counts(T: int, H: int, F: int, Fs: int, E: int, topk: int, W: int, E_tiles: int | None = None,
                peer_rows: int = 0, math: str = "joint") -> dict[str, int]:
    """Claims per kind of the claim sequence (the kernel's Layout, mirrored: a CPU test compares
    them); E_tiles: the experts with tiles here (default E; the host view: rank 0's), peer_rows:
    the view's peer rows, math: the build (its n-tile width, :data:`BN`). Without peers the
    movers gather: no GATHER claims."""
    cd = lambda a, b: -(-a // b)  # noqa: E731
    Et = E if E_tiles is None else E_tiles
    nb, tb, tm, pb = cd(T, BM), cd(T, TOK_BLOCK), fwd.tiles_max(T, topk, Et, peer_rows), cd(peer_rows, TOK_BLOCK)
    bn = BN[math]
    nF, nH, nFs = cd(F, bn), cd(H, bn), cd(Fs, bn)
    mH, mF2, mFs2, mE = cd(H, BM), cd(2 * F, BM), cd(2 * Fs, BM), cd(e8(E), BM)
    sh = 1 if Fs else 0
    movers_gather = Et == E and peer_rows == 0
    n = (sh * nb * nFs, 0 if movers_gather else tb, pb, Et, sh * W * mH * nFs, tm * nF, nb * nH, W * mE * nH, tm * nH, pb, sh * nb * nH,
         Et * mH * nF, sh * W * mFs2 * nH, Et * mF2 * nH, tb)
    return dict(zip(KINDS, n))


def counter_name(word: int, T: int, topk: int, E_tiles: int, peer_rows: int = 0) -> str:
    """What counter word `word` is (for the watchdog's message)."""
    tm, nb = fwd.tiles_max(T, topk, E_tiles, peer_rows), -(-T // BM)
    return fwd.word_name(word, HEAD_NAMES, (("arrived", tm), ("dh_done", tm), ("dx_done", tm), ("lg_done", nb),
                                            ("xr_done", nb), ("shared_dh_done", nb), ("shared_dx_done", nb),
                                            ("dw_done", nb)))


def _declare(lib: C.CDLL) -> C.CDLL:
    declare_runner(lib, "kosmos_moe_bwd", [P, C.POINTER(MoeBwdArgs)], 7, ABI_VERSION,
                   "libkosmos_moe_bwd_sm90 (moe_bwd_sm90.py)")
    lib.kosmos_moe_bwd_fwd_abi_version.restype = C.c_int
    lib.kosmos_moe_bwd_item_count.argtypes = [C.POINTER(MoeBwdArgs), C.c_int]
    lib.kosmos_moe_bwd_item_count.restype = C.c_long
    if lib.kosmos_moe_bwd_fwd_abi_version() != fwd.ABI_VERSION:
        raise libs.BuildError(f"libkosmos_moe_bwd_sm90 embeds the forward's ABI {lib.kosmos_moe_bwd_fwd_abi_version()}"
                              f" != {fwd.ABI_VERSION} (moe_sm90.py)")
    return lib


def load(math: str = "joint") -> C.CDLL:
    """The loaded library of build `math` (:data:`LIBS`; built on first use when no cached build
    matches the sources)."""
    if math not in LIBS:
        raise ValueError(f"math_wgs {math!r}: expected one of {', '.join(LIBS)}")
    return LIBS[math].load(declare=_declare)


def last_error(lib: C.CDLL) -> str:
    return (lib.kosmos_moe_bwd_last_error() or b"").decode(errors="replace")


def layout_mismatches(lib: C.CDLL) -> list[str]:
    """Fields whose offset differs between MoeBwdArgs and the C struct (and the size): [] when equal."""
    return struct_mismatches(MoeBwdArgs, lib.kosmos_moe_bwd_args_offset)
