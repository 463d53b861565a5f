#!/usr/bin/env bash
# For session 15's first GPU call (~5 min): what the decode loop's instruction chain waits on.
# Session 14 measured that a lone Gluon decode program computes ~63 % of its loop and issues
# ~32 % (timeline_cycles_5245f87.txt) and that no form tried (swap, ws, PIPE) shortens the
# chain much. ncu's warp-state statistics and the top stall locations (SASS) of the decode
# kernel at (1, 32768) 32/8 block 16: the default (two programs per SM), one program per SM
# (64,4: the chain alone), and the ws consumer. Decide the next form from these.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_DECODE_VARIANT=gluon PAGEDATTN_VALIDATE=0
run() {  # NAME, then env assignments
  local name=$1; shift
  env "$@" timeout 90 ncu --clock-control none --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --print-details all -k regex:decode_sm90 --launch-skip 3 \
    --launch-count 1 python3 scripts/hip_prof_case.py 1 32768 32 8 triton \
    > $O/ncu_$name.txt 2>&1 || echo "ncu $name rc $?"
  grep -iE "stall|warp cycles per|issued|eligible" $O/ncu_$name.txt | head -40
}
run rows_64x2 PAGEDATTN_DECODE_GLUON_TILE=64,2
run rows_64x4 PAGEDATTN_DECODE_GLUON_TILE=64,4
run ws_64x3 PAGEDATTN_DECODE_GLUON_TILE=64,3 PAGEDATTN_DECODE_GLUON_FORM=ws
# ws again with the register-aware planner (4e3c8e2): its call-8 losses at (8, 8192) and 32/32
# (1, 32768) were probably waves planned for 3 programs per SM where 2 fit (~2 min)
unset PAGEDATTN_DECODE_VARIANT
G=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_GLUON_FORM
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --csv $O/ab_ws.csv \
  triton triton_g=$G=rows triton_ws2=$G=ws triton_ws3=$G=ws,PAGEDATTN_DECODE_GLUON_TILE=64,3 \
  2>&1 | tee $O/ab_ws.md
