"""Data parallelism on 2 MPI ranks (the `test` extra's mpi4py and MPICH wheels; `mpiexec` runs
tests/distributed/mpi_cases.py): a step on 2 ranks gives one rank's fp32 weights bit for bit on the same
global batch, for SFT and each GRPO loss type, with the optimizer state sharded (ZeRO-1) or not, and for LoRA
(the adapters' bits: their state sharded, their dropout masks drawn by the step's micro-batch index); checkpoints
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
LORA = {"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.1}
# name -> (loop, config, gradient_accumulation_steps on one rank (two ranks take half: the same global batch))
RUNS = {
    "sft": ("sft", SFT, 4),
    "sft-replicated": ("sft", {**SFT, "zero_stage": 0}, 4),
    "grpo": ("grpo", {**GRPO, "loss_type": "grpo", "beta": 0.1}, 4),
    "dr_grpo": ("grpo", {**GRPO, "loss_type": "dr_grpo", "zero_stage": 0}, 4),
    "dapo": ("grpo", {**GRPO, "loss_type": "dapo", "offload_optimizer": True}, 2),  # two updates per generation
    "bnpo": ("grpo", {**GRPO, "loss_type": "bnpo", "scale_rewards": "batch", "max_grad_norm": 0.05}, 4),
    "sft-lora": ("sft", {**SFT, **LORA}, 4),  # the adapters sharded, their dropout masks drawn alike
    "grpo-lora": ("grpo", {**GRPO, **LORA, "loss_type": "dapo", "beta": 0.1, "offload_optimizer": True}, 4),
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


FAULT_TIMEOUT = 4.0  # ddp_timeout of the fault runs, seconds


def fault_run(root: Path, kind: str):
    """bnpo on 2 ranks, rank 1 hanging or dying in its reward at step 2 (after its 2 prompts of step 1)."""
    run = case("bnpo", root, 2, fault={"rank": 1, "after_calls": 2, "kind": kind},
               config={"ddp_timeout": FAULT_TIMEOUT})
    run["output_dir"] += f"-{kind}"
    started = time.monotonic()
    result = mpiexec(2, [run], root, timeout=120)
    return run["output_dir"], result, time.monotonic() - started


@pytest.fixture(scope="module")
def faults(runs):
    return {kind: fault_run(runs, kind) for kind in ("hang", "kill")}


def test_a_hung_rank_ends_the_job_within_the_timeout_naming_it(faults):
    output_dir, result, seconds = faults["hang"]
    assert result.returncode != 0
    assert "rollouts: no word from rank 1 for 4 s (ddp_timeout): dead or hung; ending the job" in result.stderr
    assert seconds < FAULT_TIMEOUT + 60, seconds  # start-up and step 1 included (the hang would last an hour)
    assert sorted(p.name for p in Path(output_dir).glob("checkpoint-*")) == ["checkpoint-1"]


def test_a_killed_rank_ends_the_job(faults):
    output_dir, result, seconds = faults["kill"]
    said = (result.stdout + result.stderr).lower()  # the launcher's words: MPICH's hydra prints on stdout
    assert result.returncode != 0 and "signal 9" in said.replace(":", ""), said[-2000:]
    assert seconds < FAULT_TIMEOUT + 60, seconds
    assert (Path(output_dir) / "checkpoint-1" / "trainer_state" / "state.json").is_file()


def test_checkpoints_resume_on_another_number_of_ranks_to_the_same_bits(runs, faults):
    """2 ranks from 1 rank's checkpoint of step 1, 1 rank from 2 ranks' (the hung job's, sharded state
    gathered by rank 0): step 2 lands on the uninterrupted runs' bits."""
    resumes = {}
    for ranks, source in ((2, 1), (1, 2)):
        cases = []
        for name in ("sft", "bnpo", "sft-lora"):
            checkpoint = faults["hang"][0] if (name, ranks) == ("bnpo", 1) else str(runs / f"{name}-{source}")
            run = case(name, runs, ranks, config={"resume_from_checkpoint": str(Path(checkpoint) / "checkpoint-1")})
            run["output_dir"] += f"-resumed-from-{source}"
            cases.append(run)
            resumes[run["output_dir"]] = str(runs / f"{name}-1")
        result = mpiexec(ranks, cases, runs)
        assert result.returncode == 0, result.stderr[-4000:]
    for resumed, uninterrupted in resumes.items():
        np.testing.assert_array_equal(weights(resumed), weights(uninterrupted), resumed)
        assert logged(resumed) == logged(uninterrupted)[1:], resumed  # its own log starts at step 2


def test_mpiexec_runs_the_barerl_command_unchanged(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from train_helpers import SFT_ROWS, tiny_model

    from barerl.model.checkpoint import save_checkpoint
    from barerl.train.demo import make_tokenizer

    model, folder, data = tiny_model(), tmp_path / "model", tmp_path / "sft.jsonl"
    save_checkpoint(folder, model.cfg, model.params, tokenizer=make_tokenizer())
    data.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    out = tmp_path / "run"
    result = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "barerl", "sft", "--model", str(folder), "--dataset", str(data),
         "--output-dir", str(out), "--max_steps", "3", "--per_device_train_batch_size", "4"],
        env=ENV, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("SFT done: 3 steps") == 1  # rank 0 reports
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]
    assert (out / "checkpoint-3" / "model.safetensors").is_file() and (out / "curves.png").is_file()
