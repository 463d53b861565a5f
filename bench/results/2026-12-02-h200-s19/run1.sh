#!/usr/bin/env bash
# Session 19 call 1 (~7 min): the balanced launch with the ragged-batch grain (FINE 4: shares of
# cdiv(T, 4 SLOTS) when the longest sequence exceeds 5/4 of the mean; the count rule on even
# batches). (1) The GPU decode suite. (2) The three ragged mixes, Triton (Gluon where it serves)
# and the Triton kernel forced.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 330 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_triton_decode.py tests/test_triton_decode_cs.py \
  tests/test_launch_replay.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
for mix in one_long uniform bimodal; do
  long=16384; [ $mix = one_long ] && long=32768
  timeout 60 python3 scripts/ragged_decode.py --mix $mix --long $long --backends triton,triton_tl \
    2>&1 | grep -v "Warn\|warn" | tee $O/ragged_$mix.md
done
