#!/usr/bin/env bash
# One device call for the whole system: model-level GPU tests (model, training step, engine vs the reference),
# then workloads T1 (training step), R1 (a whole GRPO step) and G1/G2 (generation), with peers where scripted.
# Logs and JSON/CSV results under $OUT; CuPy's kernel cache travels in .carry/cupy_cache.tgz (carry .carry).
set -o pipefail
OUT=${OUT:-/tmp/barerl_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p "$CUPY_CACHE_DIR"
[ -f .carry/cupy_cache.tgz ] && tar -xzf .carry/cupy_cache.tgz -C "$CUPY_CACHE_DIR"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv; git log --oneline -1; date -u; } | tee "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu tests/kernels/test_model_gpu.py tests/engine/test_cuda_graph_runner.py \
  -q -p no:cacheprovider 2>&1 | tee "$OUT/model_tests.log" | grep -v -E "^(SKIPPED|PASSED)" | tail -40
timeout "${T1_TIMEOUT:-170}" python3 bench/bench_train_step.py --json "$OUT/t1.json" 2>&1 | tee "$OUT/t1.log" | tail -25
timeout "${R1_TIMEOUT:-200}" python3 bench/bench_grpo_step.py --json "$OUT/r1.json" 2>&1 | tee "$OUT/r1.log" | tail -10
if [ -d .whl ]; then  # TRL's GRPOTrainer as R1's peer: trl, datasets, dill, multiprocess carried as wheels
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=$PYTHONPATH:/tmp/site timeout "${TRL_TIMEOUT:-300}" python3 bench/bench_grpo_trl.py --json "$OUT/r1_trl.json" \
    2>&1 | tee "$OUT/r1_trl.log" | grep -E "^R1|Error" | tail -5
fi
timeout "${GEN_TIMEOUT:-170}" python3 bench/bench_generate.py --csv "$OUT/generate.csv" 2>&1 | tee "$OUT/generate.log" | tail -25
tar -czf "$OUT/cupy_cache.tgz" -C "$CUPY_CACHE_DIR" .
