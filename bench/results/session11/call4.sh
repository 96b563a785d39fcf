#!/usr/bin/env bash
# main with reserve_shared_memory (flash attention and rmsnorm backward): their GPU tests, then R1 in the
# fastest resident setting and below TRL's memory, and TRL 1.16 in the same call.
source bench/device_call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_attention.py tests/kernels/test_rmsnorm.py \
  > $L/tests.log 2>&1; tail -3 $L/tests.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
t r1_off 100 $R1 --offload-optimizer --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
t trl $((585 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
finish
