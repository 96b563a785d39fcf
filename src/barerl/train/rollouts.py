"""Rollouts for GRPO: generate a group of completions per prompt with the engine, score them, turn them into
packed training batches with per-token advantages and the engine's sampling log-probs.

Seeds are derived from (run seed, step, prompt index), so the same run reproduces the same completions,
and a resumed run the same completions it would have drawn without the interruption.

Multi-turn rollouts (train/multi_turn.py) fill the same `Rollouts`: a completion is then all of an episode
after its prompt, and `completion_turns` tells the sampled tokens (which carry the loss) from the
environment's (context only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from barerl.engine.sampling_params import SamplingParams
from barerl.train.data import Example, PackedBatch, encode_prompt, is_conversational
from barerl.train.episode_metrics import EpisodeStats
from barerl.train.losses import group_advantages, zero_std_groups
from barerl.train.preflight import check_prompt_fits
from barerl.train.rewards import RewardRunner, RewardScores


@dataclass
class Rollouts:
    """One generation batch, completions in group order (group g holds completions g*G .. g*G+G-1)."""

    prompts: list  # the dataset's prompt value for each completion (string or messages)
    completions: list  # text, or [{"role": "assistant", "content": text}] for chat prompts
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    engine_logprobs: list[list[float]]
    truncated: np.ndarray  # (N,) bool: stopped by max_completion_length
    scores: RewardScores
    advantages: np.ndarray  # (N,) fp32
    zero_std: np.ndarray  # (G,) bool: groups whose rewards are all equal
    generate_seconds: float
    score_seconds: float
    # multi-turn: per completion token, the turn that sampled it (-1: the environment's); None: all sampled
    completion_turns: list[list[int]] | None = None
    episodes: EpisodeStats | None = None  # multi-turn: what the episodes did

    def __len__(self) -> int:
        return len(self.completion_ids)

    def select(self, keep: np.ndarray) -> Rollouts:
        """The completions where keep (N,) is True (e.g. DAPO's dynamic-sampling filter)."""
        idx = np.flatnonzero(keep)
        pick = lambda xs: [xs[i] for i in idx]
        scores = RewardScores(self.scores.names, self.scores.per_function[idx], self.scores.total[idx])
        return Rollouts(pick(self.prompts), pick(self.completions), pick(self.prompt_ids),
                        pick(self.completion_ids), pick(self.engine_logprobs), self.truncated[idx], scores,
                        self.advantages[idx], self.zero_std, self.generate_seconds, self.score_seconds,
                        None if self.completion_turns is None else pick(self.completion_turns),
                        None if self.episodes is None else self.episodes.select(idx))

    def informative(self, group_size: int) -> Rollouts:
        """Only the groups whose rewards differ (the others have zero advantage: no signal)."""
        return self.select(np.repeat(~self.zero_std, group_size))

    @classmethod
    def concatenate(cls, parts: list[Rollouts], group_size: int, scale_rewards: str) -> Rollouts:
        """Several generation rounds as one batch; advantages are recomputed over the whole of it."""
        join = lambda key: [x for p in parts for x in getattr(p, key)]
        scores = concatenate_scores([p.scores for p in parts])
        total = scores.total.astype(np.float32)
        multi_turn = parts[0].episodes is not None
        return cls(join("prompts"), join("completions"), join("prompt_ids"), join("completion_ids"),
                   join("engine_logprobs"), np.concatenate([p.truncated for p in parts]), scores,
                   group_advantages(total, group_size, scale_rewards), zero_std_groups(total, group_size),
                   sum(p.generate_seconds for p in parts), sum(p.score_seconds for p in parts),
                   join("completion_turns") if multi_turn else None,
                   EpisodeStats.concatenate([p.episodes for p in parts]) if multi_turn else None)

    def sampled_mask(self, i: int) -> list[int]:
        """1 for each token of completion i the model sampled, 0 for the environment's."""
        if self.completion_turns is None:
            return [1] * len(self.completion_ids[i])
        return [int(t >= 0) for t in self.completion_turns[i]]

    def examples(self, mask_truncated: bool) -> list[Example]:
        out = []
        for i, (p, c, cut) in enumerate(zip(self.prompt_ids, self.completion_ids, self.truncated)):
            trained = 0 if (mask_truncated and cut) else 1
            out.append(Example(p + c, [0] * len(p) + [trained * m for m in self.sampled_mask(i)]))
        return out


def sampling_seed(seed: int, step: int, index: int, round_index: int = 0) -> int:
    key = [seed, step, index] + ([round_index] if round_index else [])  # extra rounds: dynamic sampling
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0])


def generate_rollouts(llm, tokenizer, rows: list[dict], cfg, step: int, runner: RewardRunner,
                      round_index: int = 0, first_index: int = 0, row_ids: list[int] | None = None) -> Rollouts:
    """Sample cfg.num_generations completions for each row's prompt and score them; `first_index`: the first
    row's index in the whole round (its sampling seed's), where several processes share the round; `row_ids`:
    the rows' indices in the dataset, which reward errors name.

    Each prompt's group goes to the reward runner the moment its last sample finishes, so rewards that run
    in worker processes are computed while the engine is still generating the other groups."""
    start = time.perf_counter()
    prompt_ids = [encode_prompt(row["prompt"], tokenizer, cfg.max_prompt_length, cfg.chat_template_kwargs)
                  for row in rows]
    if cfg.max_prompt_length is None:  # else check_positions covered every prompt
        for i, ids in enumerate(prompt_ids):
            check_prompt_fits(len(ids), i if row_ids is None else row_ids[i], cfg, llm.model.cfg.max_position_embeddings)
    params = [
        SamplingParams.from_filter(cfg.sampling_filter, n=cfg.num_generations, max_tokens=cfg.max_completion_length,
                                   logprobs=True, seed=sampling_seed(cfg.seed, step, first_index + i, round_index))
        for i in range(len(rows))
    ]
    groups: list[dict | None] = [None] * len(rows)

    def score_group(i: int, output) -> None:
        groups[i] = _group(rows[i], prompt_ids[i], output)
        g = groups[i]
        row = i if row_ids is None else row_ids[i]
        g["pending"] = runner.submit(g["prompts"], g["completions"], g["columns"], [row] * len(g["prompts"]))

    llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False, on_finished=score_group)
    generated = time.perf_counter()
    scores = concatenate_scores([g["pending"].result() for g in groups])
    advantages = group_advantages(scores.total.astype(np.float32), cfg.num_generations, cfg.scale_rewards)
    flat = lambda key: [x for g in groups for x in g[key]]
    return Rollouts(flat("prompts"), flat("completions"), flat("prompt_ids"), flat("completion_ids"),
                    flat("logprobs"), np.array(flat("truncated")), scores, advantages,
                    zero_std_groups(scores.total, cfg.num_generations), generated - start,
                    time.perf_counter() - generated)


def _group(row: dict, prompt_ids: list[int], output) -> dict:
    """One prompt's samples as the lists Rollouts holds, plus the reward columns (TRL adds completion_ids)."""
    chat = is_conversational(row["prompt"])
    samples = output.outputs
    n = len(samples)
    completions = [[{"role": "assistant", "content": s.text}] if chat else s.text for s in samples]
    completion_ids = [list(s.token_ids) for s in samples]
    columns = {key: [value] * n for key, value in row.items() if key != "prompt"}
    columns["completion_ids"] = completion_ids
    return {"prompts": [row["prompt"]] * n, "completions": completions, "prompt_ids": [list(prompt_ids)] * n,
            "completion_ids": completion_ids, "logprobs": [list(s.logprobs) for s in samples],
            "truncated": [s.finish_reason == "length" for s in samples], "columns": columns}


def concatenate_scores(parts: list[RewardScores]) -> RewardScores:
    return RewardScores(parts[0].names, np.concatenate([p.per_function for p in parts]),
                        np.concatenate([p.total for p in parts]))


@dataclass
class TrainBatch:
    """A packed micro-batch of rollouts with the per-token arrays the policy loss needs."""

    batch: PackedBatch
    advantages: np.ndarray  # (T,) each token carries its sequence's advantage
    engine_logp: np.ndarray  # (T,) the engine's log-prob of each target token (0 where no loss)
    old_logp: object = None  # (T,) policy log-probs before this generation batch's updates
    ref_logp: object = None  # (T,) frozen reference model's log-probs (beta > 0)
    turns: np.ndarray | None = None  # (T,) multi-turn: the turn of each target token (-1: none)


def train_batches(rollouts: Rollouts, indices: list[int], max_sequences: int, max_tokens: int | None,
                  mask_truncated: bool) -> list[TrainBatch]:
    """Completions `indices` packed into micro-batches of at most max_sequences sequences and max_tokens
    tokens (whole sequences)."""
    examples = rollouts.examples(mask_truncated)
    groups, current, size = [], [], 0
    for i in indices:
        n = len(examples[i])
        if current and (len(current) == max_sequences or (max_tokens and size + n > max_tokens)):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return [_train_batch(rollouts, examples, group) for group in groups]


def _train_batch(rollouts: Rollouts, examples: list[Example], indices: list[int]) -> TrainBatch:
    batch = PackedBatch.from_examples([examples[i] for i in indices])
    T = batch.num_tokens
    advantages, engine_logp = np.zeros(T, np.float32), np.zeros(T, np.float32)
    turns = None if rollouts.completion_turns is None else np.full(T, -1, np.int32)
    for i, start in zip(indices, batch.cu_seqlens[:-1]):
        p, c = len(rollouts.prompt_ids[i]), len(rollouts.completion_ids[i])
        advantages[start : start + p + c] = rollouts.advantages[i]
        # target t predicts token t+1: completion token j is the target at position p - 1 + j
        engine_logp[start + p - 1 : start + p - 1 + c] = rollouts.engine_logprobs[i]
        if turns is not None:
            turns[start + p - 1 : start + p - 1 + c] = rollouts.completion_turns[i]
    return TrainBatch(batch, advantages, engine_logp, turns=turns)
