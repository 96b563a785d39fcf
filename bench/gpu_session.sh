#!/usr/bin/env bash
# Device calls for the whole system, by stage (a device call lasts at most 600 s, so split the stages):
#   bash bench/gpu_session.sh tests t1 r1 demo                 # one GPU, stages in order
#   bash bench/gpu_session.sh --parallel "tests t1 r1" "trl gen"  # one list of stages per GPU, side by side
# Stages: tests (model-level GPU tests, AdamW kernels), t1, r1 (barerl), r1_offload (R1 with the optimizer state
# offloaded while generating), trl (TRL's GRPOTrainer on R1), gen
# (G1/G2 with transformers), kernels (decode-kernel micro-benchmarks), gemm (linear layers: GemmEx vs cuBLASLt),
# profile / profile_g2 (GPU time per op of a G1 / G2 decode step),
# profile_train (time per op of a T1 micro-batch), demo (`barerl demo` on the GPU), reward
# parity over $SEEDS: parity_demogpu (both systems from the GPU demo's SFT checkpoint; or _barerl / _trl alone), parity_demo_barerl,
# parity_demo_trl, parity_smol_barerl, parity_smol_trl, parity_smol_barerl_fp32, parity_smol_barerl_no_is
# (models in .parity).
# Extra arguments: TESTS (pytest paths for stage tests, e.g. TESTS=tests for every GPU test), R1_ARGS
# (bench_grpo_step.py, e.g. "--offload-optimizer"), T1_ARGS (bench_train_step.py, e.g.
# "--keep attention attention,linear"), GEN_ARGS (bench_generate.py,
# e.g. "--num-scheduler-steps 1 8 --no-peer").
# Logs and JSON/CSV packed into $OUT/results.tgz (a device call brings back only a few files), next to
# cupy_cache.tgz (CuPy's kernel cache: carry it back as .carry/cupy_cache.tgz) and the cuBLASLt tuning choices;
# TRL and its missing dependencies travel as wheels in .whl (carry .whl).
set -o pipefail
OUT=${OUT:-/tmp/barerl_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
SEEDS=${SEEDS:-0 1 2}
TESTS=${TESTS:-tests/kernels/test_model_gpu.py tests/kernels/test_adamw.py tests/engine/test_cuda_graph_runner.py tests/train/test_loops.py}
DEADLINE=${DEADLINE:-570}  # seconds after the start by which every stage has ended, so results get packed

budget() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }

setup() {
  mkdir -p "$CUPY_CACHE_DIR"
  [ -f .carry/cupy_cache.tgz ] && tar -xzf .carry/cupy_cache.tgz -C "$CUPY_CACHE_DIR"
  mkdir -p "$HOME/.cache/barerl" && cp .carry/cublaslt-*.json "$HOME/.cache/barerl/" 2>/dev/null  # tuned GEMMs
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  fi
  { nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,memory.used --format=csv; date -u; } | tee "$OUT/gpu.txt"
}

with_trl() { PYTHONPATH=$PYTHONPATH:/tmp/site "$@"; }

stage_tests() {
  # shellcheck disable=SC2086
  timeout "$(budget ${TEST_TIMEOUT:-150})" python3 -m pytest -m gpu $TESTS -q -p no:cacheprovider 2>&1 | tee "$OUT/model_tests.log" \
    | grep -v -E "^(SKIPPED|PASSED)" | tail -40
}
stage_t1() {
  # shellcheck disable=SC2086
  timeout "$(budget ${T1_TIMEOUT:-170})" python3 bench/bench_train_step.py --json "$OUT/t1.json" $T1_ARGS 2>&1 \
    | tee "$OUT/t1.log" | tail -25
}
stage_r1() {
  # shellcheck disable=SC2086
  timeout "$(budget ${R1_TIMEOUT:-200})" python3 bench/bench_grpo_step.py --json "$OUT/r1.json" $R1_ARGS 2>&1 \
    | tee "$OUT/r1.log" | tail -10
}
stage_r1_offload() {
  # shellcheck disable=SC2086
  timeout "$(budget ${R1_TIMEOUT:-200})" python3 bench/bench_grpo_step.py --json "$OUT/r1_offload.json" \
    --offload-optimizer $R1_ARGS 2>&1 | tee "$OUT/r1_offload.log" | tail -10
}
stage_trl() {
  with_trl timeout "$(budget ${TRL_TIMEOUT:-300})" python3 bench/bench_grpo_trl.py --json "$OUT/r1_trl.json" 2>&1 \
    | tee "$OUT/r1_trl.log" | grep -v -E "it/s|s/it" | tail -15
}
stage_gen() {
  # shellcheck disable=SC2086
  timeout "$(budget ${GEN_TIMEOUT:-300})" python3 bench/bench_generate.py --csv "$OUT/generate.csv" $GEN_ARGS 2>&1 \
    | tee "$OUT/generate.log" | tail -25
}
stage_profile() { timeout "$(budget ${PROFILE_TIMEOUT:-120})" python3 bench/profile_decode.py 2>&1 | tee "$OUT/profile_decode.log" | tail -25; }
stage_profile_g2() {
  timeout "$(budget ${PROFILE_TIMEOUT:-120})" python3 bench/profile_decode.py --seqs 256 --context 384 2>&1 \
    | tee "$OUT/profile_decode_g2.log" | tail -25
}
stage_profile_train() {
  timeout "$(budget ${PROFILE_TIMEOUT:-120})" python3 bench/profile_train_step.py 2>&1 | tee "$OUT/profile_train.log" | tail -25
}
stage_gemm() { timeout "$(budget ${GEMM_TIMEOUT:-150})" python3 bench/bench_gemm.py --csv "$OUT/gemm.csv" 2>&1 | tee "$OUT/gemm.log" | tail -70; }
stage_kernels() { timeout "$(budget ${KERNELS_TIMEOUT:-120})" python3 bench/bench_decode_kernels.py 2>&1 | tee "$OUT/decode_kernels.log" | tail -25; }
stage_demo() {
  timeout "$(budget ${DEMO_TIMEOUT:-200})" python3 -m barerl.cli demo --device cuda --output_dir "$OUT/demo" 2>&1 \
    | tee "$OUT/demo.log" | tr '\r' '\n' | grep -v -E "step/s|s/step" | tail -20
  rm -rf "$OUT"/demo/*/checkpoint-* "$OUT"/demo/*/*.safetensors
}

parity() {  # parity TASK MODEL SYSTEM [OUT_SUFFIX EXTRA_ARGS...]: 3 seeds, metrics and samples kept
  local task=$1 model=$2 system=$3 out=$OUT/parity_$1$4
  shift 4 2>/dev/null || shift 3
  for seed in $SEEDS; do
    with_trl timeout "$(budget ${PARITY_TIMEOUT:-300})" python3 bench/reward_parity.py run --system "$system" \
      --task "$task" --model "$model" --seed "$seed" --out "$out" "$@" 2>&1 | tee -a "$out.log" \
      | grep -E "seed|Error|error" | tail -5
  done
  rm -rf "$out"/*/checkpoint-* "$out"/*/*.safetensors
  # a call brings back few files: pack them, one archive per system (both systems share $out)
  tar -czf "$out-$system.tgz" -C "$OUT" "$(basename "$out")" && rm -rf "$out"
}
stage_parity_demo_barerl() { parity demo .parity/demo_sft barerl; }
stage_parity_demo_trl() { parity demo .parity/demo_sft trl; }
demo_gpu_model() {  # the GPU demo's SFT checkpoint (head_dim 64: the attention kernels cover it)
  [ -d /tmp/demo_gpu/sft/checkpoint-300 ] ||
    python3 -m barerl.cli demo --device cuda --output_dir /tmp/demo_gpu > "$OUT/demo_gpu.log" 2>&1
}
# Both systems in one list: the same checkpoint, made once. The GPU demo trains GRPO at lr 1e-4.
stage_parity_demogpu_barerl() {
  demo_gpu_model && parity demo /tmp/demo_gpu/sft/checkpoint-300 barerl _gpu_model --learning_rate 1e-4
}
stage_parity_demogpu_trl() { demo_gpu_model && parity demo /tmp/demo_gpu/sft/checkpoint-300 trl _gpu_model --learning_rate 1e-4; }
stage_parity_demogpu() { stage_parity_demogpu_barerl && stage_parity_demogpu_trl; }
smol_model() {  # SmolLM2 travels as a GGUF in two parts (over one call's size limit); a HF folder both load
  [ -d /tmp/smol ] && return
  cat .parity/smol.gguf.part_a .parity/smol.gguf.part_b > /tmp/smol.gguf &&
    python3 bench/reward_parity.py prepare --source /tmp/smol.gguf --model /tmp/smol
}
stage_parity_smol_barerl() { smol_model && parity arithmetic /tmp/smol barerl; }
stage_parity_smol_trl() { smol_model && parity arithmetic /tmp/smol trl; }
stage_parity_smol_barerl_fp32() { smol_model && parity arithmetic /tmp/smol barerl _fp32 --dtype float32; }
stage_parity_smol_barerl_no_is() {
  smol_model && parity arithmetic /tmp/smol barerl _no_is --set importance_sampling_correction=false
}

run_stages() {
  for stage in "$@"; do
    echo "=== $stage $(date -u +%T)"
    "stage_$stage"
  done
  echo "=== done $(date -u +%T)"
}

if [ "$1" = "--parallel" ]; then
  shift
  setup
  gpu=0
  for stages in "$@"; do
    mkdir -p "$OUT/gpu$gpu"
    # shellcheck disable=SC2086
    (log=$OUT/gpu$gpu/session.log; export CUDA_VISIBLE_DEVICES=$gpu OUT=$OUT/gpu$gpu; run_stages $stages > "$log" 2>&1) &
    gpu=$((gpu + 1))
  done
  wait
  for ((i = 0; i < gpu; i++)); do echo "##### GPU $i"; tail -c 5000 "$OUT/gpu$i/session.log"; done
  tar -czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls -d gpu[0-9]*) gpu.txt && rm -rf "$OUT"/gpu[0-9]*
else
  setup
  run_stages "$@"
  # a device call brings back only a few files: everything but the kernel cache travels as one archive
  tar -czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/"
fi
tar -czf "$OUT/cupy_cache.tgz" -C "$CUPY_CACHE_DIR" .
cp "$HOME"/.cache/barerl/cublaslt-*.json "$OUT/" 2>/dev/null || true
