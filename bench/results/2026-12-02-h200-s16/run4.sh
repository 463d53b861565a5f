#!/usr/bin/env bash
# Session 16, call 4 (~1 min): the two column-split GPU cases that failed the oracle's vacuity
# guard in calls 1 and 3 (a logit cap of 0.5 flattened the 4097-key rows); the cap is now 30.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 120 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 2 -m gpu \
  tests/test_triton_decode_cs.py -k "16-1-d64" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests4.log
grep -E "PASSED|FAILED|^E  |passed|failed" $O/gpu-tests4.log | tail -8
