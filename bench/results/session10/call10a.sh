#!/usr/bin/env bash
# session 10, call 1: GPU tests of the fused norm + product kernels (norm_linear.cu) and of the model and engine
# paths that take them; the kernels against the unfused ops at decode rows; G1 / G2 with and without them.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_norm_linear.py \
  tests/kernels/test_model_gpu.py tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -30 $L/tests.log
t kernels 90 python3 bench/bench_norm_linear.py 2>&1 | tee $L/bench_norm_linear.log
t gen 150 python3 bench/bench_generate.py --no-peer --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G|tok/s|Error" $L/gen.log | head
t gen_unfused 150 python3 bench/with_settings.py barerl.kernels.norm_linear.MAX_ROWS=0 -- bench/bench_generate.py --no-peer --csv $L/gen_unfused.csv > $L/gen_unfused.log 2>&1; grep -E "^G|tok/s|Error" $L/gen_unfused.log | head
t profile 90 python3 bench/profile_decode.py > $L/profile.log 2>&1; tail -30 $L/profile.log
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .
tar -czf $OUT/logs.tgz -C $OUT logs
