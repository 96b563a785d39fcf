#!/usr/bin/env bash
# session 10, call 2: norm_linear with x rows loaded in a per-CTA rotated order and no loads of absent rows;
# its tests, the micro-benchmark, ncu's view of it, and G1 / G2 when the fused gate_up beats the unfused ops.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
L=$OUT/logs; rm -rf $L; mkdir -p $L
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_norm_linear.py > $L/tests.log 2>&1; tail -8 $L/tests.log
t kernels 60 python3 bench/bench_norm_linear.py 2>&1 | tee $L/bench_norm_linear.log
t ncu 150 ncu --clock-control none --kernel-name norm_linear --launch-skip 2 --launch-count 2 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
  python3 bench/results/session10/ncu_norm_linear.py > $L/ncu.log 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Stall|Warp Cycles|Issued|Registers|Achieved Occ|Dynamic Shared|rows|==PROF==|Error" $L/ncu.log | head -60
ratio=$(awk '$1=="gate_up" && $2==64 {print $6}' $L/bench_norm_linear.log)
if awk "BEGIN{exit !($ratio < 1.0)}"; then
  t gen 150 python3 bench/bench_generate.py --no-peer --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. barerl:|Error" $L/gen.log
  t profile 60 python3 bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,14p $L/profile.log
fi
tar -czf $OUT/cupy_cache.tgz -C $CUPY_CACHE_DIR .
tar -czf $OUT/logs.tgz -C $OUT logs
