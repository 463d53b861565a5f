#!/usr/bin/env bash
# Session 13, call 5 (~6 min): store_kv launch replay (the token count left out of the key),
# aliasing in the replay key, float fp8 scales made once per value: the GPU tests of the replay,
# store/copy, decode, plan and dispatch files, then the host cost per eager call (store_kv too).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 330 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" \
  -n 8 --durations=5 tests/test_launch_replay.py tests/test_triton_store_copy.py \
  tests/test_triton_decode.py tests/test_plan.py tests/test_dispatch.py \
  2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -16
PAGEDATTN_VALIDATE=0 timeout 90 python3 scripts/launch_profile.py 2>&1 | tee $O/launch_profile.log
