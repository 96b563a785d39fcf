#!/usr/bin/env bash
# session 10, call 9: G1 / G2 at 8, 16 and 32 decode steps per graph launch (num_scheduler_steps), no peer.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t gen 240 python3 bench/bench_generate.py --no-peer --num-scheduler-steps 8 16 32 --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. barerl|Error" $L/gen.log; tail -8 $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs
