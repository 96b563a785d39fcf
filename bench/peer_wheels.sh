#!/usr/bin/env bash
# Downloads the wheels the GPU machine lacks (it has no network) for Python 3.12 on x86_64, into DIR:
#   bash bench/peer_wheels.sh DIR
# DIR/peers: TRL, peft, datasets and the two it needs that the machine lacks, Liger-Kernel (the *_trl* stages,
#            t1_tuned, t2_torch);
# DIR/tests: the test extras the GPU suite's serving and evaluation tests import (openai, starlette, uvicorn
#            and their dependencies), and pytest-xdist for gpu_run.sh's TEST_WORKERS.
# Each folder is a few MB: carry it beside the working tree and pass it to bench/gpu_run.sh --wheels.
# vLLM travels apart, in two parts (../shared/peers/vllm or its own split script).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,9p' "$0"; exit 2; }
DIR=$1
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform any)
mkdir -p "$DIR/peers" "$DIR/tests"
python3 -m pip download -q "${PLATFORM[@]}" --no-deps -d "$DIR/peers" \
  trl==1.16.0 peft==0.21.0 liger-kernel==0.8.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
python3 -m pip download -q "${PLATFORM[@]}" -d "$DIR/tests" "openai>=1.40" "starlette>=0.37" "uvicorn>=0.29"
# without its dependencies: a pytest of its own would shadow the machine's and its plugins
python3 -m pip download -q "${PLATFORM[@]}" --no-deps -d "$DIR/tests" pytest-xdist execnet
du -sh "$DIR"/peers "$DIR"/tests
