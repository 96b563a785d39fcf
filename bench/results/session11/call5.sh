#!/usr/bin/env bash
# main at the session's end: G1 / G2 with transformers' generate in the same call.
source bench/device_call.sh
t gen 420 python3 bench/bench_generate.py --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. |Error|ratio" $L/gen.log
finish
