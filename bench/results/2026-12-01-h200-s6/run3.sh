#!/usr/bin/env bash
# Session-6 call 3: ncu of the HIP decode, old kernel (bdaeb73, oldpkg/) against the new one.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_new.log 2>&1 &
PYTHONPATH=$PWD/oldpkg:$PYTHONPATH python3 -c "import pagedattn, sys; print(pagedattn.__file__); from pagedattn.hip_kernels import build; build.load()" > $O/build_old.log 2>&1
wait; tail -1 $O/build_new.log $O/build_old.log
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters"
for shp in "1 4096" "8 4096"; do
  tag=$(echo $shp | tr ' ' _)
  for ver in new old; do
    PP=$PYTHONPATH; [ $ver = old ] && PP=$PWD/oldpkg:$PYTHONPATH
    PYTHONPATH=$PP timeout 150 ncu --clock-control none --kernel-name regex:"attn_kernel|decode_pipe" --launch-skip 3 --launch-count 1 $S python3 scripts/hip_prof_case.py $shp > $O/ncu_${ver}_$tag.txt 2>&1
    echo "== $ver $shp"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Active Warps Per" $O/ncu_${ver}_$tag.txt | head -12
  done
done
