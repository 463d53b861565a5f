#!/usr/bin/env bash
# Session 14, call 10 (~6 min): the decode, launch-replay and plan GPU tests at the final commit
# (the default kernels' PTX is unchanged; the launcher gained the form and PIPE knobs).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 330 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_launch_replay.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -12
