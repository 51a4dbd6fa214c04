"""The MoE forward kernel (``csrc/moe_fwd_sm90.cu``): ctypes mirror of its C ABI, build, load.

One cooperative persistent launch per forward (router, top-k, scan, dispatch, expert GEMMs with
SwiGLU fused, fold, shared expert); the runner is :mod:`kosmos_bench.impls.kosmos_moe`. Its own
shared library (``libkosmos_moe_sm90-<hash>-sm_90a.so``, CUTLASS headers), built, cached and loaded
by :mod:`kosmos_bench.kernels.libs` (``libs.MOE_SM90``); builds on any machine with nvcc. Two builds
of the same source, one per math-warpgroup schedule (``KosmosConfig.math_wgs``, :data:`LIBS`):
joint (two warpgroups on one 128 x 256 tile) and ping-pong (``libs.MOE_SM90_PP``: a warpgroup a
128 x 128 tile, one's epilogue under the other's MMAs); their UP n-tiles pair gate and up columns
within :data:`W1_TILE` columns.

C ABI: ``kosmos_moe_{abi_version,last_error,smem_bytes,threads,args_offset,validate,create,destroy,
set,max_wgs,launch}``; the argument struct is ``KosmosMoeArgs`` of ``csrc/kosmos/moe_params.h``
(:class:`MoeArgs` here, field by field; ``kosmos_moe_args_offset`` lets a CPU test compare them).
"""
from __future__ import annotations

import ctypes as C

from . import libs
from .abi import declare_runner, struct_mismatches

LIB = libs.MOE_SM90
MATH = ("joint", "pingpong")  # KosmosConfig.math_wgs
LIBS = {"joint": libs.MOE_SM90, "pingpong": libs.MOE_SM90_PP}
W1_TILE = {"joint": 256, "pingpong": 128}  # the kernel's kBN: UP n-tile = [W1_TILE/2 gate | W1_TILE/2 up]
ABI_VERSION = 7
MAX_E = 256
MAX_TOPK = 16
TOK_BLOCK = 32  # tokens per DISPATCH / INDEX / FOLD item, rows per GATHER item
BM = 128        # rows per expert tile (segments of the sorted buffer are padded to it)

# Item kinds in claim order (moe_params.h KosmosMoeKind): the error record's `queue`, and the
# high byte of a trace record's item; INDEX and GATHER are the movers' (outside the sequence).
KINDS = ("ROUTE", "SCAN", "SHARED_UP", "DISPATCH", "PEER_DISPATCH", "SHARED_DOWN", "UP", "DOWN", "COMBINE", "FOLD",
         "INDEX", "GATHER", "COMBINE_TILE")
ITEM_KINDS = KINDS  # every kind an error or trace record names (the backward adds its movers' own)
# Counter words (KosmosMoeCtr): head, then arrived / up_done / down_done [tiles_max],
# sh_up_done / sh_down_done [route_blocks], combined [E (with tiles)], down_group_done
# [FOLD_GROUPS], the FOLD claim counter.
CTR_HEAD = 8
FOLD_GROUPS = 4  # moe_params.h KOSMOS_MOE_FOLD_GROUPS: DOWN's column groups (no peer rows)
HEAD_NAMES = ("claim", "routed", "exit", "index claim", "indexed", "gather claim", "sent", "combine claim")
assert len(HEAD_NAMES) == CTR_HEAD  # word_name: the head's names, then the arrays
# Trace roles of this kernel (the kernel's MoeRole).
ROLE_CODES = {0: "ROUTER", 1: "DISPATCH", 2: "EXPERT", 3: "COMBINE", 4: "FOLD"}

P = C.c_void_p
I32 = C.c_int32
MAX_PEERS = 8  # pointer slots per peer table (ranks 0..7; slot 0 unused)


class MoeArgs(C.Structure):
    _fields_ = [
        ("x", P), ("bias", P), ("y", P), ("routes", P), ("weights", P), ("rank", P), ("logits", P),
        ("blk_cnt", P), ("blk_base", P), ("seg_start", P), ("tile_order", P), ("tile_expert", P),
        ("tile_rows", P), ("meta", P), ("xs", P), ("hs", P), ("os", P), ("hsh", P), ("ysh", P),
        ("gus", P), ("gush", P), ("own_total", P), ("sorted_choice", P), ("peer_inv", P), ("peer_first", P), ("ce_flags", P),
        ("ref_routes", P), ("ref_slot", P), ("peer_expert", P), ("peer_rel", P), ("peer_total", P),
        ("recv_rows", P * MAX_PEERS), ("recv_out", P * MAX_PEERS), ("send_rows", P * MAX_PEERS),
        ("send_out", P * MAX_PEERS), ("peer_begin", I32 * (MAX_PEERS + 1)), ("E_tiles", I32), ("E_loc", I32),
        ("peer_rows", I32),
        ("ctr", P), ("state", P), ("err", P), ("trace", P), ("trace_count", P),
        ("timeout_ns", C.c_uint64),
        ("T", I32), ("H", I32), ("F", I32), ("Fs", I32), ("E", I32), ("topk", I32),
        ("n_group", I32), ("topk_group", I32), ("scoring", I32),
        ("route_blocks", I32), ("tiles_max", I32), ("ctr_words", I32),
        ("grid", I32), ("trace_cap", I32), ("spin_ns", I32),
        ("debug_skip_scan", I32), ("scale", C.c_float), ("queue_order", I32),
    ]


assert C.sizeof(MoeArgs) == (36 + 4 * MAX_PEERS) * 8 + 8 + (9 + 3 + 18) * 4, C.sizeof(MoeArgs)


def tiles_max(T: int, topk: int, E: int, peer_rows: int = 0) -> int:
    """Most expert tiles any routing of T tokens (plus static peer rows) can produce on E
    experts with tiles here (segments padded to BM rows)."""
    return -(-(T * topk + peer_rows) // BM) + E


def ctr_words(T: int, topk: int, E: int, peer_rows: int = 0) -> int:
    nb = -(-T // BM)
    return CTR_HEAD + 3 * tiles_max(T, topk, E, peer_rows) + 2 * nb + E + FOLD_GROUPS + 1


def counter_name(word: int, T: int, topk: int, E: int, peer_rows: int = 0) -> str:
    """What counter word `word` is (for the watchdog's message); -1 is the scan flag."""
    if word == -2:
        return "copy-engine flag"
    if word < 0:
        return "scan flag"
    tm, nb = tiles_max(T, topk, E, peer_rows), -(-T // BM)
    return word_name(word, HEAD_NAMES, (("arrived", tm), ("up_done", tm), ("down_done", tm), ("shared_up_done", nb),
                                        ("shared_down_done", nb), ("combined", E), ("down_group_done", FOLD_GROUPS),
                                        ("fold claim", 1)))


def word_name(word: int, head_names, sections) -> str:
    """Counter word `word` of a MoE kernel: one of the head's named counters (as many as names),
    then the arrays of `sections` ((name, length), ...) in their order in the counter buffer."""
    if word < len(head_names):
        return f"counter {head_names[max(word, 0)]}"
    w = word - len(head_names)
    for name, n in sections:
        if w < n:
            return f"{name}[{w}]"
        w -= n
    return f"counter word {word}"


def _declare(lib: C.CDLL) -> C.CDLL:
    return declare_runner(lib, "kosmos_moe", [P, C.POINTER(MoeArgs), P, P, P, P, P], 8, ABI_VERSION,
                          "libkosmos_moe_sm90 (moe_sm90.py)")


def load(math: str = "joint") -> C.CDLL:
    """The loaded library of schedule `math` (:data:`MATH`; built on first use when no cached build
    matches the sources)."""
    if math not in LIBS:
        raise ValueError(f"math_wgs {math!r}: expected one of {', '.join(MATH)}")
    return LIBS[math].load(declare=_declare)


def last_error(lib: C.CDLL) -> str:
    return (lib.kosmos_moe_last_error() or b"").decode(errors="replace")


def layout_mismatches(lib: C.CDLL) -> list[str]:
    """Fields whose offset differs between MoeArgs and the C struct (and the size): [] when equal."""
    return struct_mismatches(MoeArgs, lib.kosmos_moe_args_offset)
