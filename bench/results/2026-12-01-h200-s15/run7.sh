#!/usr/bin/env bash
# Session 15, call 7 (~4 min): MHA (32/32) against FlashInfer. In the table of call 6 (and of
# session 13) FlashInfer's CUDA-core decode is 0.3-2.5 % ahead of the default Gluon rows form on
# most 32/32 rows; session 14's swap A/B (ab_swap_5a2a7aa.md) had swap with one partition per
# split program 1.002-1.020x the default on all ten 32/32 rows. Here: rows and swap, each with the
# planner's partitions per program and with one; medians of 3 rotated rounds.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
F=PAGEDATTN_DECODE_GLUON_FORM
timeout 500 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --csv $O/ab_mha.csv triton triton_p1=PAGEDATTN_DECODE_PPP=1 triton_s=$F=swap \
  triton_sp1=$F=swap,PAGEDATTN_DECODE_PPP=1 2>&1 | tee $O/ab_mha.md
