#!/usr/bin/env bash
# Session 19 call 2 (~9.5 min; the session's last device time), kernels as at 7bf8853. (1) The
# GPU decode tests that call 1 did not reach (remaining_tests.txt: its 330 s limit cut the suite
# at 160 of 202). (2) The balanced launch against the count rule on the issue's uniform rows,
# 32/8 block 16 (the rows the Triton kernel serves). (3) The ragged grain: FINE 2 and 8 on the
# uniform and bimodal mixes (FINE 4, the default, is call 1's). (4) The results table.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  $(cat bench/results/2026-12-02-h200-s19/remaining_tests.txt) 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-rest.log
grep -c PASSED $O/gpu-tests-rest.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-rest.log \
  | head -30
export PAGEDATTN_VALIDATE=0
timeout 70 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count \
  2>&1 | tee $O/ab_count.md
for fine in 2 8; do for mix in uniform bimodal; do
  PAGEDATTN_DECODE_FINE=$fine timeout 30 python3 scripts/ragged_decode.py --mix $mix \
    --long 16384 --heads 32/8 --backends triton 2>&1 | grep -v "Warn\|warn" \
    | tee $O/ragged_${mix}_fine$fine.md
done; done
timeout 230 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
