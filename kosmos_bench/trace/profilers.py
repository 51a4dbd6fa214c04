"""External profilers: torch.profiler (CUPTI on CUDA) and AMD's rocprofv3 kernel trace.

Both end up where the in-kernel traces do: torch.profiler writes its own Chrome trace (open
it in ui.perfetto.dev); rocprofv3's kernel-trace CSV is ingested into the trace schema
(role 'KERNEL', one track per queue/stream) so the same Perfetto export and Gantt apply.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd


def torch_profile(fn: Callable[[], object], out_path: Path | str, steps: int = 3) -> Path:
    """Run `fn` `steps` times under torch.profiler and write its Chrome trace to `out_path`.

    Records CPU activity always and CUDA kernels (CUPTI) when CUDA is available; each call is
    wrapped in a record_function range named 'kosmos-bench step i'. Returns the path.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities, record_shapes=False) as prof:
        for i in range(steps):
            with record_function(f"kosmos-bench step {i}"):
                fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(out_path))
    return out_path


def gpu_work_per_range(trace_path: Path | str, sep: str = "|") -> pd.DataFrame:
    """The GPU work each annotated host range launched, from a torch.profiler Chrome trace.

    A range is a ``record_function`` whose name contains `sep`; its GPU work is every kernel,
    memcpy and memset whose correlation id belongs to a CUDA runtime/driver call issued
    inside the range (so work on any stream counts, and work of other ranges does not).
    One row per range that launched GPU work (times in us on the trace's clock): name,
    host_us (range duration), gpu_start / gpu_end (first start, last end of its work),
    lead_us (smallest GPU start minus the issuing call's host time: small means the GPU
    waited for the host), k_start / k_end (kernels), c_start / c_end and
    n_copies (memcpys), n_kernels.
    """
    import json
    from collections import defaultdict

    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and sep in e.get("name", "")]
    calls = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "correlation" in e.get("args", {})), key=lambda e: e["ts"])
    call_ts = np.array([c["ts"] for c in calls], dtype=float)
    by_corr = defaultdict(list)
    for g in events:
        if g.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            by_corr[g.get("args", {}).get("correlation")].append(g)
    rows = []
    for a in ranges:
        lo = int(np.searchsorted(call_ts, a["ts"], side="left"))
        hi = int(np.searchsorted(call_ts, a["ts"] + a["dur"], side="right"))
        work = [(c, g) for c in calls[lo:hi] for g in by_corr.get(c["args"]["correlation"], [])]
        if not work:
            continue
        kern = [g for _, g in work if g["cat"] == "kernel"]
        cps = [g for _, g in work if g["cat"] == "gpu_memcpy"]
        rows.append(dict(name=a["name"], host_us=float(a["dur"]), gpu_start=min(g["ts"] for _, g in work),
                         gpu_end=max(g["ts"] + g["dur"] for _, g in work),
                         lead_us=min(g["ts"] - c["ts"] for c, g in work),
                         k_start=min((g["ts"] for g in kern), default=np.nan),
                         k_end=max((g["ts"] + g["dur"] for g in kern), default=np.nan),
                         c_start=min((g["ts"] for g in cps), default=np.nan),
                         c_end=max((g["ts"] + g["dur"] for g in cps), default=np.nan),
                         n_copies=len(cps), n_kernels=len(kern)))
    return pd.DataFrame(rows)


def rocprofv3_available() -> tuple[bool, str]:
    """(True, path) when `rocprofv3` is on PATH, else (False, why)."""
    exe = shutil.which("rocprofv3")
    if exe is None:
        return False, "rocprofv3 is not on PATH (it ships with ROCm: /opt/rocm/bin/rocprofv3; ROCm GPUs only)"
    return True, exe


def run_under_rocprofv3(cmd: list[str], out_dir: Path | str, timeout: float | None = None) -> Path:
    """Run `cmd` under `rocprofv3 --kernel-trace` (CSV output) and return its kernel_trace.csv.

    Raises RuntimeError naming the reason when the tool is absent, the command fails, or no
    kernel trace was written (e.g. the command launched no kernels).
    """
    ok, why = rocprofv3_available()
    if not ok:
        raise RuntimeError(why)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    full = [why, "--kernel-trace", "--output-format", "csv", "-d", str(out_dir), "-o", "kosmos", "--", *cmd]
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    (out_dir / "rocprofv3.log").write_text(f"$ {' '.join(full)}\n{proc.stdout}\n{proc.stderr}")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"rocprofv3 exited {proc.returncode}: {' | '.join(tail)} (log: {out_dir / 'rocprofv3.log'})")
    found = sorted(out_dir.rglob("*kernel_trace.csv"), key=os.path.getmtime)
    if not found:
        raise RuntimeError(f"rocprofv3 wrote no *kernel_trace.csv under {out_dir} (did the command launch kernels?)")
    return found[-1]


# Columns of rocprofv3's kernel_trace.csv that the ingest needs; the others (Kind, Thread_Id,
# Kernel_Id, Correlation_Id, register / LDS / scratch sizes, workgroup and grid sizes, which
# vary between ROCm releases) are kept as they are in extra columns.
_ROCPROF_REQUIRED = ("Agent_Id", "Kernel_Name", "Start_Timestamp", "End_Timestamp")


def _agent_number(v) -> int:
    s = str(v).strip()
    digits = "".join(ch for ch in s if ch.isdigit())
    return int(digits) if digits else -1


def ingest_rocprofv3(path: Path | str) -> pd.DataFrame:
    """rocprofv3 kernel_trace.csv -> trace DataFrame.

    rank  = index of the record's agent (GPU) among the agents in the file, in agent order
    wg    = index of its queue (Stream_Id when present and non-zero, else Queue_Id) on that agent
    sm    = -1;  role = 'KERNEL';  item = index of the kernel name in order of first appearance
    t0_ns, t1_ns = Start_Timestamp, End_Timestamp (ns)
    Extra columns: kernel_name, dispatch_id, agent_id, queue_id, grid_size, workgroup_size.
    """
    raw = pd.read_csv(path)
    missing = [c for c in _ROCPROF_REQUIRED if c not in raw.columns]
    if missing:
        raise ValueError(f"{path}: not a rocprofv3 kernel trace, missing column(s) {missing}; "
                         f"has {list(raw.columns)}")
    if "Kind" in raw.columns:
        raw = raw[raw["Kind"].astype(str).str.upper().str.contains("KERNEL")]
    raw = raw.sort_values("Start_Timestamp", kind="stable").reset_index(drop=True)
    agent_num = raw["Agent_Id"].map(_agent_number)
    agents = sorted(agent_num.unique())
    rank = agent_num.map({a: i for i, a in enumerate(agents)})
    queue_col = "Queue_Id"
    if "Stream_Id" in raw.columns and (raw["Stream_Id"].fillna(0) != 0).any():
        queue_col = "Stream_Id"
    qid = raw[queue_col] if queue_col in raw.columns else pd.Series(0, index=raw.index)
    wg = np.zeros(len(raw), dtype=np.int64)
    for r in rank.unique():
        sel = (rank == r).to_numpy()
        qs = sorted(pd.unique(qid[sel]))
        wg[sel] = qid[sel].map({q: i for i, q in enumerate(qs)}).to_numpy()
    names = raw["Kernel_Name"].astype(str)
    name_idx = {n: i for i, n in enumerate(pd.unique(names))}

    def _xyz(prefix: str):
        cols = [f"{prefix}_{a}" for a in "XYZ"]
        if all(c in raw.columns for c in cols):
            return raw[cols].astype("int64").astype(str).agg("x".join, axis=1)
        return pd.Series([None] * len(raw), index=raw.index, dtype=object)

    df = pd.DataFrame({
        "rank": rank.astype("int64").to_numpy(),
        "wg": wg,
        "sm": np.full(len(raw), -1, dtype=np.int64),
        "role": "KERNEL",
        "item": names.map(name_idx).astype("int64").to_numpy(),
        "t0_ns": raw["Start_Timestamp"].astype("int64").to_numpy(),
        "t1_ns": raw["End_Timestamp"].astype("int64").to_numpy(),
        "kernel_name": names.to_numpy(),
        "dispatch_id": raw["Dispatch_Id"].astype("int64").to_numpy() if "Dispatch_Id" in raw.columns else -1,
        "agent_id": raw["Agent_Id"].astype(str).to_numpy(),
        "queue_id": qid.astype("int64").to_numpy(),
        "grid_size": _xyz("Grid_Size").to_numpy(),
        "workgroup_size": _xyz("Workgroup_Size").to_numpy(),
    })
    return df
