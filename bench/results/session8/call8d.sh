#!/usr/bin/env bash
# session 8, call 4: R1 with the optimizer offloaded (batch_invariant off and on); G2 with transformers; TRL 1.16's R1 in the same call.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t r1_offload_off 90 python3 bench/bench_grpo_step.py --batch-invariant off --offload-optimizer --json $L/r1_offload_off.json > $L/r1_offload_off.log 2>&1; grep -E "^R1|Error" $L/r1_offload_off.log
t r1_offload_inv 90 python3 bench/bench_grpo_step.py --offload-optimizer --json $L/r1_offload.json > $L/r1_offload.log 2>&1; grep -E "^R1|Error" $L/r1_offload.log
t g2 150 python3 bench/bench_generate.py --workloads G2 --csv $L/g2.csv > $L/g2.log 2>&1; grep -E "new tok/s|TB/s" $L/g2.log
t trl $((585 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
