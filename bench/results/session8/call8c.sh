#!/usr/bin/env bash
# session 8, call 3: cascade proxies; G1 / G2 (batch_invariant off and on) with transformers in the same call;
# R1 with batch_invariant on (the default) and off.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt; git log -1 --oneline >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t shared 40 python3 bench/results/session8/shared_prefix_attention.py 2>&1 | tee $L/shared_prefix.log
t gen 330 python3 bench/bench_generate.py --batch-invariant off on --csv $L/generate.csv > $L/gen.log 2>&1; grep -E "new tok/s|TB/s" $L/gen.log; tail -7 $L/gen.log
t r1_inv 90 python3 bench/bench_grpo_step.py --json $L/r1.json > $L/r1.log 2>&1; grep -E "^R1|Error" $L/r1.log
t r1_off $((585 - SECONDS)) python3 bench/bench_grpo_step.py --batch-invariant off --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
