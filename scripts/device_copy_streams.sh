set -uo pipefail
export PYTHONUNBUFFERED=1 KOSMOS_BENCH_CACHE=$PWD/.kb-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
cd scripts
CS_TAG=p1 timeout 150 python3 device_copy_streams.py $OUT 8192x57344x8192 2>&1 | grep -v Warning
CS_TAG=p2 CS_PARTS=1 timeout 60 python3 device_copy_streams.py $OUT 8192x57344x8192 2>&1 | grep -v Warning
CS_TAG=c32 CUDA_DEVICE_MAX_CONNECTIONS=32 CS_PARTS=1 timeout 60 python3 device_copy_streams.py $OUT 8192x57344x8192 2>&1 | grep -v Warning
TL_REPS=8 TL_EXTRA= TL_VARIANTS=h0.s2,h0.s2-1-1,h0.s4 timeout 200 python3 device_timeline.py $OUT/tl 8192x57344x8192,16384x57344x8192 2>&1 | tail -30
