#!/usr/bin/env bash
# Session-7 call 3: the HIP decode's 34 % L2 hit rate (Triton: 1.3 %) at the same DRAM bytes --
# ncu memory tables of both at (64, 4096) -- and the copy-pattern / depth variants on 32/8 p16.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
V="default: il:PAGEDATTN_HIP_DECODE_INTERLEAVE=1 st2:PAGEDATTN_HIP_DECODE_STAGES=2 il_st2:PAGEDATTN_HIP_DECODE_INTERLEAVE=1,PAGEDATTN_HIP_DECODE_STAGES=2"
for v in $V; do n=${v%%:*}; e=${v#*:}; (env $(echo $e | tr ',' ' ') python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_$n.log 2>&1) & done
wait; tail -qn1 $O/build_*.log
M="lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex_op_read.sum,dram__sectors_read.sum"
NCU="ncu --clock-control none --kernel-name regex:decode --launch-skip 3 --launch-count 1 --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight"
for c in "hip:" "triton:" "hip_il:PAGEDATTN_HIP_DECODE_INTERLEAVE=1"; do n=${c%%:*}; e=${c#*:}; b=${n%%_*}
  env $e timeout 80 $NCU --metrics $M python3 scripts/hip_prof_case.py 64 4096 32 8 $b > $O/ncu_$n.txt 2>&1 || echo "ncu $n rc $?"
  grep -E "lts__|dram__|Duration|DRAM Through|L2 Hit|Hit Rate" $O/ncu_$n.txt | head -20; done
for v in $V; do n=${v%%:*}; e=${v#*:}; echo "== $n"; env $(echo $e | tr ',' ' ') timeout 60 python3 scripts/hip_decode_ab.py --quick --label "$n" hip= 2>&1 | tail -5 | tee $O/ab_$n.md; done
timeout 60 python3 scripts/hip_decode_ab.py --quick --label triton triton= 2>&1 | tail -5 | tee $O/ab_triton.md
