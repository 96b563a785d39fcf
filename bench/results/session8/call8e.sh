#!/usr/bin/env bash
# session 8, call 5: GPU tests of paged attention after its SM count moved to launch.multiprocessors; G2 again.
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR $HOME/.cache/barerl
tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR; cp .carry/cublaslt-*.json $HOME/.cache/barerl/
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
t tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_paged_attention.py tests/kernels/test_launch_rules.py 2>&1 | tail -2
t g2 $((200 - SECONDS)) python3 bench/bench_generate.py --no-peer --workloads G2 --csv /tmp/g2.csv 2>&1 | grep -E "new tok/s|TB/s"
