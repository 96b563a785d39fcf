#!/usr/bin/env bash
# session 10, call 6: norm_linear with rotated eighths (probe_norm_linear2.py), its tests, and G1 / G2 with it.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t probe 150 python3 bench/results/session10/probe_norm_linear2.py 2>&1 | tee $L/probe2.log
t tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_norm_linear.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t gen 100 python3 bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. barerl:|Error" $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs
