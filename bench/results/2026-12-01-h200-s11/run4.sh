#!/usr/bin/env bash
# Session 11, call 4 (~2 min): ncu of the lean Gluon kernel against `early` at (4, 4096, 1024):
# stall reasons, instruction counts per pipe, tensor-pipe activity.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
BASE="ncu --clock-control none --launch-skip 1 --launch-count 1"
M1="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
M2="--metrics regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_[a-z_]+\.sum$,smsp__inst_executed.sum"
for v in gluon early; do
  k=$([ $v = gluon ] && echo extend_fwd_sm90 || echo _extend_fwd)
  PAGEDATTN_EXTEND_VARIANT=$v timeout 100 $BASE --kernel-name regex:$k $M1 python3 scripts/extend_case.py 4 4096 1024 > $O/ncu_${v}.txt 2>&1
  PAGEDATTN_EXTEND_VARIANT=$v timeout 100 $BASE --kernel-name regex:$k $M2 python3 scripts/extend_case.py 4 4096 1024 > $O/ncu_pipes_${v}.txt 2>&1
done
for v in gluon early; do
  echo "== $v"; grep -E "Duration|Executed Instructions  |Issued Warp|No Eligible|Warp Cycles Per Issued" $O/ncu_${v}.txt
  grep -E "stalled_[a-z_]+_per_issue_active.ratio" $O/ncu_${v}.txt | awk '$NF > 0.1 {print $1, $NF}'
  grep -E "pct_of_peak|inst_executed" $O/ncu_pipes_${v}.txt | awk '$NF != "0" && $NF != "0.00" {print $1, $NF}' | head -30
done
