#!/usr/bin/env bash
# Session 15, call 4: paged attention with 46% fewer instructions a round (compile-time cache geometry, a
# mask-free path for full rounds, one block-table lookup per 4-token run, bf16 unpacked by one integer op, ex2
# on the SFU alone): GPU tests, kernel A/B against HEAD before it (.ab/old), G1 / G2 A/B, profile, ncu.
source bench/device_call.sh
OLD="env PYTHONPATH=$PWD/.ab/old/src:$PWD/bench"
t tests 300 python3 -m pytest -q -x -m gpu tests/kernels/test_paged_attention.py tests/kernels/test_model_gpu.py tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t paged_old 60 $OLD python3 bench/profile_attention.py --paged 4,2 > $L/paged_old.log 2>&1; cat $L/paged_old.log
t paged_new 90 python3 bench/profile_attention.py --paged 4,2 2,3 2,2 8,1 > $L/paged_new.log 2>&1; cat $L/paged_new.log
G="bench/bench_generate.py --no-peer"
for run in 1 2; do
  t g1_old$run 60 $OLD python3 $G --workloads G1 --csv $L/g1_old$run.csv > $L/g1_old$run.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_old$run.log
  t g1_new$run 60 python3 $G --workloads G1 --csv $L/g1_new$run.csv > $L/g1_new$run.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_new$run.log
done
finish
t g2_old 60 $OLD python3 $G --workloads G2 --csv $L/g2_old.csv > $L/g2_old.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_old.log
t g2_new 60 python3 $G --workloads G2 --csv $L/g2_new.csv > $L/g2_new.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_new.log
t prof_new 60 python3 bench/profile_decode.py > $L/prof_new.log 2>&1; cat $L/prof_new.log
S="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy"
t ncu 120 ncu --profile-from-start off --clock-control none -k regex:paged_attention_split $S python3 bench/results/session15/ncu_probe.py > $L/ncu.log 2>&1
grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Executed Instructions  |No Eligible|Achieved Occupancy" $L/ncu.log
finish
