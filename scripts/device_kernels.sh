#!/usr/bin/env bash
# Device run for the kosmos kernels: load the prebuilt library (.kb-cache, carried) or build,
# run the GPU tests, then the host-fabric benchmark. Logs under $OUT.
#   run(command="bash scripts/device_kernels.sh", carry=[".kb-cache"])
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kosmos-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "from kosmos_bench import kernels; import ctypes; print('lib', kernels.load()._name)" 2>&1 | tee "$OUT/build.log"
KOSMOS_TIMEOUT_S=${KOSMOS_TIMEOUT_S:-2} timeout ${TEST_TIMEOUT:-240} python3 -m pytest ${PYTEST_X--x} -q ${PYTEST_ARGS:-} tests/test_kosmos_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -40
echo "pytest rc=${PIPESTATUS[0]}"
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 scripts/device_kernels.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -45
  echo "bench rc=${PIPESTATUS[0]}"
fi
grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
