#!/usr/bin/env bash
# session 10, call 10: load-order probe (pattern_probe.py).
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $OUT/logs; timeout 60 python3 bench/results/session10/pattern_probe.py 2>&1 | tee $OUT/logs/pattern_probe.log
