#!/usr/bin/env bash
# carry=[".kb-cache"]: (1) is the copy engine at the PCIe link's limit (engine + SM pulls
# together, scripts/device_pcie_aggregate.py); (2) the head copy on the main stream, A/B in fresh
# processes with the tail probe (the earlier KOSMOS_CE_HEAD_MAIN measurement was void: the head
# never went on main then).
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
(cd scripts && timeout 150 python3 device_pcie_aggregate.py "$OUT/pcie" 8192x57344x8192 2>&1 | grep -v -i warn | tail -26)
OUT=$OUT B2B_SCRIPT=device_tail_probe.py B2B_SHAPES=8192x57344x8192 \
  B2B_VARIANTS="${HEAD_VARIANTS:-def: main:KOSMOS_CE_HEAD_MAIN=1 def2: main2:KOSMOS_CE_HEAD_MAIN=1}" \
  bash scripts/device_b2b_variants.sh
