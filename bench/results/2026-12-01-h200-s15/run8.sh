#!/usr/bin/env bash
# Session 15, call 8 (~5 min): the decode, launch-replay and plan GPU tests with the swap form
# as the MHA default (one partition per split program); test_gpu_gluon_decode gains an MHA D 64
# case on 16-token pages and an explicit "rows" variant.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 330 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_launch_replay.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -15
