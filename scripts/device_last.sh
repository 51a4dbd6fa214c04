#!/usr/bin/env bash
# Last device call of the session: the determinism of every policy x queue order over 20
# calls (tests/test_kosmos_gpu.py), the Hopper builder's GPU tests at its latest commit, and
# the builder micro-sweep through the CLI (sweeps/builder-quick.yaml). carry=[".kb-cache"].
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kosmos_gpu.py tests/test_builder_sm90_gpu.py 2>&1 | tail -15
timeout 150 kosmos-bench sweep builder-quick -o "$OUT/r" | tail -22
(cd "$OUT/r" && tar czf "$OUT/builder.tgz" */points */manifest.json)
