#!/usr/bin/env bash
# Session-8 call 8: HIP against Triton where they were never timed side by side: fp8 caches
# (e5m2 on every issue shape, e4m3 on 32/8 block 16) and groups > 16 (64/1, 48/2; bf16).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
timeout 70 python3 scripts/hip_decode_ab.py --kv e5m2 --label "$PAGEDATTN_COMMIT" --csv $O/ab_e5m2.csv hip= triton= 2>&1 | tee $O/ab_e5m2.md | tail -21
timeout 40 python3 scripts/hip_decode_ab.py --kv e4m3 --quick --label "$PAGEDATTN_COMMIT" --csv $O/ab_e4m3.csv hip= triton= 2>&1 | tee $O/ab_e4m3.md | tail -6
timeout 70 python3 scripts/hip_decode_ab.py --heads 64/1,48/2 --label "$PAGEDATTN_COMMIT" --csv $O/ab_groups.csv hip= triton= 2>&1 | tee $O/ab_groups.md | tail -21
