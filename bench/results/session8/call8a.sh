#!/usr/bin/env bash
# session 8, call 1: GPU tests of session 7's unverified review commits (paged_inputs, sequences.cuh) and of
# decode lanes; G1 / G2 with decode_lanes 1 and 2 (batch_invariant off and on), lanes without turns.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt; git log -1 --oneline >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
P="python3 -m pytest -q -m gpu -p no:cacheprovider"
t tests 150 $P tests/engine/test_cuda_graph_runner.py tests/kernels/test_paged_attention.py tests/kernels/test_paged_attention_invariant.py tests/kernels/test_launch_rules.py > $L/tests.log 2>&1; tail -5 $L/tests.log
G="python3 bench/bench_generate.py --no-peer"
t g1 150 $G --workloads G1 --decode-lanes 1 2 --batch-invariant off on --csv $L/g1.csv > $L/g1.log 2>&1; grep -E "new tok/s|TB/s|Error|error" $L/g1.log
t g1_noturns 45 python3 bench/with_settings.py barerl.model.model.DECODE_LANES_TAKE_TURNS=False -- bench/bench_generate.py --no-peer --workloads G1 --decode-lanes 2 --csv $L/g1_noturns.csv > $L/g1_noturns.log 2>&1; grep -E "new tok/s|Error" $L/g1_noturns.log
t g2 120 $G --workloads G2 --decode-lanes 1 2 --csv $L/g2.csv > $L/g2.log 2>&1; grep -E "new tok/s|Error|error" $L/g2.log
t r1 $((560 - SECONDS)) python3 bench/bench_grpo_step.py --batch-invariant off --offload-optimizer --decode-lanes 2 --json $L/r1_offload_lanes.json > $L/r1.log 2>&1; grep -E "^R1|Error" $L/r1.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
