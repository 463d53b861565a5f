#!/usr/bin/env bash
# Session-7 call 7: the final tree (interleave switch removed: SASS reshuffled) -- HIP GPU tests
# and the 20 decode shapes from graphs -- and the 2-stage column split (better on padded rows in
# calls 2-3) on the swizzled tiles, with its own decode tests.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1) &
(PAGEDATTN_HIP_DECODE_STAGES=2 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_st2.log 2>&1) &
wait; tail -qn1 $O/build*.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -3
timeout 70 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT st3" hip= triton= 2>&1 | tee $O/ab_st3.md | tail -21
PAGEDATTN_HIP_DECODE_STAGES=2 timeout 60 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT st2" hip= 2>&1 | tee $O/ab_st2.md | tail -21
PAGEDATTN_HIP_DECODE_STAGES=2 timeout 130 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py -k decode 2>&1 | tee $O/hip_tests_st2.log | tail -3
