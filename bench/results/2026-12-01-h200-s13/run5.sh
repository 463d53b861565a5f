#!/usr/bin/env bash
# Session 13, call 6 (~1 min): the launch-replay GPU tests again after the test's counting
# wrapper took the grid keyword (call 5: the two store_kv tests failed on that wrapper).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_launch_replay.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests.log | tail -8
