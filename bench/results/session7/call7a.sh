#!/usr/bin/env bash
# session 7, call 1: GPU checks of a2418b3's reference top-p, the batch-invariant decode attention and the
# refactored training attention; the batch-invariance probe (cuBLASLt algorithms, row-wise ops); the multi-CTA
# sampler thresholds (2024bd9's files over this tree); R1 for TRL 1.16 and barerl in the same call.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt; date -u >> $L/gpu.txt
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
P="python3 -m pytest -q -m gpu -p no:cacheprovider -x"
t tests 150 $P tests/kernels/test_sample.py tests/kernels/test_paged_attention_invariant.py tests/kernels/test_attention.py tests/train/test_loops.py > $L/tests.log 2>&1; tail -5 $L/tests.log
t probe 90 python3 bench/batch_invariance.py > $L/probe.log 2>&1; head -5 $L/probe.log; grep default $L/probe.log
rm -rf /tmp/thr && mkdir /tmp/thr && cp -r src tests bench pyproject.toml /tmp/thr/ && tar -xf .carry/thresholds.tar -C /tmp/thr
(cd /tmp/thr && PYTHONPATH=/tmp/thr/src t thr_tests 90 $P tests/kernels/test_sample.py > $L/thr_tests.log 2>&1; tail -3 $L/thr_tests.log
 PYTHONPATH=/tmp/thr/src t thr_kernels 40 python3 bench/bench_decode_kernels.py > $L/thr_kernels.log 2>&1; grep sample $L/thr_kernels.log)
t trl 200 env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -8 $L/r1_trl.log
t r1 $((580 - SECONDS)) python3 bench/bench_grpo_step.py --json $L/r1.json > $L/r1.log 2>&1; tail -8 $L/r1.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .; cp $HOME/.cache/barerl/cublaslt-*.json $OUT/
