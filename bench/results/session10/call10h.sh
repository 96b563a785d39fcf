#!/usr/bin/env bash
# session 10, call 8: G1 and G2 with transformers' generate in the same call (package code of b7d9afc).
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t gen 420 python3 bench/bench_generate.py --csv $L/gen.csv > $L/gen.log 2>&1; tail -6 $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs
