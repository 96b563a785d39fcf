#!/usr/bin/env bash
# session 9, call 12: qk_norm_rope_store folded into the decode attention (paged_decode_attention): its GPU
# tests, the graph runner's and the GPU model's, then G1 and G2 (no peer) at this commit.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 100 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/kernels/test_paged_decode_attention.py \
  tests/engine/test_cuda_graph_runner.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; tail -6 $L/tests.log
t gen 100 python3 bench/bench_generate.py --no-peer --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "new tok/s|Error" $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs
