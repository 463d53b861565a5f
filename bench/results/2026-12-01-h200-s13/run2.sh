#!/usr/bin/env bash
# Session 13, call 3 (~5 min): launch replay (triton_kernels/_replay.py) and the remembered
# decode route (api._decode_route): every GPU test file a paged_decode call goes through (not the
# extend files: unchanged), then the host cost per eager call with and without replay.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" 2>&1 | tail -3
timeout 400 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 8 \
  --durations=8 tests/test_launch_replay.py tests/test_triton_decode.py tests/test_plan.py \
  tests/test_hip_backend.py tests/test_dispatch.py tests/test_dispatch_runs.py tests/test_replay.py \
  2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -30
PAGEDATTN_VALIDATE=0 timeout 120 python3 scripts/launch_profile.py --profile 2>&1 \
  | tee $O/launch_profile.log | grep -v "^ \{20\}\|^$" | grep -v "^  *[0-9]" | head -40
