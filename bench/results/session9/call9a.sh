#!/usr/bin/env bash
# session 9, call 1: GPU tests of the cascade decode attention and the paged kernels it changed (parts merged
# by the last CTA, the invariant kernel's walk shared with the prefix kernel); the cascade at G1's shape.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 300 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/kernels/test_cascade_attention.py \
  tests/kernels/test_paged_attention.py tests/kernels/test_paged_attention_invariant.py tests/kernels/test_launch_rules.py \
  > $L/tests.log 2>&1; tail -25 $L/tests.log
t cascade 90 python3 bench/results/session9/cascade_attention.py 2>&1 | tee $L/cascade.log
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .
tar -czf $OUT/logs.tgz -C $OUT logs
