#!/usr/bin/env bash
# session 9, call 5: paged attention's K/V ring in dynamic shared memory, so that wider CTAs (THREADS) and deeper
# rings (STAGES x UNROLL past 48 KB) can be tried: GPU tests of every variant, a sweep of decode cases, then G1
# and G2 end to end with the default and the sweep's fastest G1 shape.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 170 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/kernels/test_paged_attention.py \
  tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -4 $L/tests.log
t sweep 150 python3 bench/profile_attention.py --paged 128,4,2 128,4,3 128,4,4 128,8,2 256,4,2 256,2,3 256,4,3 \
  256,2,4 512,2,2 64,4,4 2>&1 | tee $L/sweep.log
best=$(awk '$2 == "G1" && $3 == "64" {print $(NF-1), $1}' $L/sweep.log | sort -n | head -1 | cut -d" " -f2)
echo "fastest G1 shape: $best"
IFS=, read -r TH UN ST <<< "$best"
t gen 200 python3 bench/bench_generate.py --no-peer --csv $L/gen_default.csv > $L/gen_default.log 2>&1; grep -E "new tok/s" $L/gen_default.log
set_best="barerl.kernels.paged_attention._THREADS=$TH barerl.kernels.paged_attention._UNROLL=$UN barerl.kernels.paged_attention._STAGES=$ST"
t gen_best 200 python3 bench/with_settings.py $set_best -- bench/bench_generate.py --no-peer --csv $L/gen_best.csv > $L/gen_best.log 2>&1; grep -E "new tok/s" $L/gen_best.log
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .
tar -czf $OUT/logs.tgz -C $OUT logs
