"""Workload R1 (shared/WORKLOADS.md) on N GPUs, one process per GPU, started by MPI:

1. Scaling: every rank runs R1's batch (8 prompts x 8 samples, 1,024-token completions, one update), so the
   global batch grows with N (per_device_train_batch_size is each rank's, as in TRL). Reports s/step, trained
   tokens/s of the whole job and the scaling efficiency against the 1-GPU run in the same --out folder
   (t(1) / t(N) at a fixed per-GPU batch).
2. Exactness: the 1-GPU R1 batch (64 completions) shared by the N ranks for one step (gradient_sum tree),
   checkpointed; against the 1-GPU run's checkpoint: the fp32 master weights' largest difference, relative
   to the largest weight and to the largest update, and the engine/trainer log-prob mismatch of both.

    cd bench && mpirun -n N python bench_data_parallel.py --out DIR [--steps 3] [--quick]

Run N = 1 first, then 2, 4, 8 with the same DIR; each run prints its line and writes DIR/result-N.json.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import numpy as np
from grpo_barerl import build_parser, run, summarize
from shapes import GRPO, model_config


def master_weights(checkpoint: Path) -> np.ndarray:
    from barerl.formats.safetensors import read_safetensors

    return np.array(read_safetensors(str(checkpoint / "trainer_state" / "optimizer.safetensors"))["master"])


def initial_master(quick: bool) -> np.ndarray:
    """R1's seeded random weights as grpo_barerl.py draws them (on the GPU: CuPy's draws, bf16), as fp32: the
    master before the step."""
    from barerl.model.model import Model

    device, dtype = ("cpu", "float32") if quick else ("cuda", "bfloat16")
    flat = Model.random(model_config(GRPO["R1"].shape, quick), device=device, dtype=dtype, seed=0).params.flat
    if device == "cuda":
        import cupy

        flat = cupy.asnumpy(flat)
    return flat.astype(np.float32)


def compare(out: Path, ranks: int, quick: bool) -> dict:
    """The N-rank step's master weights against the 1-rank step's."""
    one, many = (master_weights(out / f"exact-{n}" / "checkpoint-1") for n in (1, ranks))
    start = initial_master(quick)
    difference = float(np.abs(many - one).max())
    return {"max_weight_difference": difference,
            "relative_to_weights": difference / float(np.abs(one).max()),
            "relative_to_update": difference / max(float(np.abs(one - start).max()), 1e-30),
            "bitwise_equal": bool(np.array_equal(many.view(np.uint32), one.view(np.uint32)))}


def release_device_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


def main() -> None:
    from barerl.distributed import process_group

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder shared by the runs of 1, 2, 4, 8 GPUs")
    parser.add_argument("--steps", type=int, default=3, help="scaling steps; the first is a warm-up")
    parser.add_argument("--micro-batch", type=int, default=16, help="completions per micro-batch")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences on the CPU")
    args = parser.parse_args()
    group = process_group()
    device = "cpu" if args.quick else "cuda"
    if device == "cuda":
        group.select_gpu()
    out, ranks, micro = Path(args.out), group.size, args.micro_batch
    r1 = build_parser().parse_args(["--steps", str(args.steps), "--micro-batch", str(micro)] + ["--quick"] * args.quick)
    scaling = run(r1, num_prompts=8 * ranks, output_dir=out / f"scaling-{ranks}")
    release_device_memory(device)  # the first run's engine and arrays, before the second's
    # the 1-GPU batch shared: generation_batch_size is the whole job's; one update (gradient_accumulation_steps
    # = each rank's micro-batch steps)
    accumulation = max(1, 64 // (micro * ranks))
    exact = run(argparse.Namespace(**{**vars(r1), "steps": 1}),
                num_prompts=8, output_dir=out / f"exact-{ranks}",
                overrides={"generation_batch_size": 64, "gradient_accumulation_steps": accumulation,
                           "gradient_sum": "tree", "save_strategy": "steps", "save_steps": 1})
    if not group.is_main:
        return
    scaling, exact = summarize(scaling), summarize(exact)
    result = {"gpus": ranks, "step_s": scaling["step_s"], "tokens_per_s": scaling["trained_tokens"] / scaling["step_s"],
              "scaling": scaling, "exact_mismatch_max": exact["mismatch_max"]}
    baseline = out / "result-1.json"
    if ranks > 1 and baseline.is_file():
        one = json.loads(baseline.read_text())
        result["scaling_efficiency"] = one["step_s"] / result["step_s"]
        result["against_1_gpu"] = compare(out, ranks, args.quick)
        result["exact_mismatch_max_1_gpu"] = one["exact_mismatch_max"]
    (out / f"result-{ranks}.json").write_text(json.dumps(result, indent=1))
    line = (f"R1 on {ranks} GPU{'s' * (ranks > 1)}: {result['step_s']:.2f} s/step (generate "
            f"{scaling['generate']:.2f}, train {scaling['train']:.2f}), {result['tokens_per_s']:,.0f} "
            f"trained tokens/s, peak {scaling['trainer_peak_gib']:.1f} GiB per GPU")
    if "against_1_gpu" in result:
        a = result["against_1_gpu"]
        line += (f"; scaling efficiency {result['scaling_efficiency']:.1%}; one step of the 1-GPU batch: master "
                 f"weights {'bitwise equal' if a['bitwise_equal'] else 'differ'} (max {a['max_weight_difference']:.2e}"
                 f", {a['relative_to_weights']:.2e} of the largest weight, {a['relative_to_update']:.2e} of the "
                 f"largest update), log-prob mismatch {exact['mismatch_max']:.2e} (1 GPU "
                 f"{result['exact_mismatch_max_1_gpu']:.2e})")
    print(line, flush=True)


if __name__ == "__main__":
    main()
