#!/usr/bin/env bash
# For session 20's first GPU call (~8 min). (1) GPU tests of the balanced launch with
# PAGEDATTN_DECODE_SPEC=1 (first-tile ids guessed at the count rule's share; off by default, not
# yet run on a GPU) and of the default. (2) A/B on the uniform 32/8 block-16 rows: balanced,
# balanced + SPEC, count rule (session 19: balanced 1.016-1.055x slower than count). (3) Lever 4
# of bench/NOTES.md: even batches with an engine-width block table (131072 keys), balanced
# against the count rule (whose split shares follow the table's width), and at exact width.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
PAGEDATTN_DECODE_SPEC=1 timeout -s KILL 150 python3 -m pytest -v -p no:cacheprovider -rf \
  --tb=short -n 8 -m gpu tests/test_triton_decode_balance.py tests/test_launch_replay.py \
  "tests/test_triton_decode.py::test_gpu_split_equals_one_pass_bitwise" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-spec.log
grep -c PASSED $O/gpu-tests-spec.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-spec.log \
  | head -20
export PAGEDATTN_VALIDATE=0
timeout 90 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_spec.csv triton triton_spec=PAGEDATTN_DECODE_SPEC=1 \
  triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 | tee $O/ab_spec.md
for bl in "1 32768" "8 8192" "64 4096" "256 2048"; do
  set -- $bl
  for w in 131072 $2; do
    timeout 40 python3 scripts/ragged_decode.py --mix even --batch $1 --long $2 --width $w \
      --heads 32/8,32/32 --backends triton,triton_tl 2>&1 | grep -v "Warn\|warn" \
      | tee $O/even_${1}_${2}_w$w.md
  done
done
