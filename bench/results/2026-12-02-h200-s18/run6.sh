#!/usr/bin/env bash
# Session 18 call 6 (~3 min): call 5 showed cuDNN's SDPA decode at 32/32 (8, 8192) running one
# pass (256 CTAs, 2 per SM) where ours splits (num_seqs x num_kv_heads = 256 < FILL 3 x 132):
# the Triton backend (Gluon swap form for MHA) with the launch shape forced to one pass, on the
# 32/32 rows (the one-pass rows: the same launch, a noise yardstick).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --blocks 16,64 --csv $O/ab_onepass.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  2>&1 | tee $O/ab_onepass.md
