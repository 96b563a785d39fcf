#!/usr/bin/env bash
# Session 14, call 5: T1 (the training step) with torch + transformers in the same process, default keep and
# linear outputs kept, after this session's training changes; G2 alone twice more (call 4 read 52.7k).
source bench/device_call.sh
t t1 150 python3 bench/bench_train_step.py --keep attention attention,linear --json $L/t1.json > $L/t1.log 2>&1; tail -8 $L/t1.log
for run in 1 2; do
  t gen_g2_$run 60 python3 bench/bench_generate.py --no-peer --workloads G2 --csv $L/gen_g2_$run.csv > $L/gen_g2_$run.log 2>&1
  grep -E "^G. barerl:|Error" $L/gen_g2_$run.log
done
finish
