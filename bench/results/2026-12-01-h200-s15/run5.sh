#!/usr/bin/env bash
# Session 15, call 5 (~3 min): the Triton decode kernel (32/8 block 16) with fewer registers.
# Offline (sm_90, triton 3.6): one pass takes 108 registers (4 programs per SM); capped at 96,
# 5 programs fit (8 bytes of stack); split programs take 96 already. Medians of 3 rotated rounds.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
R=PAGEDATTN_DECODE_MAXNREG
timeout 400 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_maxnreg.csv triton triton_r104=$R=104 triton_r96=$R=96 \
  triton_r80=$R=80 2>&1 | tee $O/ab_maxnreg.md
