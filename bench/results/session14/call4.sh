#!/usr/bin/env bash
# Session 14, call 4: main as it lands: R1 at offload ratio 0.55 and resident with linear outputs kept (a second
# machine), G1 with transformers in the same process, G2 alone.
source bench/device_call.sh
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_off_0.55 70 $R1 --offload-optimizer 0.55 --json $L/r1_off_0.55.json > $L/r1_off_0.55.log 2>&1; grep -E "^R1|Error" $L/r1_off_0.55.log
t r1_keep 70 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
finish
t gen_g1 200 python3 bench/bench_generate.py --workloads G1 --csv $L/gen_g1.csv > $L/gen_g1.log 2>&1; grep -E "^G. (barerl|transformers):|Error" $L/gen_g1.log; tail -4 $L/gen_g1.log
t gen_g2 60 python3 bench/bench_generate.py --no-peer --workloads G2 --csv $L/gen_g2.csv > $L/gen_g2.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_g2.log
finish
