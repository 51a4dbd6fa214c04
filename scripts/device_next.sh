#!/usr/bin/env bash
# carry=[".kb-cache"]: this session's device calls (2026-12-03 15:29 session); call 5:
# does the waiting CTAs' flag spin cost energy? kosmos and both (cuBLAS + copy, no dependency)
# back to back at the power limit, flag-spin sleep 32 ns (default) vs 8192 ns, fresh process
# each, 405b FC1 8k and 70b FC1 8k -> OUT/b2b/energy.parquet.
B2B_SCRIPT=device_energy_probe.py B2B_LINES=6 ENERGY_FNS=kosmos,both B2B_SHAPES=8192x106496x16384,8192x57344x8192 \
    B2B_VARIANTS="spin32: spin8192:KOSMOS_SPIN_NS=8192" bash scripts/device_b2b_variants.sh
