#!/usr/bin/env bash
# session 10, call 7: R1 settings below TRL's memory (optimizer offloaded, batch_invariant off, 16 decode steps
# per graph launch; linear outputs kept with smaller micro-batches), the fastest resident setting, and TRL 1.16.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_off 100 $R1 --offload-optimizer --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
t r1_off_keep8 100 $R1 --offload-optimizer --keep attention,linear --micro-batch 8 --json $L/r1_off_keep8.json > $L/r1_off_keep8.log 2>&1; grep -E "^R1|Error" $L/r1_off_keep8.log
t r1_off_keep4 100 $R1 --offload-optimizer --keep attention,linear --micro-batch 4 --json $L/r1_off_keep4.json > $L/r1_off_keep4.log 2>&1; grep -E "^R1|Error" $L/r1_off_keep4.log
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
t trl $((590 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
tar -czf $OUT/logs.tgz -C $OUT logs
