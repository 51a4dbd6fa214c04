#!/usr/bin/env bash
# Device run for the Hopper builder GEMM (issue 4): SASS check, correctness, TFLOP/s vs cuBLAS.
# Run from the repo root on a Hopper machine, with the library prebuilt into .kb-cache/
# (python3 -m kosmos_bench.kernels.sm90_gemm build, on any box with nvcc + nvidia-cutlass):
#   run(command="bash scripts/device_builder.sh", carry=[".kb-cache"])
# Extra arguments go to `python3 -m kosmos_bench.kernels.sm90_gemm all` (e.g. --tokens 8192).
set -o pipefail
OUT=${OUT:-/tmp/kb-builder-out}
mkdir -p "$OUT"
export KOSMOS_BENCH_CACHE="$PWD/.kb-cache" PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
lib=$(python3 -c "from kosmos_bench.kernels import sm90_gemm as s; print(s.find_lib() or '')")
if [ -z "$lib" ]; then echo "no prebuilt library in .kb-cache for these sources"; exit 1; fi
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$lib" > "$OUT/sass.txt" 2>&1
  echo "SASS $lib: HGMMA=$(grep -c HGMMA "$OUT/sass.txt") UTMALDG=$(grep -c UTMALDG "$OUT/sass.txt") LDL/STL=$(grep -cE '\b(LDL|STL)\b' "$OUT/sass.txt")"
fi
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_builder_sm90_gpu.py 2>&1 | tee "$OUT/pytest.txt" | tail -3
timeout 240 python3 -m kosmos_bench.kernels.sm90_gemm all --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
