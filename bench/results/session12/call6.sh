#!/usr/bin/env bash
# Not run in session 12: no device time was left to start a machine. cp.async with an L2 prefetch-size hint
# (.L2::128B / .L2::256B) in paged attention's KV loads, against none: attention timings only (the same
# arithmetic in every form).
source bench/device_call.sh
P="python3 bench/results/session12/l2_hint_probe.py"
M=src/barerl/kernels/csrc/mma.cuh
$P plain
for hint in 128B 256B; do
  sed -i "s|cp.async.cg.shared.global\(.L2::[0-9]*B\)\? \[|cp.async.cg.shared.global.L2::$hint [|" $M; grep -c "L2::$hint" $M
  $P L2::$hint
done
finish
