#!/usr/bin/env bash
# session 10, call 11: norm_linear with row-ordered loads (weight groups of 16 rows multiplied as they land):
# its GPU tests, cold timings against the unfused ops, G1 with and without it.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 50 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/kernels/test_norm_linear.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t kernels 25 python3 bench/bench_norm_linear.py --rows 1 64 2>&1 | tee $L/bench_norm_linear.log
ratio=$(awk '$1=="gate_up" && $2==64 {print $6}' $L/bench_norm_linear.log)
if awk "BEGIN{exit !($ratio < 1.0)}"; then
  t gen 45 python3 bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. barerl:|Error" $L/gen.log
  t gen_unfused 45 python3 bench/with_settings.py barerl.kernels.norm_linear.MAX_ROWS=0 -- bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen_unfused.csv > $L/gen_unfused.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_unfused.log
fi
tar -czf $OUT/logs.tgz -C $OUT logs
