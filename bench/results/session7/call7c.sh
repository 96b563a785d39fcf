#!/usr/bin/env bash
# session 7, call 3: the batch-invariant decode kernel with its cache slots read once per tile (GPU tests, G1/G2
# and R1 with batch_invariant on / off, transformers in the same call), PDL removed.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
P="python3 -m pytest -q -m gpu -p no:cacheprovider"
t tests 90 $P tests/kernels/test_paged_attention_invariant.py tests/kernels/test_attention.py tests/kernels/test_rmsnorm.py tests/kernels/test_paged_attention.py tests/train/test_loops.py -k "invariant or attention or rmsnorm or bf16 or fp32" > $L/tests.log 2>&1; tail -3 $L/tests.log
t r1_inv 75 python3 bench/bench_grpo_step.py --json $L/r1_inv.json > $L/r1_inv.log 2>&1; grep ^R1 $L/r1_inv.log
t r1_off 60 python3 bench/bench_grpo_step.py --batch-invariant off --json $L/r1_off.json > $L/r1_off.log 2>&1; grep ^R1 $L/r1_off.log
t r1_offload 75 python3 bench/bench_grpo_step.py --offload-optimizer --json $L/r1_offload.json > $L/r1_offload.log 2>&1; grep ^R1 $L/r1_offload.log
t gen $((570 - SECONDS)) python3 bench/bench_generate.py --batch-invariant off on --csv $L/generate.csv > $L/gen.log 2>&1; grep -E "new tok/s|TB/s" $L/gen.log; tail -6 $L/gen.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
