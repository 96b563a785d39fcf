#!/usr/bin/env bash
# The GPU machine's driver: stages of the benchmark suite in order, each within its time limit and all within
# the budget, the results packed into two files.
#
#   bash bench/gpu_run.sh --to DIR [--parts DIR] [--wheels DIR] [--budget SECONDS] STAGE...
#
# Machine stages:
#   vllm_part     move the vLLM parts that arrived in --parts (part00, part01, SHA256SUMS, assemble_and_install.sh)
#                 out of the working tree, to /tmp/vllm-parts (they arrive one per transfer)
#   vllm_install  join and install them into /tmp/vsite once all are there (done by any vLLM stage if needed)
#   tests         the GPU test suite (pytest -m gpu tests; TESTS= other paths, TEST_TIMEOUT= its limit; with
#                 --wheels, bench/peer_wheels.sh's tests folder, also the tests that need the serve/eval extras)
# Benchmark stages (bench/run_all.py's STAGES): gen_barerl gen_vllm gen_hf gen_hf_default t1 t1_tuned r1
#   r1_trl_vllm r1_trl, lora (R1 full-parameter, then with LoRA r=16), lora_8b and lora_8b_trl_vllm (LoRA GRPO, Qwen3-8B shape,
#   R2's sizes), and the larger workloads g3 g3_vllm t2 t2_torch r2 r2_trl_vllm r3 r3_trl_vllm l1
#   l1_trl_vllm. gen_vllm, g3_vllm and the *_trl_vllm stages run with the installed vLLM; t1_tuned, t2_torch,
#   the *_trl_vllm stages and r1_trl with the wheels of --wheels (TRL, datasets, dill, multiprocess,
#   Liger-Kernel), installed once into /tmp/site. A machine kept warm between commands keeps /tmp: installs,
#   CuPy's kernel cache, tuning, the model folders (/tmp/bench-model-<shape>: 8 GB for 4B, 16 GB for 8B).
# Results: DIR/results.tgz (every step's log, the JSON records, commands.txt, gpu.txt) and DIR/summary.txt
# (each step's end and its figures); `python bench/run_all.py record EXTRACTED --commit SHA` files them.
set -uo pipefail
TO= PARTS= WHEELS= BUDGET=570
while [ $# -gt 0 ]; do
  case $1 in
    --to) TO=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -n "$TO" ] && [ $# -gt 0 ] || { sed -n '2,24p' "$0"; exit 2; }
mkdir -p "$TO"
WORK=/tmp/bench-run-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$WORK" /tmp/vllm-parts /tmp/cupy_cache
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export BENCH_DEADLINE=$(( $(date +%s) + BUDGET - 20 ))  # 20 s kept for packing
left() { local n=$(( BENCH_DEADLINE - $(date +%s) )); echo $(( n < $1 ? (n > 1 ? n : 1) : $1 )); }

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; date -u
  git log -1 --format='working tree at %h (a copy: its metadata may lag)' 2>/dev/null; } > "$WORK/gpu.txt"
cat "$WORK/gpu.txt"

stage_vllm_part() {
  [ -n "$PARTS" ] || { echo "vllm_part: no --parts folder given"; return 1; }
  local f
  for f in "$PARTS"/part[0-9][0-9] "$PARTS"/SHA256SUMS "$PARTS"/assemble_and_install.sh; do
    [ -f "$f" ] && mv "$f" /tmp/vllm-parts/
  done
  ls -l /tmp/vllm-parts
}

stage_vllm_install() {
  [ -f /tmp/vsite/env.sh ] && { echo "vLLM already installed in /tmp/vsite"; return 0; }
  local missing
  missing=$(cd /tmp/vllm-parts 2>/dev/null && awk '{print $2}' SHA256SUMS 2>/dev/null | while read -r p; do
    [ -f "$p" ] || echo "$p"; done)
  if [ ! -f /tmp/vllm-parts/SHA256SUMS ] || [ -n "$missing" ]; then
    echo "vllm_install: parts missing in /tmp/vllm-parts (${missing:-SHA256SUMS}): the machine was not kept warm"
    echo "between the commands that carried them, or a part was not carried; carry them again (stage vllm_part)"
    return 1
  fi
  RUN_SMOKE=0 timeout "$(left 240)" bash /tmp/vllm-parts/assemble_and_install.sh /tmp/vllm-parts \
    > "$WORK/vllm_install.log" 2>&1
  local rc=$?
  tail -5 "$WORK/vllm_install.log"
  rm -rf /tmp/vbundle
  return $rc
}

install_wheels() {  # the wheels of --wheels not installed yet (a later command may bring others)
  [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl > /dev/null 2>&1 || { echo "no wheels in '${WHEELS}' (--wheels)"; return 1; }
  local wheel new=()
  for wheel in "$WHEELS"/*.whl; do
    grep -qxF "${wheel##*/}" /tmp/site/.installed 2>/dev/null || new+=("$wheel")
  done
  [ ${#new[@]} -eq 0 ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${new[@]}" && printf '%s\n' "${new[@]##*/}" >> /tmp/site/.installed
}

stage_tests() {
  # with --wheels (bench/peer_wheels.sh's tests folder), the serving and evaluation tests run too
  if [ -n "$WHEELS" ]; then install_wheels || return 1; export PYTHONPATH=/tmp/site:$PYTHONPATH; fi
  # shellcheck disable=SC2086
  BARERL_ERROR_LOG=$WORK/errors.tsv timeout "$(left "${TEST_TIMEOUT:-300}")" python3 -m pytest -q -m gpu \
    ${TESTS:-tests} -p no:cacheprovider > "$WORK/tests.log" 2>&1
  local rc=$?
  grep -E "passed|failed|error" "$WORK/tests.log" | tail -15
  return $rc
}

bench_stage() (  # bench_stage STAGE: one of run_all.py's stages, with the packages it needs on the path
  case $1 in
    gen_vllm | g3_vllm | *_trl_vllm)
      stage_vllm_install || exit 1
      # shellcheck disable=SC1091
      source /tmp/vsite/env.sh ;;  # vLLM's packages first on the path, and its environment variables
  esac
  case $1 in
    t1_tuned | t2_torch | *_trl_vllm | r1_trl) install_wheels || exit 1; export PYTHONPATH=/tmp/site:$PYTHONPATH ;;
  esac
  python3 bench/run_all.py run "$1" --out "$WORK"
)

for stage in "$@"; do
  echo "===== $stage ($(date -u +%T), $(( BENCH_DEADLINE - $(date +%s) )) s left)"
  case $stage in
    vllm_part | vllm_install | tests) "stage_$stage" ;;
    *) bench_stage "$stage" ;;
  esac
  echo "===== $stage: rc=$?"
done 2>&1 | tee "$WORK/driver.log"

grep -h -E "^(--- |[GTRL][0-9](-[^ ]+)? |vLLM )" "$WORK"/*.log > "$TO/summary.txt" 2>/dev/null
tar -czf "$TO/results.tgz" -C "$WORK" .
ls -l "$TO"
