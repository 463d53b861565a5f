#!/usr/bin/env bash
# Session-8 call 6: per-kernel durations at (1, 32768) (ncu, clocks and caches as in a normal
# run) of the new combines: Triton UNROLL 64 (default) against 32, and the HIP combine with one
# round trip per 64 partitions (call 2 measured the old ones).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
for v in "hip:hip:" "triton:triton:" "triton_u32:triton:PAGEDATTN_DECODE_COMBINE=32,1,4,1"; do
  n=${v%%:*}; r=${v#*:}; b=${r%%:*}; e=${r#*:}
  for h in 8 32; do
    env $e timeout 40 ncu --clock-control none --cache-control none --kernel-name regex:"decode|combine" \
      --launch-skip 4 --launch-count 8 --metrics gpu__time_duration.sum \
      python3 scripts/hip_prof_case.py 1 32768 32 $h $b > $O/ncu_dur_${n}_$h.txt 2>&1 || echo "ncu $n $h rc $?"
    echo "== $n 32/$h"; grep -E "^  [a-z_A-Z].*\(|gpu__time_duration" $O/ncu_dur_${n}_$h.txt | sed 's/(AttnParams).*//;s/, Context.*//' | paste - - | sed -E 's/ +/ /g;s/ gpu__time_duration.sum us//'
  done
done
