"""Data parallelism on 2 MPI ranks (the `test` extra's mpi4py and MPICH wheels; `mpiexec` runs
tests/distributed/mpi_cases.py): a step on 2 ranks gives one rank's fp32 weights bit for bit on the same
global batch, for SFT and each GRPO loss type, with the optimizer state sharded (ZeRO-1) or not; checkpoints
of 2 ranks resume on 1 and the other way round, to the same bits; a hung or killed rank ends the job with a
clear message within the timeout, leaving the last checkpoint valid; and `mpiexec -n 2 barerl sft` runs as
`barerl sft` does.

Bitwise needs `gradient_sum: tree` (every case sets it) and, for GRPO, no importance-sampling correction:
the CPU engine's sampling log-probs, which that correction reads, depend on what else is in the engine's
batch (BLAS blocks a product by its row count), and 2 ranks' engines each run half the batch.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

CASES = Path(__file__).with_name("mpi_cases.py")
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
pytestmark = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs MPI: mpi4py and an mpiexec (pip install -e '.[test]' installs both from PyPI)")

# One BLAS thread per rank: the same arithmetic in every run, and no oversubscribed cores.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

SFT = {"max_steps": 2, "per_device_train_batch_size": 4, "max_tokens_per_microbatch": 24, "eval_split": 0.1,
       "eval_steps": 1, "gradient_sum": "tree", "max_grad_norm": 0.5, "weight_decay": 0.1}
GRPO = {"max_steps": 2, "generation_batch_size": 16, "per_device_train_batch_size": 4, "gradient_sum": "tree",
        "importance_sampling_correction": False, "weight_decay": 0.1}
# name -> (loop, config, gradient_accumulation_steps on one rank (two ranks take half: the same global batch))
RUNS = {
    "sft": ("sft", SFT, 4),
    "sft-replicated": ("sft", {**SFT, "zero_stage": 0}, 4),
    "grpo": ("grpo", {**GRPO, "loss_type": "grpo", "beta": 0.1}, 4),
    "dr_grpo": ("grpo", {**GRPO, "loss_type": "dr_grpo", "zero_stage": 0}, 4),
    "dapo": ("grpo", {**GRPO, "loss_type": "dapo", "offload_optimizer": True}, 2),  # two updates per generation
    "bnpo": ("grpo", {**GRPO, "loss_type": "bnpo", "scale_rewards": "batch", "max_grad_norm": 0.05}, 4),
}
KEYS = ("loss", "grad_norm", "reward", "entropy", "eval_loss", "kl", "num_tokens")  # metrics logged alike


def case(name: str, root: Path, ranks: int, **extra) -> dict:
    loop, config, accumulation = RUNS[name]
    config = {**config, "gradient_accumulation_steps": accumulation // ranks, "save_steps": 1,
              "ddp_bucket_cap_mb": 0.004, **extra.pop("config", {})}
    return {"loop": loop, "output_dir": str(root / f"{name}-{ranks}"), "config": config, **extra}


def mpiexec(ranks: int, cases: list[dict], tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    spec = tmp / f"cases-{ranks}-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps(cases))
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(CASES), str(spec)], env=ENV,
                          capture_output=True, text=True, timeout=timeout, check=False)


def weights(output_dir: str, rank: int = 0) -> np.ndarray:
    return np.load(Path(output_dir) / f"weights-rank{rank}.npy")


def logged(output_dir: str) -> list[dict]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k in KEYS} for line in lines]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of RUNS on one rank and on two (plus the collectives' check), once for the module."""
    root = tmp_path_factory.mktemp("dp")
    started = time.monotonic()
    one = mpiexec(1, [case(name, root, 1) for name in RUNS], root)
    assert one.returncode == 0, one.stderr[-4000:]
    middle = time.monotonic()
    collectives = {"loop": "collectives", "output_dir": str(root / "collectives"), "device": "cpu",
                   "num_elements": 10_007, "bucket": 1000}
    two = mpiexec(2, [collectives] + [case(name, root, 2) for name in RUNS], root)
    assert two.returncode == 0, two.stderr[-4000:]
    print(f"\n1 rank: {middle - started:.1f} s, 2 ranks: {time.monotonic() - middle:.1f} s for {len(RUNS)} runs")
    return root


def test_bucketed_reduce_scatter_and_all_gather_give_the_tree_sum(runs):
    for rank in (0, 1):
        result = json.loads((runs / "collectives" / f"collectives-rank{rank}.json").read_text())
        assert result["shard_equal"] and result["gathered_equal"] and result["num_buckets"] > 5, (rank, result)


@pytest.mark.parametrize("name", list(RUNS))
def test_two_ranks_give_one_ranks_weights_bit_for_bit(runs, name):
    one, two = str(runs / f"{name}-1"), str(runs / f"{name}-2")
    np.testing.assert_array_equal(weights(two, 0), weights(two, 1))  # the ranks agree
    np.testing.assert_array_equal(weights(two), weights(one))
    assert logged(two) == logged(one)  # rank 0 logged the whole batch's metrics, once per step
    assert not (Path(two) / "metrics-rank1.jsonl").exists()
    assert sorted(p.name for p in Path(two).glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
