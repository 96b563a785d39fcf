#!/usr/bin/env bash
# session 10, calls 4-5: how fast one CTA per SM pulls a weight tile: cp.async vs the bulk-copy engine; call 5:
# with the shared-memory carveout raised (the script as committed after call 5).
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR; tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR
L=$OUT/logs; rm -rf $L; mkdir -p $L
timeout 120 python3 bench/results/session10/bulk_probe.py 2>&1 | tee $L/bulk_probe.log
tar -czf $OUT/logs.tgz -C $OUT logs
