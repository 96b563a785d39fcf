#!/usr/bin/env bash
# Session 15, call 5: main with the leaner paged attention: G1 and G2 with transformers in the same process,
# R1 in the README's setting (generation uses the kernel).
source bench/device_call.sh
t gen_g1 240 python3 bench/bench_generate.py --workloads G1 --csv $L/gen_g1.csv > $L/gen_g1.log 2>&1; grep -E "^G. (barerl|transformers):|Error" $L/gen_g1.log; tail -4 $L/gen_g1.log
finish
t gen_g2 150 python3 bench/bench_generate.py --workloads G2 --csv $L/gen_g2.csv > $L/gen_g2.log 2>&1; grep -E "^G. (barerl|transformers):|Error" $L/gen_g2.log; tail -4 $L/gen_g2.log
finish
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_off_0.55 70 $R1 --offload-optimizer 0.55 --json $L/r1_off_0.55.json > $L/r1_off_0.55.log 2>&1; grep -E "^R1|Error" $L/r1_off_0.55.log
finish
