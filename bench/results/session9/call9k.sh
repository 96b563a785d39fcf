#!/usr/bin/env bash
# session 9, call 11: R1 with batch_invariant off, linear outputs kept (gradient_checkpointing_keep
# attention,linear) and 16 decode steps per graph launch, and TRL 1.16's R1, in one call; package code ec77101's.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t r1_keep 120 python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
t trl $((500 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
tar -czf $OUT/logs.tgz -C $OUT logs
