#!/usr/bin/env bash
# session 7, call 5 (the budget's last minutes): the ring-pipelined invariant decode kernel's GPU tests, its cost
# against the ordinary kernel, G1 and R1 with batch_invariant on.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_paged_attention_invariant.py tests/kernels/test_attention.py tests/train/test_loops.py -k "invariant or attention" 2>&1 | tail -3
PYTHONPATH=src:bench t costs 30 python3 bench/results/session7/invariant_costs.py 2>&1 | grep attention
t g1 40 python3 bench/bench_generate.py --workloads G1 --no-peer --batch-invariant on --csv $OUT/g1.csv 2>&1 | grep "new tok/s"
t r1 $((170 - SECONDS)) python3 bench/bench_grpo_step.py 2>&1 | grep ^R1
