#!/usr/bin/env bash
# For session 17's first GPU call (~7 min): lever 1 of bench/NOTES.md (after session 16). Under
# ncu the Triton 32/8 block-16 loop is 0.9 % behind the HIP column split at (64, 4096), at equal
# occupancy. HIP's ring is 2 stages deep; Triton's 2 stages lost at (1, 32768) in session 3,
# before PDL, the planner and the lazy row sums. Re-measure the ring depth on all five 32/8
# block-16 rows (a config is fixed per model), then take the table again at the same commit: a
# second sample of the table noise with the 4687 GB/s ceiling. Before that: the in-kernel merge
# of the split launch (PAGEDATTN_DECODE_FOLD=last, lever 4; CPU- and offline-compile-tested
# only): its GPU tests, then an A/B on the 32/8 split rows (it removes the combine launch and
# its ~3 us tail; the last program of each pair does the merge instead).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_cs.py -k fold 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-fold.log
grep -E "PASSED|FAILED|^E  |passed|failed" $O/gpu-tests-fold.log | tail -6
export PAGEDATTN_VALIDATE=0
F=PAGEDATTN_DECODE_FOLD=last
timeout 150 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16 --csv $O/ab_fold.csv triton triton_fold=$F \
  triton_tl=PAGEDATTN_DECODE_VARIANT=triton triton_tlfold=PAGEDATTN_DECODE_VARIANT=triton,$F \
  2>&1 | tee $O/ab_fold.md
C=PAGEDATTN_DECODE_CONFIG
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_stages.csv triton triton_s2=$C=32,4,2 triton_s4=$C=32,4,4 hip 2>&1 \
  | tee $O/ab_stages.md
timeout 200 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
