"""GRPO on several ranks: who generates which prompts, and one batch of rollouts for all.

- A generation round's prompts are cut into equal contiguous blocks, one per rank, so a prompt's whole group
  is generated and scored on one rank (group advantages need nothing from the others). Sampling seeds come
  from each prompt's index in the whole round, so which rank drew a prompt does not change its completions.
- The ranks' rollouts are then gathered, in prompt order, into the batch one process would have generated:
  advantages are recomputed over it (scale_rewards "batch" takes the whole batch's std), and from there the
  loop runs as on one process (packing into micro-batches, dynamic sampling's decisions, metrics), every rank
  training on its block of the micro-batches. Moving token ids and log-probs between ranks costs next to
  nothing beside generating them.
- Batch sizes follow TRL: per_device_train_batch_size is each rank's, so the default generation batch grows
  with the number of ranks, while an explicit generation_batch_size is the whole job's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from barerl.distributed.data_parallel import DataParallel
from barerl.train.losses import zero_std_groups
from barerl.train.rollouts import Rollouts


@dataclass(frozen=True)
class GenerationPlan:
    num_prompts: int  # prompts of one generation round, all ranks together
    steps_per_generation: int  # micro-batch steps (per rank) one generation batch feeds
    local_completions: int  # completions this rank generates per round

    def prompt_share(self, rank: int, size: int) -> slice:
        """Rank's prompts among the round's num_prompts."""
        per_rank = self.num_prompts // size
        return slice(rank * per_rank, (rank + 1) * per_rank)


def generation_plan(cfg, num_ranks: int) -> GenerationPlan:
    """A GRPOConfig's generation round on `num_ranks` ranks; a clear error where the prompts cannot be shared."""
    completions = cfg.generation_batch_size_on(num_ranks)
    if completions % cfg.num_generations:
        raise ValueError(f"num_generations: the generation batch ({completions} completions on {num_ranks} "
                         f"processes) must be a multiple of num_generations ({cfg.num_generations})")
    num_prompts = completions // cfg.num_generations
    if num_prompts % num_ranks:
        raise ValueError(f"generation_batch_size: the generation batch's {num_prompts} prompts ({completions} "
                         f"completions / num_generations) cannot be shared equally by {num_ranks} processes, each "
                         "generating whole groups: make it a multiple of num_generations * the process count")
    return GenerationPlan(num_prompts, cfg.steps_per_generation_on(num_ranks), completions // num_ranks)


def gather_rollouts(dp: DataParallel, local: Rollouts, num_generations: int, scale_rewards: str) -> Rollouts:
    """Every rank's rollouts as one batch, in prompt order (module docstring); times are the slowest rank's."""
    if dp.size == 1:
        return local
    parts = dp.gather_in_order([local], "rollouts")
    joined = Rollouts.concatenate(parts, num_generations, scale_rewards)
    return dataclasses.replace(joined, zero_std=zero_std_groups(joined.scores.total, num_generations),
                               generate_seconds=max(p.generate_seconds for p in parts),
                               score_seconds=max(p.score_seconds for p in parts))
