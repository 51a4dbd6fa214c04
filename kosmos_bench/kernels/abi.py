"""ctypes mirror of csrc/kosmos/params.h (KOSMOS_ABI_VERSION 9). Change both together."""
from __future__ import annotations

import ctypes as C

from . import libs

ABI_VERSION = 9
MAX_WORLD = 8
NUM_CTR = 8  # per-rank counters in the state buffer (KOSMOS_NUM_CTR)
OP_CODES = {"ag-gemm": 0, "gemm-rs": 1, "ag-wgrad": 2}  # ag-wgrad: the sm90 A-transposed library only
QUEUE_NAMES = ("builder", "mover", "reduce", "handshake")

P = C.c_void_p


class RankArgs(C.Structure):
    _fields_ = [
        ("items", P * 3),
        ("queue", P * 3),
        ("deps", P),
        ("peer_flags", P),
        ("flag_mult", P),
        ("ctr", P),
        ("A", P),
        ("B", P),
        ("C", P),
        ("work", P),
        ("carry", P),  # ag-wgrad band items: the fp32 carry (fragment order, one 128 x 256 tile per C_r tile)
        ("flags", P * MAX_WORLD),
        ("peer_A", P * MAX_WORLD),
        ("push_dst", P * MAX_WORLD),
        ("slot", P * MAX_WORLD),
        ("proxy_src", P * MAX_WORLD),
        ("count", C.c_int32 * 3),
        ("rank", C.c_int32),
        ("wg_begin", C.c_int32),
        ("wg_end", C.c_int32),
        ("num_mover_wgs", C.c_int32),
        ("num_peer_flags", C.c_int32),
        ("skip", C.c_int32),
        ("max_inflight_movers", C.c_int32),
    ]


class ErrorRecord(C.Structure):
    _fields_ = [
        ("count", C.c_uint32), ("epoch", C.c_uint32), ("rank", C.c_int32), ("wg", C.c_int32),
        ("queue", C.c_int32), ("item", C.c_int32), ("flag_rank", C.c_int32), ("flag", C.c_int32),
        ("expected", C.c_uint32), ("seen", C.c_uint32), ("waited_ns", C.c_uint64),
    ]


TRACE_RECORD_BYTES = 24  # {u64 t0, u64 t1, i32 item, u16 role, u16 sm}


class Params(C.Structure):
    _fields_ = [
        ("ranks", P), ("state", P), ("err", P), ("trace", P), ("trace_count", P),
        ("timeout_ns", C.c_uint64),
        ("op", C.c_int32), ("num_ranks", C.c_int32), ("world", C.c_int32),
        ("M", C.c_int32), ("N", C.c_int32), ("K", C.c_int32),
        ("trace_cap", C.c_int32), ("sys_scope", C.c_int32), ("static_peers", C.c_int32), ("grid", C.c_int32),
        ("mover_bulk", C.c_int32), ("k_stream", C.c_int32), ("spin_ns", C.c_int32), ("wgrad_group_rows", C.c_int32),
    ]


assert C.sizeof(RankArgs) == 8 * (3 + 3 + 9 + 5 * MAX_WORLD) + 4 * 10, C.sizeof(RankArgs)
assert C.sizeof(ErrorRecord) == 48
assert C.sizeof(Params) == 6 * 8 + 14 * 4


def declare(lib: C.CDLL) -> C.CDLL:
    """Argument / return types of the C entry points (params.h)."""
    lib.kosmos_abi_version.restype = C.c_int
    for f in ("kosmos_rank_args_offset", "kosmos_params_offset"):
        getattr(lib, f).argtypes = [C.c_int]
        getattr(lib, f).restype = C.c_long
    lib.kosmos_last_error.restype = C.c_char_p
    lib.kosmos_max_wgs.argtypes = [C.c_int, C.c_int, C.POINTER(C.c_int)]
    lib.kosmos_launch.argtypes = [C.POINTER(Params), P]
    lib.kosmos_host_device_ptr.argtypes = [P, C.POINTER(P)]
    lib.kosmos_alloc_mapped.argtypes = [C.c_uint64, C.POINTER(P), C.POINTER(P)]
    lib.kosmos_free_mapped.argtypes = [P]
    lib.kosmos_smem_bytes.argtypes = [C.c_int]
    lib.kosmos_stream_write_u32.argtypes = [P, P, C.c_uint32]
    lib.kosmos_stream_create.argtypes = [C.POINTER(P)]
    lib.kosmos_stream_destroy.argtypes = [P]
    U64 = C.POINTER(C.c_uint64)
    U32 = C.POINTER(C.c_uint32)
    lib.kosmos_ce_plan_create.argtypes = [P, P, C.c_int, U64, U64, U64, U64, U64, U64, U32, U32, C.c_int, C.c_int]
    lib.kosmos_ce_plan_create.restype = P
    lib.kosmos_ce_plan_set_waits.argtypes = [P, C.c_int, U64, U32]
    lib.kosmos_ce_plan_begin.argtypes = [P, P, C.c_uint32]
    lib.kosmos_ce_plan_end.argtypes = [P, P, C.c_uint32]
    lib.kosmos_ce_plan_destroy.argtypes = [P]
    lib.kosmos_ce_plan_destroy.restype = None
    for f in ("kosmos_max_wgs", "kosmos_launch", "kosmos_host_device_ptr", "kosmos_alloc_mapped",
              "kosmos_free_mapped", "kosmos_smem_bytes", "kosmos_stream_write_u32", "kosmos_stream_create",
              "kosmos_stream_destroy", "kosmos_ce_plan_set_waits", "kosmos_ce_plan_begin", "kosmos_ce_plan_end"):
        getattr(lib, f).restype = C.c_int
    return lib


def layout_mismatches(lib: C.CDLL) -> list[str]:
    """RankArgs / Params fields whose offsets differ from the main library's C structs ([]: none)."""
    return ([f"RankArgs.{m}" for m in struct_mismatches(RankArgs, lib.kosmos_rank_args_offset)]
            + [f"Params.{m}" for m in struct_mismatches(Params, lib.kosmos_params_offset)])


def struct_mismatches(struct: type, c_offset) -> list[str]:
    """Fields whose offset differs between a ctypes Structure and its C struct, whose offsets
    `c_offset(i)` returns (field i; i = the field count: sizeof): [] when they match."""
    bad = []
    for i, (name, _) in enumerate(struct._fields_):
        c_off = c_offset(i)
        if c_off != getattr(struct, name).offset:
            bad.append(f"{name}: C {c_off}, Python {getattr(struct, name).offset}")
    size = c_offset(len(struct._fields_))
    if size != C.sizeof(struct):
        bad.append(f"sizeof: C {size}, Python {C.sizeof(struct)}")
    return bad


def declare_runner(lib: C.CDLL, prefix: str, set_args: list, validate_args: int, abi_version: int, what: str) -> C.CDLL:
    """The entry points every persistent-kernel runner library exports as ``<prefix>_<name>``
    (the MoE forward's and backward's): version, error, sizes, the args layout, validate,
    create / destroy / set / launch and max_wgs; `set_args` the argtypes of ``_set``, `validate_args`
    the int parameters of ``_validate``. Raises BuildError when the library's ABI is not `abi_version`."""
    Ip = C.c_int
    f = lambda name: getattr(lib, f"{prefix}_{name}")  # noqa: E731
    for name, res in (("abi_version", Ip), ("last_error", C.c_char_p), ("smem_bytes", Ip), ("threads", Ip)):
        f(name).restype = res
    f("args_offset").argtypes, f("args_offset").restype = [Ip], C.c_long
    f("validate").argtypes, f("validate").restype = [Ip] * validate_args, C.c_char_p
    f("create").restype = P
    f("destroy").argtypes, f("destroy").restype = [P], None
    f("set").argtypes, f("set").restype = set_args, Ip
    f("max_wgs").argtypes, f("max_wgs").restype = [Ip, C.POINTER(Ip)], Ip
    f("launch").argtypes, f("launch").restype = [P, P], Ip
    if f("abi_version")() != abi_version:
        raise libs.BuildError(f"{what} ABI {f('abi_version')()} != {abi_version}")
    return lib
