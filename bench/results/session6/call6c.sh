#!/usr/bin/env bash
# (run from the repository root as bash bench/results/session6/call6c.sh; it ran as bench/call6c.sh)
# session 6, call 3: GPU tests of the new sampler / fresh prefill / engine, kernel timings, G1/G2 with
# transformers, R1 default / keep / offload
set -o pipefail
tar -xzf .carry/snapshot.tgz  # the committed versions of files a helper is editing
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sample.py tests/engine tests/kernels/test_model_gpu.py tests/train/test_loops.py > $L/tests.log 2>&1; tail -12 $L/tests.log
t kernels 35 python3 bench/bench_decode_kernels.py --csv $L/kernels.csv > $L/kernels.log 2>&1; grep -E "sample|prefill" $L/kernels.log
t r1 55 python3 bench/bench_grpo_step.py --json $L/r1.json > $L/r1.log 2>&1; tail -1 $L/r1.log
t r1_keep 55 python3 bench/bench_grpo_step.py --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; tail -1 $L/r1_keep.log
t r1_offload 55 python3 bench/bench_grpo_step.py --offload-optimizer --json $L/r1_offload.json > $L/r1_offload.log 2>&1; tail -1 $L/r1_offload.log
t gen 230 python3 bench/bench_generate.py --csv $L/generate.csv > $L/gen.log 2>&1; grep -E "new tok/s|TB/s" $L/gen.log; tail -6 $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
