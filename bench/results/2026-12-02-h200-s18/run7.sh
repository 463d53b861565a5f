#!/usr/bin/env bash
# Session 18 call 7 (~3 min): call 6 found one pass 1.03x faster than split-KV at 32/32 (8, 8192)
# (256 (sequence, head) programs, 1.9 per SM; the rule splits below FILL 3 x 132 = 396). Where
# does one pass start to win for MHA (the Gluon swap form)? 128 to 384 programs, blocks 16, 64.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 220 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --blocks 16,64 --shapes "4,8192;6,8192;8,8192;10,8192;12,8192;6,16384;12,2048" \
  --csv $O/ab_fill.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp=PAGEDATTN_DECODE_MODE=split 2>&1 | tee $O/ab_fill.md
