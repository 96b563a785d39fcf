"""GRPO's rollouts as multi-turn episodes, when the config names an environment or tools.

For each prompt of a generation round, num_generations episodes: each gets a fresh environment
(`load_environment_factory`), whose `reset(row)` gives the first messages; `EpisodeLoop` plays them all at
once in the engine's step loop; each finished group is scored by the reward functions while the others
still play; the episodes become `Rollouts` like single-turn completions, with the turn of each token.

Design decisions:
- A completion is all of an episode after its prompt: the model's turns and the environment's messages.
  Reward functions get it as the messages after the prompt (TRL's form for tool calling), so the last
  message is the model's final answer; `completion_ids` are its ids. Only the model's tokens carry loss and
  advantage (`Rollouts.completion_turns`); the environment's are context.
- Rewards: the reward functions' weighted sum, plus, with an `environment_factory`, the episode's
  environment reward (the sum of its steps' rewards) as one more column, `rewards/environment/*`, weight 1.
  An environment that rewards episodes itself needs no reward function.
- Seeds: a group's seed is single-turn GRPO's (run seed, step, prompt index, round), so turn 0 samples what
  single-turn generation would; later turns follow `episode_loop.turn_seed`. A resumed run replays the same
  episodes. On the CPU the loop is `deterministic` (episode_loop.py), so a run reproduces bit for bit; on
  the GPU it never waits while the engine has work (with batch_invariant, bit for bit all the same).
  Truncated episodes (max_turns, max_completion_length) are `Rollouts.truncated`, so
  `mask_truncated_completions` applies to them.
- The environment's tool calls share one pool of `tool_num_workers` threads; environment steps have a pool
  with a thread per episode (a step mostly waits for its calls). Both live as long as the training run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from barerl.engine.sampling_params import SamplingParams
from barerl.train.config import GRPOConfig
from barerl.train.environments import load_environment_factory
from barerl.train.episode import ChatTokens, Episode
from barerl.train.episode_loop import EpisodeLoop, LoopStats
from barerl.train.episode_metrics import EpisodeStats
from barerl.train.losses import group_advantages, zero_std_groups
from barerl.train.rewards import RewardRunner, RewardScores
from barerl.train.rollouts import Rollouts, concatenate_scores, generate_rollouts, sampling_seed
from barerl.train.worker_pool import WorkerPool


@contextmanager
def rollout_generator(cfg: GRPOConfig, tokenizer, num_episodes: int) -> Iterator:
    """GRPO's rollout function for `cfg`: `generate_rollouts`, or for a multi-turn config a `MultiTurnRollouts`
    of up to `num_episodes` episodes a round (its pools closed on exit). Both take generate_rollouts' arguments."""
    if not cfg.multi_turn:
        yield generate_rollouts
        return
    rollouts = MultiTurnRollouts(cfg, tokenizer, num_episodes)
    try:
        yield rollouts
    finally:
        rollouts.close()


class MultiTurnRollouts:
    """Episodes for GRPO (`__call__`: generate_rollouts' contract), or to play and inspect (`group`, `play`:
    an evaluation plays greedy episodes)."""

    def __init__(self, cfg: GRPOConfig, tokenizer, num_episodes: int):
        self.cfg = cfg
        self.tool_pool = WorkerPool(cfg.tool_num_workers, "barerl-tool")
        self.steps = WorkerPool(num_episodes, "barerl-env")
        self.factory = load_environment_factory(cfg, pool=self.tool_pool)
        self.tokens = ChatTokens(tokenizer, cfg.max_prompt_length, cfg.chat_template_kwargs)
        self.sampling = SamplingParams.from_filter(cfg.sampling_filter, max_tokens=cfg.max_tokens_per_turn)

    def close(self) -> None:
        self.steps.close()
        self.tool_pool.close()

    def __call__(self, llm, tokenizer, rows: list[dict], cfg: GRPOConfig, step: int, runner: RewardRunner,
                 round_index: int = 0, first_index: int = 0, row_ids: list[int] | None = None) -> Rollouts:
        """cfg.num_generations episodes for each row, scored (`row_ids`: the rows' dataset indices, which reward
        errors name)."""
        groups = [self.group(row, sampling_seed(cfg.seed, step, first_index + i, round_index), cfg.num_generations,
                             llm.engine.max_model_len) for i, row in enumerate(rows)]
        pending: list = [None] * len(rows)

        def score(g: int) -> None:
            if runner.rewards:
                row = g if row_ids is None else row_ids[g]
                pending[g] = runner.submit(*_reward_inputs(rows[g], groups[g]), [row] * len(groups[g]))

        stats = self.play(llm, groups, on_group_done=score)
        generated = time.perf_counter()
        episodes = [e for group in groups for e in group]
        scores = _scores(pending, episodes, with_environment=bool(cfg.environment_factory))
        return Rollouts(
            [e.prompt_messages for e in episodes], [e.completion_messages for e in episodes],
            [e.prompt_ids for e in episodes], [e.completion_ids for e in episodes], [e.logprobs for e in episodes],
            np.array([e.truncated for e in episodes]), scores,
            group_advantages(scores.total.astype(np.float32), cfg.num_generations, cfg.scale_rewards),
            zero_std_groups(scores.total, cfg.num_generations), stats.wall_seconds, time.perf_counter() - generated,
            [e.turns for e in episodes], EpisodeStats.from_episodes(episodes, stats))

    def group(self, row: dict, group_seed: int, num_samples: int, max_model_len: int) -> list[Episode]:
        """`num_samples` fresh episodes of one dataset row."""
        group = []
        for sample in range(num_samples):
            env = self.factory()
            messages = env.reset(row)
            prompt_ids = self.tokens.prompt(messages, env.tools)
            budget = min(self.cfg.max_completion_length, max_model_len - len(prompt_ids))
            group.append(Episode(env, self.tokens, messages, prompt_ids, budget, self.cfg.max_turns, group_seed,
                                 sample))
        return group

    def play(self, llm, groups: list[list[Episode]], sampling: SamplingParams | None = None,
             on_group_done=None) -> LoopStats:
        """Play the episodes to their ends with the config's sampling (or `sampling`)."""
        loop = EpisodeLoop(llm.engine, self.steps, sampling or self.sampling, self.cfg.step_timeout,
                           deterministic=llm.model.device == "cpu")
        return loop.run(groups, on_group_done)


def _reward_inputs(row: dict, group: list[Episode]) -> tuple[list, list, dict]:
    """(prompts, completions, columns) of a group for the reward functions (TRL adds completion_ids)."""
    n = len(group)
    columns = {key: [value] * n for key, value in row.items() if key != "prompt"}
    columns["completion_ids"] = [e.completion_ids for e in group]
    return [e.prompt_messages for e in group], [e.completion_messages for e in group], columns


def _scores(pending: list, episodes: list[Episode], with_environment: bool) -> RewardScores:
    """The reward functions' scores, with the environment's rewards as one more column when asked."""
    scores = concatenate_scores([p.result() for p in pending]) if pending and pending[0] is not None else None
    if not with_environment:
        return scores
    env = np.array([np.nan if e.reward is None else e.reward for e in episodes], dtype=np.float64)
    if scores is None:
        return RewardScores(["environment"], env[:, None], np.nan_to_num(env))
    return RewardScores(scores.names + ["environment"], np.concatenate([scores.per_function, env[:, None]], axis=1),
                        scores.total + np.nan_to_num(env))
