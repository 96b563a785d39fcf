#!/usr/bin/env bash
# Session 15, call 3: Nsight Compute counters of the decode step's largest kernels (ncu_probe.py): is paged
# attention at G1 bound by DRAM, or by issue / latency? And what the products' cuBLASLt kernels and the sampler do.
source bench/device_call.sh
which ncu > $L/ncu_where.txt 2>&1; cat $L/ncu_where.txt
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats --section ComputeWorkloadAnalysis"
t ncu 400 ncu --profile-from-start off --clock-control none $S python3 bench/results/session15/ncu_probe.py > $L/ncu.log 2>&1
grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Grid Size|Executed Instructions  |No Eligible|Memory Throughput|L2 Hit|Dynamic Shared|Static Shared|Block Size" $L/ncu.log | head -300
finish
