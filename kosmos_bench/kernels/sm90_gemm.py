"""Hopper builder GEMM, standalone (world=1): lazy build, ctypes loading, check and bench.

The kernel (`csrc/gemm_sm90.cu` over `csrc/kosmos/builder_sm90.cuh`) is a persistent
wgmma + TMA GEMM whose CTAs claim output tiles from an atomic counter: the builder role of the
fused KOSMOS kernels without the movers. It is built into a torch-free shared library with a
C ABI (CUDA runtime linked statically), so a library built on a CPU box with nvcc loads on a
GPU machine with another Python.

Built, cached and loaded by :mod:`kosmos_bench.kernels.libs` (``libs.SM90_GEMM``: same cache
directories and hashing rules as every library of csrc/). Building needs nvcc and the
CUTLASS/CuTe headers of the ``nvidia-cutlass`` pip package (or ``$KOSMOS_CUTLASS_INCLUDE``).

Command line (GPU): ``python3 -m kosmos_bench.kernels.sm90_gemm {build,check,bench}``.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from . import libs
from .libs import cutlass_include  # noqa: F401 - part of this module's API

LIB = libs.SM90_GEMM
# Compiled variants (csrc/gemm_sm90.cu): index -> description. 0 is the default.
VARIANTS = {
    0: "128x256x64 4-stage, staged epilogue",
    1: "128x256x64 3-stage, staged epilogue",
    2: "128x256x64 4-stage, direct epilogue",
    3: "128x256x64 4-stage, staged epilogue, 2-CTA clusters (B multicast, static schedule)",
}

# The TP+SP layer GEMMs of llama3-8b/70b/405b and gpt3-175b, as (K, N); M = tokens.
LAYER_KN = (
    (4096, 6144), (4096, 28672), (14336, 4096),
    (8192, 10240), (8192, 57344), (28672, 8192),
    (16384, 18432), (16384, 106496), (53248, 16384),
    (12288, 36864), (12288, 98304), (49152, 12288),
)
TOKENS = (4096, 8192, 16384)


# ------------------------------------------------------------------------------ validation
def validate_shape(M: int, N: int, K: int) -> str | None:
    """None when the kernel supports (M, N, K), else the reason (mirrors Builder::validate)."""
    if M <= 0 or N <= 0 or K <= 0:
        return "sm90 builder: M, N, K must be positive"
    if K % 8:
        return "sm90 builder: K must be a multiple of 8 (TMA: A's row stride must be 16-byte aligned)"
    if N % 8:
        return "sm90 builder: N must be a multiple of 8 (TMA: B's and C's row stride must be 16-byte aligned)"
    return None


# ------------------------------------------------------------------------------------ build
# Build, cache, load: kernels/libs.py (compile-check: check(), no GPU needed).
source_hash, lib_name, find_lib, check = LIB.source_hash, LIB.lib_name, LIB.find_lib, LIB.check


def build(out_dir: Path | None = None, force: bool = False, verbose: bool = False) -> Path:
    """Compile the shared library (no GPU needed) and return its path."""
    res = LIB.build(force=force, out_dir=out_dir)
    if verbose:
        print(res.log, file=sys.stderr)
    return res.path


def _declare(lib: ctypes.CDLL) -> None:
    lib.kb_sm90_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_void_p]
    lib.kb_sm90_gemm.restype = ctypes.c_int
    lib.kb_sm90_last_error.restype = ctypes.c_char_p
    lib.kb_sm90_validate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.kb_sm90_validate.restype = ctypes.c_char_p
    lib.kb_sm90_config.argtypes = [ctypes.POINTER(ctypes.c_int)]


def load(build_if_missing: bool = True) -> ctypes.CDLL:
    return LIB.load(declare=_declare, build_if_missing=build_if_missing)


def config() -> dict:
    arr = (ctypes.c_int * 6)()
    load().kb_sm90_config(arr)
    return dict(zip(("BM", "BN", "BK", "stages", "threads", "smem_bytes"), list(arr)))


def available() -> tuple[bool, str]:
    """(True, '') when a Hopper GPU is present and the library loads (or can be built)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return False, f"needs compute capability 9.0 (sm_90a), device has {cap[0]}.{cap[1]}"
    try:
        load()
    except Exception as e:  # noqa: BLE001 — report why, never hide it
        return False, f"sm90 GEMM library unavailable: {e}"
    return True, ""


# ----------------------------------------------------------------------------------- call
def gemm(A, B, out=None, group_m: int = 8, max_ctas: int = 0, variant: int = 0):
    """C = A @ B on the Hopper builder.

    A: (M, K) bf16, row-major contiguous, CUDA. B: (K, N) bf16, row-major contiguous.
    out: optional (M, N) bf16 contiguous. Returns out. Launches on torch's current stream.
    group_m: tile raster (row bands per group); max_ctas: cap on the grid (0 = #SMs);
    variant: a key of VARIANTS.
    """
    import torch
    if A.dtype != torch.bfloat16 or B.dtype != torch.bfloat16:
        raise TypeError("sm90 gemm: A and B must be bf16")
    if A.dim() != 2 or B.dim() != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"sm90 gemm: bad shapes {tuple(A.shape)} @ {tuple(B.shape)}")
    if not (A.is_contiguous() and B.is_contiguous()):
        raise ValueError("sm90 gemm: A and B must be contiguous (row-major)")
    M, K = A.shape
    N = B.shape[1]
    why = validate_shape(M, N, K)
    if why:
        raise ValueError(why)
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=A.device)
    elif out.shape != (M, N) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError("sm90 gemm: out must be a contiguous (M, N) bf16 tensor")
    lib = load()
    stream = torch.cuda.current_stream(A.device).cuda_stream
    rc = lib.kb_sm90_gemm(A.data_ptr(), B.data_ptr(), out.data_ptr(), M, N, K, group_m, max_ctas, variant,
                          stream)
    if rc != 0:
        raise RuntimeError(f"kb_sm90_gemm failed ({rc}): {lib.kb_sm90_last_error().decode()}")
    return out


# ------------------------------------------------------------------------ check and bench
def check_one(M: int, N: int, K: int, seed: int = 0, group_m: int = 8, variant: int = 0) -> dict:
    """One correctness check against torch.matmul in fp32 on fresh random inputs.

    Output poisoned with NaN first; returns counts of unwritten (NaN) and wrong elements and
    the relative error norm. Tolerance per element: 2e-2 * (|ref| + rms(ref)).
    """
    import torch
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    A = torch.randn((M, K), generator=g, device="cuda").to(torch.bfloat16)
    B = torch.randn((K, N), generator=g, device="cuda").to(torch.bfloat16)
    C = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(A, B, out=C, group_m=group_m, variant=variant)
    torch.cuda.synchronize()
    ref = A.float() @ B.float()
    out = C.float()
    rms = ref.pow(2).mean().sqrt()
    tol = 2e-2 * (ref.abs() + rms)
    nan = int(torch.isnan(out).sum())
    wrong = int(((out - ref).abs() > tol).sum()) + nan
    rel = float((out.nan_to_num(0) - ref).norm() / ref.norm())
    # determinism: a second call on the same inputs must give the same bits
    C2 = torch.full_like(C, float("nan"))
    gemm(A, B, out=C2, group_m=group_m, variant=variant)
    torch.cuda.synchronize()
    same = bool(torch.equal(C.view(torch.int16), C2.view(torch.int16)))
    return {"variant": variant, "M": M, "N": N, "K": K, "nan": nan, "wrong": wrong, "rel_err": rel, "bitwise_repeat": same}


def bench_one(M: int, N: int, K: int, warmup: int = 5, reps: int = 20, group_m: int = 8,
              flush_bytes: int = 256 << 20, extra: tuple = ()) -> dict:
    """TFLOP/s of ours (variant 0) and torch.matmul on (M, N, K): device events around each
    call, L2 flushed before each timed call, all calls interleaved, median of `reps`.
    extra: more (name, variant, group_m, max_ctas) configurations of ours to time alongside."""
    import statistics

    import torch
    g = torch.Generator(device="cuda")
    g.manual_seed(1234 + M + N + K)
    A = torch.randn((M, K), generator=g, device="cuda").to(torch.bfloat16)
    B = torch.randn((K, N), generator=g, device="cuda").to(torch.bfloat16)
    C_ours = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    C_ref = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device="cuda")
    fns = {
        "kosmos": lambda: gemm(A, B, out=C_ours, group_m=group_m),
        "torch": lambda: torch.matmul(A, B, out=C_ref),
    }
    for name, v, gm, mc in extra:
        fns[name] = (lambda v=v, gm=gm, mc=mc: gemm(A, B, out=C_ours, group_m=gm, variant=v, max_ctas=mc))
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times[name].append(s.elapsed_time(e) * 1e-3)
    flops = 2.0 * M * N * K
    gemm(A, B, out=C_ours, group_m=group_m)
    torch.cuda.synchronize()
    rel = float((C_ours.float() - C_ref.float()).norm() / C_ref.float().norm())
    res = {"M": M, "N": N, "K": K, "rel_vs_cublas": rel}
    for name, ts in times.items():
        med = statistics.median(ts)
        res[f"{name}_ms"] = med * 1e3
        res[f"{name}_tflops"] = flops / med / 1e12
        res[f"{name}_cv"] = statistics.pstdev(ts) / statistics.mean(ts)
    res["ratio"] = res["kosmos_tflops"] / res["torch_tflops"]
    del A, B, C_ours, C_ref, flush
    torch.cuda.empty_cache()
    return res


CHECK_SHAPES = (
    # (M, N, K): full tiles, partial tiles in every dim, primes where TMA allows (M any;
    # N, K multiples of 8), K not a multiple of 64, small and skinny problems
    (256, 256, 64), (1024, 2048, 512), (4096, 6144, 4096),
    (997, 1000, 1000), (1, 8, 8), (131, 264, 72), (3001, 777 * 8, 1000),
    (8191, 4104, 4136), (128, 256, 8), (4099, 256 * 3 + 8, 16384 + 8),
)


def _main(argv: list[str]) -> int:
    import argparse
    import json
    import math

    ap = argparse.ArgumentParser(prog="python3 -m kosmos_bench.kernels.sm90_gemm")
    ap.add_argument("cmd", choices=("build", "check", "bench", "all"))
    ap.add_argument("--out", default=None, help="directory for the JSON lines log")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--group-m", type=int, default=8)
    ap.add_argument("--extra", default="",
                    help="more configs of ours: name:variant:group_m[:max_ctas],... (max_ctas 0 = #SMs)")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(build(verbose=True))
        return 0
    ok, why = available()
    if not ok:
        print(f"sm90 gemm unavailable: {why}")
        return 1
    import torch
    log = open(Path(args.out) / "sm90_gemm.jsonl", "a") if args.out else None

    def emit(rec):
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()

    print(f"# device {torch.cuda.get_device_name()} | torch {torch.__version__} | config {config()}")
    status = 0
    if args.cmd in ("check", "all"):
        print(f"# {'M':>6} {'N':>6} {'K':>6} {'nan':>8} {'wrong':>8} {'rel_err':>9} repeat")
        cases = [(0, s) for s in CHECK_SHAPES] + [(v, s) for v in VARIANTS if v for s in CHECK_SHAPES[::3]]
        for i, (v, (M, N, K)) in enumerate(cases):
            r = check_one(M, N, K, seed=i, variant=v)
            emit({"kind": "check", **r})
            bad = r["wrong"] > 0 or not r["bitwise_repeat"] or not math.isfinite(r["rel_err"]) or r["rel_err"] > 1e-2
            status |= int(bad)
            print(f"  {M:>6} {N:>6} {K:>6} {r['nan']:>8} {r['wrong']:>8} {r['rel_err']:>9.2e} "
                  f"{r['bitwise_repeat']} v{v} {'FAIL' if bad else 'ok'}", flush=True)
        for M, N, K in ((128, 1001, 64), (128, 256, 100)):
            try:
                gemm(torch.ones(M, K, dtype=torch.bfloat16, device="cuda"),
                     torch.ones(K, N, dtype=torch.bfloat16, device="cuda"))
                print(f"  reject {M}x{N}x{K}: NOT rejected  FAIL")
                status |= 1
            except ValueError as e:
                print(f"  reject {M}x{N}x{K}: {e}  ok")
    if args.cmd in ("bench", "all"):
        rows = []
        extra = []
        for e in filter(None, args.extra.split(",")):
            f = e.split(":")
            extra.append((f[0], int(f[1]), int(f[2]), int(f[3]) if len(f) > 3 else 0))
        for T in (int(t) for t in args.tokens.split(",")):
            for K, N in LAYER_KN:
                r = bench_one(T, N, K, warmup=args.warmup, reps=args.reps, group_m=args.group_m,
                              extra=tuple(extra))
                emit({"kind": "bench", **r})
                rows.append(r)
                more = " ".join(f"{n} {r[n + '_tflops']:6.1f}" for n, *_ in extra)
                print(f"  M={T:>6} N={N:>6} K={K:>6} ours {r['kosmos_tflops']:6.1f} cublas "
                      f"{r['torch_tflops']:6.1f} ratio {r['ratio']:.3f} rel {r['rel_vs_cublas']:.1e} {more}",
                      flush=True)
        print(f"\n# {'M':>6} {'N':>6} {'K':>6} {'ours':>7} {'cuBLAS':>7} {'ratio':>6}")
        for r in rows:
            print(f"  {r['M']:>6} {r['N']:>6} {r['K']:>6} {r['kosmos_tflops']:7.1f} {r['torch_tflops']:7.1f} "
                  f"{r['ratio']:6.3f}")
        for n, *_ in extra:
            g = math.exp(sum(math.log(r[n + "_tflops"] / r["torch_tflops"]) for r in rows) / len(rows))
            print(f"# {n}: geomean ratio {g:.3f}")
        gm = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
        worst = min(rows, key=lambda r: r["ratio"])
        print(f"# geomean ratio {gm:.3f} over {len(rows)} shapes; worst {worst['ratio']:.3f} at "
              f"{worst['M']}x{worst['N']}x{worst['K']}; target >= 0.90 geomean, >= 0.80 each")
        emit({"kind": "summary", "geomean_ratio": gm, "worst_ratio": worst["ratio"], "n": len(rows)})
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
