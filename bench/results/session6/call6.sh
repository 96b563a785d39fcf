#!/usr/bin/env bash
# (run from the repository root as bash bench/results/session6/call6.sh; it ran as bench/call6.sh)
# session 6, call 1: GPU tests of the new code, then A/B of the decode changes (one process per variant)
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }

t tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/kernels/test_linear.py tests/kernels/test_cublaslt.py tests/kernels/test_adamw.py tests/engine/test_cuda_graph_runner.py tests/train/test_optim.py tests/kernels/test_paged_attention.py tests/kernels/test_rmsnorm.py tests/train/test_loops.py -k "not smollm" > $L/tests.log 2>&1; tail -15 $L/tests.log
t gen_async 110 python3 bench/bench_generate.py --no-peer --async-scheduling on off --csv $L/gen_async.csv > $L/gen_async.log 2>&1; grep -E "new tok/s|TB/s" $L/gen_async.log
t gen_tune_off 70 python3 bench/with_settings.py barerl.kernels.cublaslt._TUNE_DECODE=False -- bench/bench_generate.py --no-peer --csv $L/gen_tune_off.csv > $L/gen_tune_off.log 2>&1; grep -E "new tok/s" $L/gen_tune_off.log
t gen_nosplit 70 python3 bench/with_settings.py barerl.kernels.linear._SPLIT_K_MAX_ROWS=0 -- bench/bench_generate.py --no-peer --csv $L/gen_nosplit.csv > $L/gen_nosplit.log 2>&1; grep -E "new tok/s" $L/gen_nosplit.log
t r1_offload 100 python3 bench/bench_grpo_step.py --offload-optimizer --json $L/r1_offload.json > $L/r1_offload.log 2>&1; tail -4 $L/r1_offload.log
t paged 50 python3 bench/profile_attention.py --paged 4,2 2,2 2,3 2,4 4,1 8,1 1,8 3,3 > $L/paged.log 2>&1; tail -30 $L/paged.log
t gemm 60 python3 bench/bench_gemm.py --rows G1 G2 --csv $L/gemm_decode.csv > $L/gemm.log 2>&1; tail -30 $L/gemm.log
t profile 40 python3 bench/profile_decode.py > $L/profile.log 2>&1; tail -25 $L/profile.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
