#!/usr/bin/env bash
# Call 4's A runs again. Call 4 (and this script's first run) copied the previous sources from files that were
# not there (saved as *_old.cu), so their "A" ran B; here they come from git (4423a96). A only, on the same
# warm machine minutes after call 4's B runs.
source bench/device_call.sh
C=src/barerl/kernels/csrc
git cat-file -e 4423a96 || { echo "4423a96 is not in this copy's git"; exit 1; }
for f in sampling.cu paged_attention.cu; do git show 4423a96:$C/$f > $C/$f; done; git diff --stat -- $C | tail -1
t kernels_a 90 python3 bench/bench_decode_kernels.py --csv $L/kernels_a.csv > $L/kernels_a.log 2>&1
grep -E "^decode G1: 64 seqs x 640 ctx  |^decode G2|^sample (64|256) x 151936 (temperature 1|top-k 50) " $L/kernels_a.log
t profile_a 40 python3 bench/profile_decode.py > $L/profile_a.log 2>&1; sed -n 1,5p $L/profile_a.log; grep -E "^sample" $L/profile_a.log
t gen_a 80 python3 bench/bench_generate.py --no-peer --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
finish
