#!/usr/bin/env bash
# Session 14, call 7 (~2 min). Call 6 (sm_read_probe): a lone program streaming through a
# 64-row cp.async ring reads 62-78 GB/s, yet a lone decode program only ~30 GB/s. Where does the
# decode loop's time go? The TIMELINE runs now count %clock64 cycles issuing the refill,
# waiting for a tile and computing, per program: (1, 32768) at two programs per SM (default)
# and at one (64,4), and a one-pass row.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
for t in 64,2 64,4; do
  echo "## PAGEDATTN_DECODE_GLUON_TILE=$t" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_GLUON_TILE=$t timeout 60 python3 scripts/decode_timeline.py --calls 2 2>&1 \
    | tee -a $O/timeline.txt
done
echo "## block 64" | tee -a $O/timeline.txt
timeout 60 python3 scripts/decode_timeline.py --calls 1 --block 64 2>&1 | tee -a $O/timeline.txt
echo "## 32/8 p16 (64, 4096) one pass" | tee -a $O/timeline.txt
timeout 60 python3 scripts/decode_timeline.py --calls 1 --batch 64 --ctx 4096 2>&1 \
  | tee -a $O/timeline.txt
