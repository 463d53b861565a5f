#!/usr/bin/env bash
# Session 16, call 3 (~3 min): the GPU tests call 2 did not reach before its time limit (launch
# replay, plan, column split; the decode ones passed there: 170 of 170 run), then ncu.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 300 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_launch_replay.py tests/test_plan.py tests/test_triton_decode_cs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests3.log
grep -c PASSED $O/gpu-tests3.log; grep -E "^FAILED|^E  |passed|failed|items" $O/gpu-tests3.log | head -20
# For session 17 (lever 1 of bench/NOTES.md after session 16): where the Triton 32/8 block-16
# loop and the HIP column split differ at equal occupancy, (64, 4096) one pass: warp states,
# instruction mix, the top stall locations (SASS) of both.
NCU="ncu --clock-control none --kernel-name regex:decode --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats --section SourceCounters"
for be in triton hip; do
  f=$O/ncu_64_4096_$be.txt
  timeout 80 $NCU python3 scripts/hip_prof_case.py 64 4096 32 8 $be > $f 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Issued Ipc|No Eligible|Registers Per|Warp Cycles Per Issued|Executed Instructions  " $f | head -12
done
