#!/usr/bin/env bash
# Session 14, call 1: recomputation without the down product, GRPO's KV cache sized for shared prompts, and the
# optimizer offloaded in part (offload_optimizer_ratio): GPU tests, the train profile, R1 offloaded at ratios
# 1 / 0.7 / 0.6 and resident with linear outputs kept.
source bench/device_call.sh
t tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/train/test_optim.py tests/train/test_loops.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t profile_train 60 python3 bench/profile_train_step.py > $L/profile_train.log 2>&1; head -45 $L/profile_train.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
for ratio in 1 0.7 0.6; do
  t r1_off_$ratio 100 $R1 --offload-optimizer $ratio --json $L/r1_off_$ratio.json > $L/r1_off_$ratio.log 2>&1; grep -E "^R1|Error" $L/r1_off_$ratio.log
done
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
finish
