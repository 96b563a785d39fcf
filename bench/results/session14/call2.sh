#!/usr/bin/env bash
# Session 14, call 2: the offloaded master as its low halves, the LM head on loss rows, dq/dk/dv in one array,
# rmsnorm_backward adding the residual gradient, outputs built once: GPU tests of the changed kernels and of
# training, the train profile, R1 offloaded at ratios 1 / 0.55 / 0.5 and resident with linear outputs kept.
source bench/device_call.sh
t tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_adamw.py tests/kernels/test_attention.py tests/kernels/test_rmsnorm.py tests/kernels/test_model_gpu.py tests/kernels/test_lm_head.py tests/train tests/model > $L/tests.log 2>&1; tail -3 $L/tests.log
t profile_train 60 python3 bench/profile_train_step.py > $L/profile_train.log 2>&1; head -24 $L/profile_train.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
for ratio in 1 0.55 0.5; do
  t r1_off_$ratio 100 $R1 --offload-optimizer $ratio --json $L/r1_off_$ratio.json > $L/r1_off_$ratio.log 2>&1; grep -E "^R1|Error" $L/r1_off_$ratio.log
done
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
finish
