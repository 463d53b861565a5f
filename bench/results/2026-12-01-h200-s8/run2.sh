#!/usr/bin/env bash
# Session-8 call 2: per-kernel durations at (1, 32768) (ncu; clocks and caches as in a normal
# run) of both backends, and the attn_kernel pipeline-swizzle A/B (groups 64/1, 48/2): the
# decode tests under PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE=1, then both builds timed.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1) &
(PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE=1 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_psw.log 2>&1) &
wait; tail -n1 $O/build*.log
for b in hip triton; do
  for h in 8 32; do
    timeout 40 ncu --clock-control none --cache-control none --kernel-name regex:"decode|combine" \
      --launch-skip 4 --launch-count 4 --metrics gpu__time_duration.sum \
      python3 scripts/hip_prof_case.py 1 32768 32 $h $b > $O/ncu_dur_${b}_$h.txt 2>&1 || echo "ncu $b $h rc $?"
    echo "== $b 32/$h"; grep -E "^  [a-z_A-Z].*\(|gpu__time_duration" $O/ncu_dur_${b}_$h.txt | sed 's/(AttnParams).*//;s/, Context.*//' | head -8
  done
done
PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 \
  tests/test_hip_backend.py -k decode 2>&1 | tee $O/hip_tests_psw.log | tail -4
timeout 80 python3 scripts/hip_decode_ab.py --heads 64/1,48/2 --csv $O/ab_psw_default.csv --label default hip= 2>&1 | tee $O/ab_psw_default.md | tail -14
PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE=1 timeout 80 python3 scripts/hip_decode_ab.py --heads 64/1,48/2 --csv $O/ab_psw_on.csv --label pipe_swizzle hip= 2>&1 | tee $O/ab_psw_on.md | tail -14
