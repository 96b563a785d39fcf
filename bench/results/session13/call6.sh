#!/usr/bin/env bash
# Session 13, call 6: main's G2 again (two runs alone), then G2 with transformers in the same process.
source bench/device_call.sh
for run in 1 2; do
  t gen_g2_$run 60 python3 bench/bench_generate.py --no-peer --workloads G2 --csv $L/gen_g2_$run.csv > $L/gen_g2_$run.log 2>&1
  grep -E "^G. barerl:|Error" $L/gen_g2_$run.log
done
t gen_g2_peer $((380 - SECONDS)) python3 bench/bench_generate.py --workloads G2 --csv $L/gen_g2_peer.csv > $L/gen_g2_peer.log 2>&1
grep -E "^G. (barerl|transformers):|Error" $L/gen_g2_peer.log; tail -3 $L/gen_g2_peer.log
finish
