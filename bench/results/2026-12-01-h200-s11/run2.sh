#!/usr/bin/env bash
# Session 11, call 2 (~4 min): the Gluon kernel without the per-iteration proxy fence (default)
# against the fenced loop and `early`; its GPU tests; ncu of one launch at (4, 4096, 1024).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -5
timeout 300 python3 scripts/extend_variants.py --out $O --rows early,gluon,gluon+fence,early#2 2>&1 \
  | tee $O/extend_variants.log | tail -12
NCU="ncu --clock-control none --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
PAGEDATTN_EXTEND_VARIANT=gluon PAGEDATTN_VALIDATE=0 timeout 120 $NCU --kernel-name regex:extend_fwd_sm90 \
  python3 scripts/extend_case.py 4 4096 1024 > $O/ncu_gluon_4_4096_1024.txt 2>&1
PAGEDATTN_VALIDATE=0 timeout 120 $NCU --kernel-name regex:_extend_fwd \
  python3 scripts/extend_case.py 4 4096 1024 > $O/ncu_early_4_4096_1024.txt 2>&1
grep -E "Duration|SM Frequency|Issue Slots Busy|Issued Ipc|Stall|Warp Cycles Per Issued|No Eligible|Compute \(SM\) Throughput" $O/ncu_*_4_4096_1024.txt | head -60; grep -E "stalled_[a-z_]+_per_issue_active.ratio +[a-z]* +[0-9.]+" $O/ncu_*_4_4096_1024.txt | awk "\$NF > 0.05" | head -60
