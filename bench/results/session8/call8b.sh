#!/usr/bin/env bash
# session 8, call 2: does L2 already spare a shared prompt's re-reads in decode attention (G1 shape)? And the G1
# decode step's per-op profile at this commit.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t shared 60 python3 bench/results/session8/shared_prefix_attention.py 2>&1 | tee $L/shared_prefix.log
t profile 150 python3 bench/profile_decode.py > $L/profile_g1.log 2>&1; tail -25 $L/profile_g1.log
tar -czf $OUT/logs.tgz -C $OUT logs
