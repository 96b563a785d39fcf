#!/usr/bin/env bash
# Call 4's A runs again: its copy of the previous sources had not travelled, so its "A" ran B. A only, on the
# same (still warm) machine minutes after call 4's B runs.
source bench/device_call.sh
C=src/barerl/kernels/csrc
cp .carry/ab_old/sampling.cu .carry/ab_old/paged_attention.cu $C/ && git diff --stat -- $C | tail -1
t kernels_a 90 python3 bench/bench_decode_kernels.py --csv $L/kernels_a.csv > $L/kernels_a.log 2>&1
grep -E "^decode G1: 64 seqs x 640 ctx  |^decode G2|^sample (64|256) x 151936 (temperature 1|top-k 50) " $L/kernels_a.log
t profile_a 40 python3 bench/profile_decode.py > $L/profile_a.log 2>&1; sed -n 1,5p $L/profile_a.log; grep -E "^sample" $L/profile_a.log
t gen_a 80 python3 bench/bench_generate.py --no-peer --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
finish
