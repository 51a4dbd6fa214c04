#!/usr/bin/env bash
# carry=[".kb-cache"]: the SM-streamed tail (KOSMOS_CE_SM_TAIL, AG_PULL_K): the GPU tests of the
# kosmos kernels (TESTS_K selects; default all of tests/test_kosmos_gpu.py), then the tail probe
# (scripts/device_tail_probe.py: total = span of the engine's copies + what follows) on 70b FC1
# 8k / 16k, fresh process per variant. With the SM tail, "tail" includes the SMs' pulls.
source scripts/_device_env.sh  # set -uo pipefail, .kb-cache, $OUT, pip install -e .
timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider tests/test_kosmos_gpu.py \
    ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -${TESTS_TAIL:-3}
export OUT
G16="KOSMOS_BAND_GROUP=16;KOSMOS_BAND_RAMP=0"
B2B_SCRIPT=device_tail_probe.py B2B_REPS=${B2B_REPS:-30} B2B_VARIANTS=${B2B_VARIANTS:-"def: g16r0:$G16 \
sm8:KOSMOS_CE_SM_TAIL=8:16 g16sm8:$G16;KOSMOS_CE_SM_TAIL=8:16 g16sm4:$G16;KOSMOS_CE_SM_TAIL=4:16 \
g16sm12:$G16;KOSMOS_CE_SM_TAIL=12:16 g16sm8s32:$G16;KOSMOS_CE_SM_TAIL=8:32 def2:"} \
    timeout ${PROBE_TIMEOUT:-400} bash scripts/device_b2b_variants.sh
