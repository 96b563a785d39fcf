#!/usr/bin/env bash
# session 9, call 2: the cascade as CTAs of the split kernel's own launch: GPU tests (kernels, graph runner,
# the GPU model and engine), the cascade at G1's shape, G1 with cascade on and off.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/kernels/test_cascade_attention.py \
  tests/kernels/test_paged_attention.py tests/kernels/test_launch_rules.py tests/engine/test_cuda_graph_runner.py \
  tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; tail -15 $L/tests.log
t cascade 60 python3 bench/results/session9/cascade_attention.py 2>&1 | tee $L/cascade.log
t g1 200 python3 bench/bench_generate.py --workloads G1 --no-peer --cascade-attn on off --csv $L/g1.csv > $L/g1.log 2>&1; grep -E "new tok/s|TB/s|Error" $L/g1.log
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .
tar -czf $OUT/logs.tgz -C $OUT logs
