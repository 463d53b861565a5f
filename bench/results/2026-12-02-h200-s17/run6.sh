#!/usr/bin/env bash
# Session 17 call 6 (~2 min, the last of the budget): the Triton kernel's default path and the
# eager replay at the final head (fe3e475 added the TIMELINE constexpr and the tl_ptr argument
# after call 3's full run): the tile-loop decode tests and the replay tests.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 115 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 12 -m gpu \
  tests/test_launch_replay.py tests/test_triton_decode.py \
  -k "replay or capture or random_grid or split_equals or launch_shapes or int32" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-final.log
grep -c PASSED $O/gpu-tests-final.log; grep -E "^FAILED|^E  |passed|failed" \
  $O/gpu-tests-final.log | head -10
