"""copy: the fabric's copy alone, its bandwidth, and what a GEMM beside it costs it.

Times the point's collective alone (on the host fabric: the peers' pinned shards copied by the
copy engine, kosmos_bench.impls.nccl.comm_alone, the sweep's "copy alone"), its GEMM alone, and
both issued together on two streams without a dependency (the chip's own overlap, the sweep's
eff-cc reference), interleaved. busbw = the collective's bytes x (W-1)/W over the time, GB/s.
--sm also builds and runs scripts/probes/pcie_probe.cu (nvcc, sm_90a): SM 16-byte loads and
TMA bulk copies from pinned host memory against the copy engine, by CTA count.

    python3 scripts/probe.py copy --shape 8192x57344x8192,8192x106496x16384
"""
from __future__ import annotations

from pathlib import Path

from .common import alone, bench, emit, points, prepare, shape_name

PROBE_CU = Path(__file__).resolve().parent / "pcie_probe.cu"


def add_arguments(p) -> None:
    p.add_argument("--sm", action="store_true", help="also run pcie_probe.cu (SM loads / TMA bulk vs copy engine)")
    p.add_argument("--build-dir", default="/tmp/kosmos-probe", help="where --sm builds pcie_probe (default /tmp/kosmos-probe)")


def pcie_probe(build_dir: str) -> None:
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("probe.py copy --sm: nvcc not found (pcie_probe.cu is compiled for sm_90a)")
    exe = Path(build_dir) / "pcie_probe"
    exe.parent.mkdir(parents=True, exist_ok=True)
    csrc = PROBE_CU.parents[2] / "csrc"
    subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", f"-I{csrc}", str(PROBE_CU),
                    "-o", str(exe)], check=True)
    print("\n# pcie_probe: SM loads / TMA bulk copies / copy engine, pinned host -> device")
    subprocess.run([str(exe)], check=True)


def run(args) -> int:
    import torch

    from kosmos_bench.impls import nccl
    from kosmos_bench.ops import get_op

    rows = []
    print(f"{'shape':>20s} {'W':>3s} {'copy(us)':>10s} {'busbw':>7s} {'gemm(us)':>10s} {'both(us)':>10s} "
          f"{'copy+gemm eff':>13s}")
    for p in points(args):
        prep = prepare(p, runner=False)
        try:
            fns = alone(prep)
            if "copy" not in fns:
                raise SystemExit(f"probe.py copy: {shape_name(p)} at world {p.world} has no collective")
            fns["both"] = nccl.concurrent_alone(fns["gemm"], fns["copy"], prep.ctx.device)
            t = bench(fns, p, prep.ctx.device)
        finally:
            prep.close()
            torch.cuda.empty_cache()
        moved = get_op(p.op).comm_bytes(p) * (p.world - 1) / p.world
        gbs = moved / t["copy"] / 1e3
        eff = max(t["copy"], t["gemm"]) / t["both"]
        print(f"{shape_name(p):>20s} {p.world:3d} {t['copy']:10.1f} {gbs:7.1f} {t['gemm']:10.1f} {t['both']:10.1f} {eff:13.3f}")
        rows.append({"key": p.key(), "op": p.op, "M": p.M, "N": p.N, "K": p.K, "world": p.world, "fabric": p.fabric,
                     "t_comm_us": t["copy"], "busbw_gbs": gbs, "t_gemm_us": t["gemm"], "t_concurrent_us": t["both"]})
    emit(args, "copy", rows)
    if args.sm:
        pcie_probe(args.build_dir)
    return 0
