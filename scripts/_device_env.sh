# Sourced first by the device scripts (run from the repo root on the device machine): strict-ish
# shell, the prebuilt kernel libraries carried in .kb-cache, $OUT, the project installed in place.
set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
OUT=${OUT:-/tmp/kb-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
