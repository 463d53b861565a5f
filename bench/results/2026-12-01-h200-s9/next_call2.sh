#!/usr/bin/env bash
# Ready for session 10 (after next_call.sh; ~2 min): Triton bf16 decode tiles on 32/8, the rows
# under issue 4's 0.95 on this session's machine ((64, 4096) and (256, 2048) block 16: 0.926 and
# 0.947, HIP 0.953 and 0.966). Session 3's sweep chose (32, 4, 3) on another triton build; 2
# stages lost 5-32 % in this session. Interleaved in one process, the default timed twice.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout 150 python3 scripts/hip_decode_ab.py --heads 32/8 --label "$PAGEDATTN_COMMIT" --csv $O/ab_bf16_tiles.csv \
  triton= triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3 triton_s4=PAGEDATTN_DECODE_CONFIG=32,4,4 \
  triton_t16=PAGEDATTN_DECODE_CONFIG=16,4,4 triton_w8=PAGEDATTN_DECODE_CONFIG=64,8,3 triton_b= \
  2>&1 | tee $O/ab_bf16_tiles.md | tail -11
