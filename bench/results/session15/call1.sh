#!/usr/bin/env bash
# Session 15, call 1: paged attention's occupancy at G1. Pipeline shapes alone and with G1 split in two (the
# UNROLL 2 ring fits 8 CTAs per SM: 1,024 CTAs in one wave), GRPO's shared prompt blocks, and G1 / G2 end to end.
source bench/device_call.sh
PA=barerl.kernels.paged_attention
SPLIT="$PA._UNSPLIT_CTAS_PER_SM=4"
t paged_whole 120 python3 bench/profile_attention.py --paged 4,2 2,2 2,3 3,2 1,4 2,4 > $L/paged_whole.log 2>&1; cat $L/paged_whole.log
t paged_split 120 python3 bench/with_settings.py $SPLIT -- bench/profile_attention.py --paged 4,2 2,2 1,4 1,3 > $L/paged_split.log 2>&1; cat $L/paged_split.log
G="bench/bench_generate.py --no-peer"
t g1_a 60 python3 $G --workloads G1 --csv $L/g1_a.csv > $L/g1_a.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_a.log
t g1_split_u2 60 python3 bench/with_settings.py $SPLIT $PA._UNROLL=2 -- $G --workloads G1 --csv $L/g1_split_u2.csv > $L/g1_split_u2.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_split_u2.log
t g1_u2 60 python3 bench/with_settings.py $PA._UNROLL=2 -- $G --workloads G1 --csv $L/g1_u2.csv > $L/g1_u2.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_u2.log
t g1_a2 60 python3 $G --workloads G1 --csv $L/g1_a2.csv > $L/g1_a2.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_a2.log
t g1_split_u2_2 60 python3 bench/with_settings.py $SPLIT $PA._UNROLL=2 -- $G --workloads G1 --csv $L/g1_split_u2_2.csv > $L/g1_split_u2_2.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_split_u2_2.log
finish
t g2_a 60 python3 $G --workloads G2 --csv $L/g2_a.csv > $L/g2_a.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_a.log
t g2_u2 60 python3 bench/with_settings.py $PA._UNROLL=2 -- $G --workloads G2 --csv $L/g2_u2.csv > $L/g2_u2.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_u2.log
t prof_split_u2 60 python3 bench/with_settings.py $SPLIT $PA._UNROLL=2 -- bench/profile_decode.py > $L/prof_split_u2.log 2>&1; cat $L/prof_split_u2.log
t prof_a 60 python3 bench/profile_decode.py > $L/prof_a.log 2>&1; cat $L/prof_a.log
finish
