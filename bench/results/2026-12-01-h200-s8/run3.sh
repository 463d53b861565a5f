#!/usr/bin/env bash
# Session-8 call 3: the HIP combine with one round trip per 64 partitions (this tree) against
# 78a3ae9's (.ab_old, 32 per round trip), and Triton's combine at UNROLL 64: the HIP tests, then
# every issue decode shape from CUDA graphs (one process per HIP build).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1) &
(PYTHONPATH=$PWD/.ab_old:$PYTHONPATH python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_old.log 2>&1) &
wait; tail -n1 $O/build*.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -4
timeout 220 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT" --csv $O/ab_new.csv hip= triton= \
  triton_c64=PAGEDATTN_DECODE_COMBINE=64,1,4,1 2>&1 | tee $O/ab_new.md | tail -24
PYTHONPATH=$PWD/.ab_old:$PYTHONPATH timeout 120 python3 scripts/hip_decode_ab.py --label 78a3ae9 \
  --csv $O/ab_old.csv hip_old= 2>&1 | tee $O/ab_old.md | tail -24
