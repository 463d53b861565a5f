#!/usr/bin/env bash
# Session 18 call 3 (~6 min): the combine's group of 64 states (one round trip at (1, 32768),
# where the default 32 takes two: call 2 put the tail in the grid wait plus the merge) on the
# 32/8 rows, then the results table at this session's head (kernels as at ddddcbd: a third
# machine's sample beside session 17's).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 150 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --csv $O/ab_c64.csv triton triton_c64=PAGEDATTN_DECODE_COMBINE=64,1,4,1 \
  triton_tl=PAGEDATTN_DECODE_VARIANT=triton \
  triton_tlc64=PAGEDATTN_DECODE_VARIANT=triton,PAGEDATTN_DECODE_COMBINE=64,1,4,1 \
  2>&1 | tee $O/ab_c64.md
timeout 220 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
