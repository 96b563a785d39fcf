#!/usr/bin/env bash
# Ran the code now on branch mlp-decode (since removed from main: measured slower).
# Session 13, call 3: where mlp_decode's 24.7 us go (call 2: 15.7 us for the three separate ops).
source bench/device_call.sh
t probe 120 python3 bench/results/session13/mlp_probe.py > $L/probe.log 2>&1; cat $L/probe.log | tail -14
finish
