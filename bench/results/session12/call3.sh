#!/usr/bin/env bash
# main as in call 2: G2 with transformers (call 2's run ran out of time after barerl's G2), G1 / G2 twice more
# without the peer (the spread), and the decode profile at G2's shape.
source bench/device_call.sh
G=bench/bench_generate.py
t gen_g2 260 python3 $G --workloads G2 --csv $L/gen_g2.csv > $L/gen_g2.log 2>&1; grep -E "^G. (barerl|transformers):|Error" $L/gen_g2.log
t gen_a 80 python3 $G --no-peer --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
t gen_b 80 python3 $G --no-peer --csv $L/gen_b.csv > $L/gen_b.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_b.log
t profile_g2 60 python3 bench/profile_decode.py --seqs 256 --context 384 > $L/profile_g2.log 2>&1; sed -n 1,16p $L/profile_g2.log
finish
