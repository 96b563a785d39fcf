#!/usr/bin/env bash
# Session 14, call 3: call 2's failures fixed: the GPU tests again (attention, AdamW, RMSNorm, optimizer,
# loops), R1 offloaded at ratios 0.55 / 0.5, TRL 1.16's R1 in the same call, then R1 fully offloaded.
source bench/device_call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_attention.py tests/kernels/test_adamw.py tests/kernels/test_rmsnorm.py tests/train/test_optim.py tests/train/test_loops.py > $L/tests.log 2>&1; tail -3 $L/tests.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
for ratio in 0.55 0.5; do
  t r1_off_$ratio 70 $R1 --offload-optimizer $ratio --json $L/r1_off_$ratio.json > $L/r1_off_$ratio.log 2>&1; grep -E "^R1|Error" $L/r1_off_$ratio.log
done
finish
t trl 250 env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -3 $L/r1_trl.log
finish
t r1_off_1 $((590 - SECONDS)) $R1 --offload-optimizer --json $L/r1_off_1.json > $L/r1_off_1.log 2>&1; grep -E "^R1|Error" $L/r1_off_1.log
finish
