#!/usr/bin/env python3
"""Device check of the optional baselines on a one-GPU machine (self-contained, bounded).

    python3 scripts/device_baselines.py [--timeout 180] [--no-pair] [--no-cli] [--out DIR]

1. Prints ``optional_status()`` (symm-mem, te-ub, flux, deepep: available, why, version),
   the skip reasons the harness gives symm-mem at world 1 and on the host fabric, and the
   output of ``kosmos-bench doctor`` and ``kosmos-bench list`` (each bounded to 120 s).
2. Stage ``world1``: a single-process NCCL group (FileStore, world_size=1) and symm-mem's
   real prepare/run path on ag-gemm and gemm-rs (a regular and an awkward shape, bf16):
   poisoned outputs, two calls, compared with the op's fp32 reference and with each other
   (bitwise), then timed beside torch.matmul of the same local GEMM. At world 1 there is no
   communication: the time difference is the op's own overhead (barriers, extra stream, copy).
3. Stage ``pair`` (extra, correctness only): two processes on the same GPU, gloo group,
   ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``, W=2: checks the multi-rank layouts (gather
   bands, reduce-scatter bands) with real symmetric memory. Timings would be meaningless
   (two ranks share one GPU) and are not taken. A failure here is reported, not fatal.

Every stage runs in its own process session under a timeout and is killed if it overruns,
so the script cannot hang. The last line starts with ``SUMMARY``. Exit 0 when symm-mem runs
correctly or explains why it cannot; 1 when a result is wrong or a stage hung.
Full JSON goes to DIR/device_baselines.json (DIR defaults to $OUT when set).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# NVLink multicast stays off (only filled in when unset; never switched on).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

WORLD1_CASES = [("ag-gemm", 1024, 1536, 2048), ("ag-gemm", 527, 389, 263),
                ("gemm-rs", 1024, 1536, 2048), ("gemm-rs", 527, 389, 263)]
PAIR_CASES = [("ag-gemm", 1024, 1536, 2048), ("ag-gemm", 526, 394, 262),
              ("gemm-rs", 1024, 1536, 2048), ("gemm-rs", 526, 394, 262)]
RESULT_TAG = "RESULT "


def _first_line(e: BaseException) -> str:
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg}"[:400]


# ------------------------------------------------------------------ one case (both stages)


def run_case(impl, p, ctx, timed: bool) -> dict:
    """prepare -> poisoned check x2 -> optional timing; returns this rank's result."""
    import torch

    from kosmos_bench import timing
    from kosmos_bench.ops import get_op
    from kosmos_bench.ops.base import check_output

    op = get_op(p.op)
    r = ctx.rank
    inputs, A, B = op.inputs(p, [r], ctx.device, seed=1234)
    t0 = time.monotonic()
    runner = impl.prepare(p, ctx, inputs)
    prep_s = time.monotonic() - t0
    try:
        outs = []
        for _ in range(2):
            for o in runner.outputs.values():
                o.fill_(float("nan"))
            runner.run()
            torch.cuda.synchronize()
            outs.append(runner.outputs[r].clone())
        wrong, err = check_output(outs[0], op.reference(A, B, r, p.world), p.dtype)
        same = bool(torch.equal(outs[0], outs[1]))
        res = {"wrong": wrong, "max_rel_err": err, "deterministic": same, "prepare_s": round(prep_s, 3),
               "info": dict(getattr(runner, "info", {}) or {})}
        if timed:
            t_impl = timing.bench(runner.run, device=ctx.device, warmup=5, reps=20)
            if p.op == "ag-gemm":  # the same local GEMM: gathered A (M x K) @ B_r (K x N/W)
                a_full, b_loc = A.contiguous(), inputs.B[r]
            else:  # A_r (M x K/W) @ B_r (K/W x N)
                a_full, b_loc = inputs.A[r], inputs.B[r]
            c = torch.empty(a_full.shape[0], b_loc.shape[1], dtype=a_full.dtype, device=ctx.device)
            t_mm = timing.bench(lambda: torch.matmul(a_full, b_loc, out=c), device=ctx.device, warmup=5, reps=20)
            res.update(t_us=float(sorted(t_impl)[len(t_impl) // 2]), t_matmul_us=float(sorted(t_mm)[len(t_mm) // 2]))
        return res
    finally:
        runner.close()


# ------------------------------------------------------------------ stage children


def child_world1(store_dir: str) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from kosmos_bench.impls import get_impl
    from kosmos_bench.impls.base import RankCtx
    from kosmos_bench.point import Point

    impl = get_impl("symm-mem")
    ok, why = impl.available("gpu")
    print(f"  symm-mem available('gpu'): {ok} {why}", flush=True)
    if not ok:
        return {"stage": "world1", "status": "unavailable", "why": why}
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    print(f"  torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, NCCL {torch.cuda.nccl.version()}", flush=True)
    try:
        dist.init_process_group("nccl", init_method=f"file://{store_dir}/world1.store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60), device_id=dev)
    except Exception as e:  # noqa: BLE001 -- the reason is the result
        return {"stage": "world1", "status": "failed", "why": f"NCCL world-1 group: {_first_line(e)}"}
    cases = []
    try:
        for op_name, M, N, K in WORLD1_CASES:
            p = Point(op=op_name, impl="symm-mem", M=M, N=N, K=K, world=1, dtype="bf16",
                      fabric="nvlink", backend="gpu")
            ctx = RankCtx(rank=0, world=1, procs=1, device=dev, fabric="nvlink", backend="gpu",
                          group=dist.group.WORLD)
            case = {"op": op_name, "M": M, "N": N, "K": K}
            try:
                case.update(run_case(impl, p, ctx, timed=True))
                case["status"] = "ok" if case["wrong"] == 0 else "wrong"
            except Exception as e:  # noqa: BLE001 -- the reason is the result
                case.update(status="failed", why=_first_line(e))
            print("  " + _case_line(case), flush=True)
            cases.append(case)
    finally:
        dist.destroy_process_group()
    statuses = {c["status"] for c in cases}
    status = "ok" if statuses == {"ok"} else ("wrong" if "wrong" in statuses else "failed")
    return {"stage": "world1", "status": status, "cases": cases}


def _pair_worker(rank: int, store_dir: str, q) -> None:
    """One of two ranks on GPU 0; always reports its cases (a setup failure is a case too)."""
    cases = []
    try:
        import datetime

        import torch
        import torch.distributed as dist

        from kosmos_bench.impls import get_impl
        from kosmos_bench.impls.base import RankCtx
        from kosmos_bench.point import Point

        os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        dist.init_process_group("gloo", init_method=f"file://{store_dir}/pair.store", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        impl = get_impl("symm-mem")
        try:
            for op_name, M, N, K in PAIR_CASES:
                p = Point(op=op_name, impl="symm-mem", M=M, N=N, K=K, world=2, dtype="bf16",
                          fabric="nvlink", backend="gpu")
                ctx = RankCtx(rank=rank, world=2, procs=2, device=dev, fabric="nvlink", backend="gpu",
                              group=dist.group.WORLD)
                case = {"op": op_name, "M": M, "N": N, "K": K, "rank": rank}
                try:
                    case.update(run_case(impl, p, ctx, timed=False))
                    case["status"] = "ok" if case["wrong"] == 0 else "wrong"
                except Exception as e:  # noqa: BLE001 -- the reason is the result
                    case.update(status="failed", why=_first_line(e))
                print(f"  [rank {rank}] " + _case_line(case), flush=True)
                cases.append(case)
                if case["status"] == "failed":
                    break  # a failed collective leaves the peer out of step; stop here
        finally:
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 -- the reason is the result
        cases.append({"op": "setup", "M": 0, "N": 0, "K": 0, "rank": rank, "status": "failed",
                      "why": _first_line(e)})
        print(f"  [rank {rank}] setup FAILED {_first_line(e)}", flush=True)
    finally:
        q.put(cases)


def child_pair(store_dir: str) -> dict:
    import queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_pair_worker, args=(r, store_dir, q)) for r in range(2)]
    for p in procs:
        p.start()
    per_rank = []
    while len(per_rank) < len(procs):  # the parent's stage timeout bounds this loop
        try:
            per_rank.append(q.get(timeout=2))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead and q.empty():
                time.sleep(2)
                if q.empty():
                    per_rank.append([{"op": "setup", "M": 0, "N": 0, "K": 0, "status": "failed",
                                      "why": f"a rank process died (exit codes {[p.exitcode for p in procs]})"}])
                    break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    cases = []
    for idx in range(max(len(c) for c in per_rank)):
        rows = [c[idx] for c in per_rank if idx < len(c)]
        case = {k: rows[0][k] for k in ("op", "M", "N", "K")}
        st = {r["status"] for r in rows}
        case["status"] = "ok" if st == {"ok"} and len(rows) == 2 else ("wrong" if "wrong" in st else "failed")
        case["wrong"] = sum(r.get("wrong", 0) for r in rows)
        case["max_rel_err"] = max((r.get("max_rel_err", 0.0) for r in rows), default=0.0)
        case["deterministic"] = all(r.get("deterministic", False) for r in rows)
        whys = [r["why"] for r in rows if r.get("why")]
        if whys:
            case["why"] = whys[0]
        if case["status"] != "ok" and not whys and len(rows) < 2:
            case["why"] = "only one rank reported this case"
        cases.append(case)
    statuses = {c["status"] for c in cases}
    status = "ok" if statuses == {"ok"} else ("wrong" if "wrong" in statuses else "failed")
    return {"stage": "pair", "status": status, "cases": cases}


def _case_line(c: dict) -> str:
    shape = f"{c['op']:<8} {c['M']:>5}x{c['N']:>5}x{c['K']:>5}"
    if c["status"] == "failed":
        return f"{shape}  FAILED  {c.get('why', '')}"
    line = (f"{shape}  {c['status']:<5} wrong={c['wrong']:<4} max_rel_err={c['max_rel_err']:.2e} "
            f"deterministic={c['deterministic']}")
    if "t_us" in c:
        line += f"  t={c['t_us']:8.1f} us  matmul alone={c['t_matmul_us']:8.1f} us"
    return line


# ------------------------------------------------------------------ parent


def run_stage(name: str, timeout: float, store_dir: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--store", store_dir]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # this stage's own process session only
        out, _ = proc.communicate()
    wall = time.monotonic() - t0
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
        else:
            print(line)
    if timed_out:
        return {"stage": name, "status": "timeout", "why": f"no result within {timeout:.0f} s; stage killed",
                "wall_s": round(wall, 1)}
    if result is None:
        tail = [l for l in out.splitlines() if l.strip()][-1:] or ["no output"]
        return {"stage": name, "status": "failed", "why": f"exit code {proc.returncode}: {tail[0][:300]}",
                "wall_s": round(wall, 1)}
    result["wall_s"] = round(wall, 1)
    return result


def run_cli(cmd: str, timeout: float) -> str:
    """`kosmos-bench <cmd>` through the package (no console script needed); returns 'ok'/reason."""
    code = f"import sys; sys.argv = ['kosmos-bench', '{cmd}']; from kosmos_bench.cli import main; main()"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="160",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        print(out)
        return f"timeout after {timeout:.0f} s"
    print(out.rstrip())
    return "ok" if proc.returncode == 0 else f"exit code {proc.returncode}"


def _stage_summary(res: dict) -> str:
    st = res["status"]
    if st == "ok":
        return f"ok ({len(res['cases'])}/{len(res['cases'])} cases match the reference)"
    if st in ("unavailable", "timeout") or "cases" not in res:
        return f"{st}: {res.get('why', '')}"
    bad = [c for c in res["cases"] if c["status"] != "ok"]
    first = bad[0]
    return (f"{st} ({len(res['cases']) - len(bad)}/{len(res['cases'])} ok; first bad: {first['op']} "
            f"{first['M']}x{first['N']}x{first['K']}: {first.get('why') or ('wrong=' + str(first.get('wrong')))})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per stage before it is killed")
    ap.add_argument("--no-pair", action="store_true", help="skip the two-processes-on-one-GPU stage")
    ap.add_argument("--no-cli", action="store_true", help="skip `kosmos-bench doctor` and `list`")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for device_baselines.json")
    ap.add_argument("--child", choices=["world1", "pair"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        try:
            res = child_world1(args.store) if args.child == "world1" else child_pair(args.store)
        except Exception as e:  # noqa: BLE001 -- the reason is the result
            res = {"stage": args.child, "status": "failed", "why": _first_line(e)}
        print(RESULT_TAG + json.dumps(res, default=str), flush=True)
        return 0

    import torch

    from kosmos_bench.impls import get_impl
    from kosmos_bench.impls import optional_status
    from kosmos_bench.point import Point

    print("# kosmos-bench device check of the optional baselines")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"# python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}), {gpu}, "
          f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, "
          f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ.get('TORCH_SYMM_MEM_DISABLE_MULTICAST')}")
    status = optional_status("gpu")
    print(f"# {'impl':<9} {'available':<9} {'version':<16} why")
    for s in status:
        print(f"  {s['name']:<9} {('yes' if s['available'] else 'no'):<9} {str(s['version']):<16} {s['why']}")
    symm = get_impl("symm-mem")
    for fabric, world in (("nvlink", 1), ("host", 8)):
        p = Point(op="ag-gemm", impl="symm-mem", M=1024, N=1024, K=1024, world=world, fabric=fabric, backend="gpu")
        print(f"# harness skip reason, symm-mem fabric={fabric} world={world}: {symm.unsupported(p)}")

    report = {"optional_status": status, "stages": [], "cli": {}}
    if not args.no_cli:
        for cmd in ("doctor", "list"):
            print(f"# kosmos-bench {cmd}")
            report["cli"][cmd] = run_cli(cmd, 120.0)
    with tempfile.TemporaryDirectory(prefix="kb-devbase-") as store_dir:
        print(f"# stage world1: symm-mem in a single-process NCCL group (timeout {args.timeout:.0f} s)")
        w1 = run_stage("world1", args.timeout, store_dir)
        report["stages"].append(w1)
        pair = None
        if not args.no_pair and w1["status"] in ("ok", "wrong"):
            print(f"# stage pair (extra): symm-mem W=2 as two processes on one GPU, gloo group, "
                  f"correctness only (timeout {args.timeout:.0f} s)")
            pair = run_stage("pair", args.timeout, store_dir)
            report["stages"].append(pair)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "device_baselines.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    if w1["status"] == "ok":
        verdict, code = "RUNS", 0
    elif w1["status"] in ("unavailable", "failed"):
        verdict, code = "EXPLAINED", 0
    else:  # wrong or timeout
        verdict, code = "BROKEN", 1
    if pair is not None and pair["status"] in ("wrong", "timeout"):
        code = 1
    others = ", ".join(f"{s['name']} {'yes' if s['available'] else 'no'}" for s in status if s["name"] != "symm-mem")
    pair_s = _stage_summary(pair) if pair is not None else "not run"
    cli_s = ", ".join(f"{k} {v}" for k, v in report["cli"].items()) or "not run"
    print(f"SUMMARY symm-mem {verdict} | world=1: {_stage_summary(w1)} | W=2 on one GPU (extra): {pair_s} "
          f"| optional: {others} | cli: {cli_s}")
    return code


if __name__ == "__main__":
    sys.exit(main())
