"""The NCCL path (marked gpu): the bucketed reduce-scatter and all-gather over `NcclCommunicator` on one GPU
(world size 1: every piece goes through NCCL's send / recv to the rank itself), the gradient norm's blocks on
the GPU against the CPU's, and on a machine with 2 GPUs the same collectives on 2 MPI ranks against their
tree sum. NCCL refuses two ranks on one GPU (a communicator's ranks must be on distinct devices), so one GPU
runs the 1-rank checks only."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from barerl.distributed.collectives import all_gather, reduce_scatter
from barerl.distributed.group import ProcessGroup
from barerl.distributed.layout import ShardLayout
from barerl.distributed.norm import block_sums_of_squares

pytestmark = pytest.mark.gpu


def test_nccl_carries_the_bucketed_collectives_on_one_gpu():
    import cupy

    from barerl.distributed.communicator import NcclCommunicator

    comm = NcclCommunicator(ProcessGroup())
    host = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    layout = ShardLayout.build(host.shape[0], 1, 4096)
    assert layout.num_buckets > 20
    flat = cupy.asarray(host)
    reduce_scatter(comm, layout, flat)  # one rank: the sum of one piece, moved through NCCL into the staging
    all_gather(comm, layout, flat)
    np.testing.assert_array_equal(flat.get(), host)
    half = cupy.asarray(host.astype(np.float16))  # 2-byte elements move as bytes too (bf16 weights do so)
    reduce_scatter(comm, layout, half)
    np.testing.assert_array_equal(half.get(), host.astype(np.float16))


def test_the_norms_blocks_on_the_gpu_match_the_cpus():
    import cupy

    host = (np.random.default_rng(1).standard_normal(70_001) * 3).astype(np.float32)
    layout = ShardLayout.build(host.shape[0], 2, 1 << 20)
    gpu = block_sums_of_squares(cupy.asarray(host), 0, host.shape[0], layout.grain)
    cpu = block_sums_of_squares(host, 0, host.shape[0], layout.grain)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-13)


def test_two_gpus_reduce_scatter_and_all_gather_over_nccl(tmp_path):
    import cupy
    from test_mpi import ENV, MPIEXEC

    if cupy.cuda.runtime.getDeviceCount() < 2 or MPIEXEC is None:
        pytest.skip("needs 2 GPUs and mpiexec (NCCL takes one rank per GPU)")
    case = {"loop": "collectives", "output_dir": str(tmp_path), "device": "cuda", "num_elements": 1_000_003,
            "bucket": 100_000}
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([case]))
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(Path(__file__).with_name("mpi_cases.py")),
                             str(spec)], env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        outcome = json.loads((tmp_path / f"collectives-rank{rank}.json").read_text())
        assert outcome["shard_equal"] and outcome["gathered_equal"], (rank, outcome)
