#!/usr/bin/env bash
# session 9, call 10: R1 (batch_invariant off, optimizer on the device) with 16 decode steps per graph launch,
# and with linear outputs kept as well as attention's (less recomputation); the package code is ec77101's.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t r1_la16 150 python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16 --json $L/r1_la16.json > $L/r1_la16.log 2>&1; grep -E "^R1|Error" $L/r1_la16.log
t r1_la16_keep 150 python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16 --keep attention,linear --json $L/r1_la16_keep.json > $L/r1_la16_keep.log 2>&1; grep -E "^R1|Error" $L/r1_la16_keep.log
t r1_la8 150 python3 bench/bench_grpo_step.py --batch-invariant off --json $L/r1_la8.json > $L/r1_la8.log 2>&1; grep -E "^R1|Error" $L/r1_la8.log
tar -czf $OUT/logs.tgz -C $OUT logs
