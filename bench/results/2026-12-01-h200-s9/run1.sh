#!/usr/bin/env bash
# Ready for session 9 (not run in session 8: its device time ran out). Triton decode over fp8
# caches with fp16 dots (PAGEDATTN_DECODE_FP8_DOT=f16) and 64-token tiles
# (PAGEDATTN_DECODE_CONFIG=64,4,3): the Triton decode GPU tests with fp16 dots, then an A/B against
# the default (bf16 dots, 32-token tiles) and each single change, plus 128-token tiles (offline:
# 45.5 instructions per KB, 209 registers) (e5m2 32/8 all shapes; e4m3 32/8 block 16); then
# the Triton combine UNROLL A/B in one process. Adopt what wins on every row: _f16_dot's
# default, and the fp8 tile in decode._config (kv bytes 1).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1) &
# correctness of the fp16 dots on the GPU (the tile override would apply to every head dim and
# group, D 256 included, so it is left to the A/B; BLOCK_N 64 is the 32-64-row buckets' tile)
PAGEDATTN_DECODE_FP8_DOT=f16 timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py 2>&1 | tee $O/triton_decode_tests_f16.log | tail -3
V="triton= triton_f16=PAGEDATTN_DECODE_FP8_DOT=f16 triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3 triton_f16_t64=PAGEDATTN_DECODE_FP8_DOT=f16,PAGEDATTN_DECODE_CONFIG=64,4,3 triton_f16_t128=PAGEDATTN_DECODE_FP8_DOT=f16,PAGEDATTN_DECODE_CONFIG=128,4,3"
timeout 80 python3 scripts/hip_decode_ab.py --kv e5m2 --heads 32/8 --label "$PAGEDATTN_COMMIT" --csv $O/ab_fp8_e5m2.csv $V 2>&1 | tee $O/ab_fp8_e5m2.md | tail -11
timeout 40 python3 scripts/hip_decode_ab.py --kv e4m3 --quick --label "$PAGEDATTN_COMMIT" --csv $O/ab_fp8_e4m3.csv $V 2>&1 | tee $O/ab_fp8_e4m3.md | tail -6
# the HIP combine past 64 partitions (two and three rounds; new cases, never run on a GPU)
wait; timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py \
  -k "partitions or launch_shapes" 2>&1 | tee $O/hip_tests_combine_rounds.log | tail -3
# Triton combine UNROLL 32 (default) vs 64 at (1, 32768), interleaved in one process (session 8's
# graph A/B compared two processes, whose drift was as large as the effect)
timeout 40 python3 scripts/hip_decode_ab.py --quick --label "$PAGEDATTN_COMMIT" --csv $O/ab_combine_unroll.csv \
  triton_u32a= triton_u64a=PAGEDATTN_DECODE_COMBINE=64,1,4,1 triton_u32b= triton_u64b=PAGEDATTN_DECODE_COMBINE=64,1,4,1 2>&1 | tee $O/ab_combine_unroll.md | tail -6
# Triton bf16 decode with 2 stages (1 tile in flight, as the HIP column split's default; 21.5 KB
# of shared memory instead of 37.9; never measured at 32-token tiles), interleaved twice
timeout 90 python3 scripts/hip_decode_ab.py --heads 32/8,32/32 --label "$PAGEDATTN_COMMIT" --csv $O/ab_stages.csv \
  triton_s3a= triton_s2a=PAGEDATTN_DECODE_CONFIG=32,4,2 triton_s3b= triton_s2b=PAGEDATTN_DECODE_CONFIG=32,4,2 2>&1 | tee $O/ab_stages.md | tail -21
