#!/usr/bin/env bash
# Session 23 call 1 (~4 min): where the balanced launch's fill loses to the count rule's one pass
# (bench/NOTES.md, levers after session 22, item 1). On even batches that fill (one pass) the
# balanced grid still holds E extra programs per head (empty there) and launches the combine
# (whose programs exit after the plan). PAGEDATTN_DECODE_FINE sets E (FINE x one wave / Hkv):
# FINE 1, 2, 4 give 528, 1056, 2112 extras at 32/8 block 16. One pass and the count rule
# forced beside them.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/smi.txt
timeout 250 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "64,4096;52,4096;256,2048;1,32768;8,8192" --csv $O/ab_extras.csv \
  triton triton_f1=PAGEDATTN_DECODE_FINE=1 triton_f2=PAGEDATTN_DECODE_FINE=2 \
  triton_count=PAGEDATTN_DECODE_MODE=count triton_1p=PAGEDATTN_DECODE_MODE=one_pass 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_extras.md
