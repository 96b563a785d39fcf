"""What the data-parallel tests run as `mpiexec -n N python mpi_cases.py CASES.json` (or as plain python for
one process), case after case in the same processes:

- {"loop": "sft" | "grpo", "output_dir": ..., "config": {config overrides}, "fault": optional {"rank": r,
  "after_calls": c, "kind": "hang" | "kill"}}: trains a tiny model; every rank saves its final working
  weights (fp32) to `<output_dir>/weights-rank<r>.npy`. With a fault, that rank hangs or dies in its reward
  call c + 1 (GRPO: one call per prompt group).
- {"loop": "collectives", "output_dir": ..., "device": "cpu" | "cuda", "num_elements": n, "bucket": b}:
  bucketed reduce-scatter and all-gather of random per-rank buffers against their tree sum computed on every
  rank; each rank writes `<output_dir>/collectives-rank<r>.json` with the largest differences.
Plots are skipped (they cost seconds a run and no test looks at them).
"""

import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import PROMPTS, SFT_ROWS, tiny_model

from barerl.distributed import process_group
from barerl.train.config import GRPOConfig, SFTConfig
from barerl.train.demo import make_tokenizer
from barerl.train.grpo import train_grpo
from barerl.train.sft import train_sft


def varied_reward(prompts, completions, **_):
    """Deterministic, and different between most completions (so the advantages are not all zero)."""
    return [zlib.crc32(c.encode()) % 97 / 97 for c in completions]


def faulty(reward, fault):
    """`reward`, but on rank fault["rank"] its call after fault["after_calls"] calls hangs or kills the process."""
    calls = {"n": 0}

    def call(prompts, completions, **columns):
        calls["n"] += 1
        if process_group().rank == fault["rank"] and calls["n"] > fault["after_calls"]:
            if fault["kind"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        return reward(prompts, completions, **columns)

    call.__name__ = reward.__name__
    return call


def run(case: dict) -> None:
    out = Path(case["output_dir"])
    common = {"output_dir": str(out), "report_to": ("jsonl",), "lr_scheduler_type": "constant", "seed": 3,
              "save_steps": 0}
    model = tiny_model()
    if case["loop"] == "sft":
        cfg = SFTConfig(**{**common, "learning_rate": 1e-2, **case["config"]})
        train_sft(cfg, model=model, tokenizer=make_tokenizer(), rows=SFT_ROWS, show_progress=False)
    else:
        reward = varied_reward if "fault" not in case else faulty(varied_reward, case["fault"])
        cfg = GRPOConfig(**{**common, "learning_rate": 3e-2, "num_generations": 4, "max_completion_length": 3,
                            "max_prompt_length": 8, "log_completions_steps": 0, **case["config"]})
        train_grpo(cfg, model=model, tokenizer=make_tokenizer(), rows=PROMPTS, reward_funcs=[reward],
                   show_progress=False, engine_args={"num_kv_blocks": 64})
    trained = model.params if model.lora is None else model.lora.weights  # updated in place by training
    np.save(out / f"weights-rank{process_group().rank}.npy", trained.flat)


def collectives(case: dict) -> None:
    """reduce_scatter and all_gather against sums computed here from every rank's (seeded) buffer."""
    from barerl.distributed.collectives import all_gather, reduce_scatter
    from barerl.distributed.communicator import communicator_for
    from barerl.distributed.layout import ShardLayout, tree_sum

    group = process_group()
    xp = np
    if case["device"] == "cuda":
        import cupy as xp

        group.select_gpu()
    n, ranks = case["num_elements"], range(group.size)
    layout = ShardLayout.build(n, group.size, case["bucket"])
    every = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in ranks]
    want = tree_sum([a.copy() for a in every], lambda a, b: a.__iadd__(b))
    comm = communicator_for(group, case["device"])
    host = (lambda a: a) if xp is np else xp.asnumpy
    flat = xp.asarray(every[group.rank])
    reduce_scatter(comm, layout, flat)
    mine = layout.shard(group.rank)
    shard_equal = bool((host(flat[mine]) == want[mine]).all())
    all_gather(comm, layout, flat)
    result = {"shard_equal": shard_equal, "gathered_equal": bool((host(flat) == want).all()),
              "num_buckets": layout.num_buckets}
    out = Path(case["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"collectives-rank{group.rank}.json").write_text(json.dumps(result))


def main() -> None:
    from barerl.train.metrics import MetricsLogger

    MetricsLogger.plot = lambda self, path=None: None
    for case in json.loads(Path(sys.argv[1]).read_text()):
        collectives(case) if case["loop"] == "collectives" else run(case)


if __name__ == "__main__":
    main()
