#!/usr/bin/env bash
# For session 16's first GPU call (~4 min): lever 1 of bench/NOTES.md (after session 15). The
# 32/8 block-16 one-pass rows sit at 0.931-0.949 (0.95 asked) on the Triton kernel (32, 4, 3),
# whose loop has 9 BAR.SYNC per 32-token tile (offline SASS) against the HIP column split's 4.
# Fewer warps per program need fewer cross-warp steps: 1- and 2-warp configs, medians of 3
# rotated rounds on all five 32/8 block-16 rows (a config is fixed per model, so it must not lose
# the split rows either). Then the same for MHA's split rows (swap form): FlashInfer leads
# (8, 8192) by 0.4-1.0 points; the combine config is the knob left there.
# Offline (sm_90, triton 3.6, one pass, 32/8 block 16): config regs programs/SM | loop SASS per
# tile: (32,4,3) 108 4 | 439 instr, 9 BAR; (32,2,3/4) 200 5/4 | 711, 9 BAR; (16,2,4) 128 7 |
# 428, 9 BAR; (16,1,3/4) 255 8/7 | 689, 2 BAR (no spills); per KB of K/V and warp 27 / 44 / 54 /
# 86 instructions.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
# first the Gluon decode GPU test, which gained MHA on 1-token pages after the last GPU run
timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k gluon_decode 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests-gluon.log | tail -8
export PAGEDATTN_VALIDATE=0
C=PAGEDATTN_DECODE_CONFIG
timeout 300 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_warps.csv triton triton_16x1x3=$C=16,1,3 triton_16x1x4=$C=16,1,4 \
  triton_32x2x3=$C=32,2,3 triton_32x2x4=$C=32,2,4 triton_16x2x4=$C=16,2,4 hip 2>&1 \
  | tee $O/ab_warps.md
M=PAGEDATTN_DECODE_COMBINE
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --csv $O/ab_mha_combine.csv triton triton_c16=$M=16,1,4,1 triton_c64=$M=64,1,4,1 \
  triton_c32d2=$M=32,1,2,1 2>&1 | tee $O/ab_mha_combine.md
# (1, 32768) 32/8: the combine tail (2.6-3.3 us after the decode kernel): its group loop
# pipelined (2 stages: the second group's loads under the first's merges; slower in session 4,
# before the in-thread scalars of session 5)
timeout 120 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --csv $O/ab_combine.csv triton triton_cs2=$M=32,1,4,2 triton_c64=$M=64,1,4,1 2>&1 \
  | tee $O/ab_combine.md
