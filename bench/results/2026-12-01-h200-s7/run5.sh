#!/usr/bin/env bash
# Session-7 call 5: the swizzled K/V tiles of the column-split decode (each fetched 128-byte line
# lands in one aligned 128-byte smem block): GPU tests, L2 counters, A/B against the padded rows.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
V="swz: pad:PAGEDATTN_HIP_DECODE_SWIZZLE=0 swz_il:PAGEDATTN_HIP_DECODE_INTERLEAVE=1"
for v in $V; do n=${v%%:*}; e=${v#*:}; (env $e python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_$n.log 2>&1) & done
wait; tail -qn1 $O/build_*.log
timeout 230 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -4
M='regex:^(lts__t_(requests|sectors)_srcunit_tex_op_read(_lookup_hit)?|dram__sectors_read)\.sum$'
timeout 60 ncu --clock-control none --kernel-name regex:decode --launch-skip 3 --launch-count 1 --metrics "$M" python3 scripts/hip_prof_case.py 64 4096 32 8 hip > $O/ncu5.txt 2>&1; grep -E "__" $O/ncu5.txt
for v in $V; do n=${v%%:*}; e=${v#*:}; echo "== $n"; env $e timeout 60 python3 scripts/hip_decode_ab.py --quick --label "$n" hip= 2>&1 | tail -5 | tee $O/ab_$n.md; done
timeout 60 python3 scripts/hip_decode_ab.py --quick --label triton triton= 2>&1 | tail -5 | tee $O/ab_triton.md
