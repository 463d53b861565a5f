#!/usr/bin/env bash
# Session-7 call 2: why the column-split HIP decode streams 8 % slower than Triton at the same
# occupancy (16 warps/SM) -- ncu of both at (64, 4096) one pass and (1, 32768) split -- and
# build-switch variants (pipeline depth, L2 prefetch hint) on the 32/8 block-16 shapes.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
V="default: st2:PAGEDATTN_HIP_DECODE_STAGES=2 st4:PAGEDATTN_HIP_DECODE_STAGES=4 l2:PAGEDATTN_HIP_CP_ASYNC_L2=256"
for v in $V; do n=${v%%:*}; e=${v#*:}; (env $e python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_$n.log 2>&1) & done
wait; tail -n1 $O/build_*.log
NCU="ncu --clock-control none --kernel-name regex:decode|combine --launch-skip 3 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
for c in "64 4096 32 8 hip" "64 4096 32 8 triton" "1 32768 32 8 hip" "1 32768 32 8 triton"; do
  f=$O/ncu_$(echo $c | tr ' ' _).txt
  timeout 100 $NCU python3 scripts/hip_prof_case.py $c > $f 2>&1; grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issued Ipc|No Eligible|Registers Per|Long Scoreboard|Stall" $f | head -30
done
for v in $V; do n=${v%%:*}; e=${v#*:}; echo "== $n"; env $e timeout 60 python3 scripts/hip_decode_ab.py --quick --label "$n" hip= 2>&1 | tail -5 | tee $O/ab_$n.md; done
timeout 60 python3 scripts/hip_decode_ab.py --quick --label triton triton= 2>&1 | tail -5 | tee $O/ab_triton.md
