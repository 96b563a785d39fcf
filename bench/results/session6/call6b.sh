#!/usr/bin/env bash
# (run from the repository root as bash bench/results/session6/call6b.sh; it ran as bench/call6b.sh)
# session 6, call 2: split-K removal checked, G2 profile, lookahead 8 vs 16 with async, R1 default and keep
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_linear.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; tail -5 $L/tests.log
t gen 120 python3 bench/bench_generate.py --no-peer --num-scheduler-steps 8 16 --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "new tok/s|TB/s" $L/gen.log
t profile_g2 40 python3 bench/profile_decode.py --seqs 256 --context 384 > $L/profile_g2.log 2>&1; tail -16 $L/profile_g2.log
t profile 40 python3 bench/profile_decode.py > $L/profile.log 2>&1; tail -16 $L/profile.log
t kernels 60 python3 bench/bench_decode_kernels.py --csv $L/kernels.csv > $L/kernels.log 2>&1; grep -i -E "sample|attention" $L/kernels.log | head -20
t r1 100 python3 bench/bench_grpo_step.py --json $L/r1.json > $L/r1.log 2>&1; tail -2 $L/r1.log
t r1_keep 100 python3 bench/bench_grpo_step.py --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; tail -2 $L/r1_keep.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
