#!/usr/bin/env bash
# For session 18's first GPU call (~5 min): lever 1 of bench/NOTES.md (after session 17). The
# timelines of session 17 show the Triton tile loop's programs bound partly by something per SM
# (their loop times follow the SM across calls; HIP's do not). Profile both decode kernels at
# (1, 32768) 32/8 block 16, split (the combine excluded): the full set, then the source page
# (per-SASS-line stall samples) of each, to compare where the warps of each loop wait. The
# reports come back in results.tgz too.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
for be in triton hip; do
  r=$O/ncu_1_32768_$be
  timeout 150 ncu --set full --import-source no --kernel-name regex:decode --launch-skip 3 \
    --launch-count 1 -o $r python3 scripts/hip_prof_case.py 1 32768 32 8 $be > $r.log 2>&1
  ncu --import $r.ncu-rep --page details > $r.txt 2>&1
  grep -E "Duration|DRAM Throughput|No Eligible|Warp Cycles Per Issued|Executed Instructions  " \
    $r.txt | head -8
  ncu --import $r.ncu-rep --page source --csv --print-source sass > $r.sass.csv 2>&1 \
    || echo "no source page from this ncu" >> $r.sass.csv
  head -c 600 $r.sass.csv; echo
done
