#!/usr/bin/env bash
# session 7, call 2: GPU tests of PDL, the batch-invariant mode (cuBLASLt, attention, a bf16 GRPO run), the
# refactored training attention and the re-applied sampler; R1 with batch_invariant on / off (and offloaded);
# G1/G2 with batch_invariant off / on; PDL A/B (BARERL_PDL=0); T1 after the attention change.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
P="python3 -m pytest -q -m gpu -p no:cacheprovider"
t pdl_tests 60 $P tests/kernels/test_pdl.py > $L/pdl_tests.log 2>&1; tail -3 $L/pdl_tests.log
if ! grep -q " passed" $L/pdl_tests.log || grep -q -E "[0-9]+ (failed|error)" $L/pdl_tests.log; then
  echo "=== PDL tests failed: BARERL_PDL=0 from here on"; export BARERL_PDL=0
fi
t tests 200 $P tests/kernels/test_paged_attention_invariant.py tests/kernels/test_cublaslt.py tests/kernels/test_attention.py tests/kernels/test_rmsnorm.py tests/kernels/test_swiglu.py tests/kernels/test_qk_norm_rope.py tests/kernels/test_paged_attention.py tests/kernels/test_sample.py tests/engine/test_cuda_graph_runner.py tests/kernels/test_model_gpu.py tests/train/test_loops.py > $L/tests.log 2>&1; tail -8 $L/tests.log
t r1_inv 80 python3 bench/bench_grpo_step.py --json $L/r1_inv.json > $L/r1_inv.log 2>&1; tail -1 $L/r1_inv.log
t r1_off 80 python3 bench/bench_grpo_step.py --batch-invariant off --json $L/r1_off.json > $L/r1_off.log 2>&1; tail -1 $L/r1_off.log
t gen 120 python3 bench/bench_generate.py --no-peer --batch-invariant off on --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "new tok/s" $L/gen.log
t gen_nopdl 70 env BARERL_PDL=0 python3 bench/bench_generate.py --no-peer --csv $L/gen_nopdl.csv > $L/gen_nopdl.log 2>&1; grep -E "new tok/s" $L/gen_nopdl.log
t r1_offload 80 python3 bench/bench_grpo_step.py --offload-optimizer --json $L/r1_offload.json > $L/r1_offload.log 2>&1; tail -1 $L/r1_offload.log
t t1 $((585 - SECONDS)) python3 bench/bench_train_step.py --skip-torch --json $L/t1.json > $L/t1.log 2>&1; tail -4 $L/t1.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
