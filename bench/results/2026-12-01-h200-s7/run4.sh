#!/usr/bin/env bash
# Session-7 call 4: where the HIP decode's extra L2 read requests come from (22 M requests /
# 50 M sectors vs Triton's 8.4 M / 33.6 M for the same 33.6 M DRAM sectors): per-op L1TEX and
# L2 counters and the source counters of both kernels at (64, 4096) 32/8.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
M='regex:^(l1tex__t_(requests|sectors)_pipe_lsu_mem_global_op_(ld|ldgsts|st)|lts__t_(requests|sectors)_srcunit_tex_op_read(_lookup_hit|_lookup_miss)?|dram__sectors_read|smsp__inst_executed_op_(ldgsts|global_ld)|lts__t_sectors_srcunit_tex_op_read_lookup_hit)\.sum$'
for b in hip triton; do
  timeout 120 ncu --clock-control none --kernel-name regex:decode --launch-skip 3 --launch-count 1 --metrics "$M" --section SourceCounters --print-details all python3 scripts/hip_prof_case.py 64 4096 32 8 $b > $O/ncu4_$b.txt 2>&1 || echo "ncu $b rc $?"
  grep -E "__|Uncoalesced|excessive|Address" $O/ncu4_$b.txt | head -40
done
