#!/usr/bin/env bash
# Session 15, call 3 (~4 min): the Triton decode kernel's tile configs on 32/8 block 16 (call 2's
# variant names lacked the "triton" prefix, so they timed the HIP backend: 1.5-4.6 % faster than
# the Triton default on all five rows). Offline regs (sm_90, one pass): 32,4,x 108 (4 programs
# per SM); 32,8,x 64 (4 programs, 32 warps); 16,4,x 78 (6 programs).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
C=PAGEDATTN_DECODE_CONFIG
timeout 400 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_config.csv triton triton_32x4x2=$C=32,4,2 triton_32x4x4=$C=32,4,4 \
  triton_32x8x2=$C=32,8,2 triton_32x8x3=$C=32,8,3 triton_16x4x3=$C=16,4,3 \
  triton_16x4x4=$C=16,4,4 triton_g=PAGEDATTN_DECODE_VARIANT=gluon hip 2>&1 | tee $O/ab_config.md
