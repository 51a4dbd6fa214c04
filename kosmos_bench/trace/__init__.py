"""Role timelines: decode, idle-window analysis, Perfetto export, external profilers.

    summarize(trace_df) -> dict          idle/busy columns joined to the point's result row
    idle_windows(trace_df) -> DataFrame  maximal idle intervals per WG
    kind_summary(trace_df) -> DataFrame  per item kind (MoE kernels): items, time per WG, first / last
    to_perfetto(trace_df, path, meta)    Chrome trace-event JSON (ui.perfetto.dev)
    decode(records, counts, ...)         raw per-WG kernel buffers -> trace DataFrame
    assign_lanes(trace_df)               lanes of a trace whose WGs run several agents at once (MoE)
    torch_profile, gpu_work_per_range, rocprofv3_available, run_under_rocprofv3, ingest_rocprofv3
"""
from __future__ import annotations

from .analysis import (BASE_COLUMNS, ROLE_CLASS, ROLE_CODES, ROLES, TRACE_RECORD_DTYPE, USEFUL_ROLES, assign_lanes, clean,
                       decode, idle_windows, kind_summary, role_class, summarize)
from .perfetto import perfetto_events, to_perfetto, validate_perfetto
from .profilers import gpu_work_per_range, ingest_rocprofv3, rocprofv3_available, run_under_rocprofv3, torch_profile

__all__ = [
    "BASE_COLUMNS", "ROLE_CLASS", "ROLE_CODES", "ROLES", "TRACE_RECORD_DTYPE", "USEFUL_ROLES", "assign_lanes", "clean", "decode",
    "idle_windows", "kind_summary", "role_class", "summarize",
    "perfetto_events", "to_perfetto", "validate_perfetto",
    "gpu_work_per_range", "ingest_rocprofv3", "rocprofv3_available", "run_under_rocprofv3", "torch_profile",
]
