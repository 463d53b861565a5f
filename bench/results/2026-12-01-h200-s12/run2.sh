#!/usr/bin/env bash
# Session 12, call 2 (~9 min): the whole GPU tier (the Gluon decode kernel's tests, session 11's
# extend test refactor, everything else unchanged).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
TEST_TIMEOUT=560 bash scripts/gpu_run.sh "$TOP" tests
