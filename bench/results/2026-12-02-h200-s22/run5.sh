#!/usr/bin/env bash
# Session 22 call 5 (~2.5 min): does the balanced grid's empty extra programs' count cost the
# one-pass rows? FINE sets the grid's extras (E = min(FINE x one wave / Hkv, B (P - 1))) and the
# ragged grain only; on these even, filling rows it changes E alone: 2112 extra programs at
# FINE 4 against 528 at 1 ((64, 4096) 32/8 block 16). Same bits for any value.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 150 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "64,4096;52,4096;256,2048" --csv $O/ab_extras.csv triton \
  triton_fine1=PAGEDATTN_DECODE_FINE=1 triton_fine2=PAGEDATTN_DECODE_FINE=2 \
  triton_1p=PAGEDATTN_DECODE_MODE=one_pass 2>&1 | grep -v "Warn\|warn" | tee $O/ab_extras.md
