"""Evaluation on a prompt dataset: n samples per prompt, pass@1 and pass@k, the mean of every reward
function, and one JSONL record per sample.

Design decisions:
- Two samplers, one scorer. `EngineSampler` generates with the in-process engine (an `LLM`, on the GPU when
  there is one); `OpenAISampler` asks any OpenAI-compatible server (`barerl serve`, `vllm serve`, ...)
  through the openai client (the `barerl[eval]` extra). Both give n completion texts per prompt; the
  rewards, correctness, pass@k and records after that are the same code, so a barerl checkpoint and a
  vLLM-served model are scored alike.
- Prompts are encoded as GRPO encodes them (`encode_prompt`): a conversation through the chat template with
  the generation prompt, a string with no special tokens added. Over the API a conversation goes to
  /v1/chat/completions and a string to /v1/completions with vLLM's `add_special_tokens: false`, so both
  samplers condition on the same tokens.
- Prompt i is sampled with seed `seed + i` (its n samples derived from it by the engine), so its samples do
  not depend on the batch, the order of requests, or the sampler.
- A sample is correct when the first reward function gives it >= 1.0 (math_accuracy, exact-match rewards;
  None, "not applicable", is not correct); every reward function's mean over the samples it applies to is
  reported, as GRPO logs them.
- pass@k is the unbiased estimator of Chen et al. 2021 (the Codex paper): per prompt with c of n samples
  correct, 1 - C(n-c, k) / C(n, k), as a product so that it stays exact for large n; the mean over prompts.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from barerl.config import ConfigError
from barerl.engine.sampling_params import SamplingParams
from barerl.train.config import coerce_fields, opt
from barerl.train.data import encode_prompt, is_conversational
from barerl.train.rewards import RewardRunner, load_rewards


@dataclass(frozen=True)
class EvalConfig:
    """`barerl eval`: where completions come from, how they are sampled, how they are scored."""

    model: str | None = opt(None, "Model folder or .gguf file to generate with in this process.")
    base_url: str | None = opt(None, "An OpenAI-compatible server to ask instead of loading a model "
                               "(http://host:port/v1: barerl serve, vllm serve, ...).")
    served_model_name: str | None = opt(None, "The model name to ask the server for; None: the first of its "
                                        "/v1/models.")
    api_key: str | None = opt(None, "API key for the server; None: $OPENAI_API_KEY, else none.")
    dataset: str | None = opt(None, "Prompts: a JSONL / Parquet file, `datasets` folder or Hugging Face Hub "
                              "dataset (ORG/NAME) with a 'prompt' column (and the columns the rewards read, e.g. "
                              "'answer').")
    dataset_config: str | None = opt(None, "The configuration (subset) of a Hub dataset (main for openai/gsm8k).")
    dataset_split: str = opt("test", "The split of a Hub dataset or a datasets folder with splits.")
    reward_funcs: tuple[str, ...] = opt((), "Reward functions ('module:function', 'file.py:function' or a "
                                        "built-in); the first decides correctness (reward >= 1).")
    n: int = opt(1, "Samples per prompt.", min=1)
    pass_k: tuple[int, ...] | None = opt(None, "The k of each pass@k to report, each <= n; None: 1 and n.", min=1)
    max_tokens: int = opt(256, "Tokens generated per sample at most.", min=1)
    temperature: float = opt(0.0, "Sampling temperature (0: greedy).", min=0.0)
    top_p: float = opt(1.0, "Nucleus sampling: keep the most likely tokens up to this mass.", gt=0.0, max=1.0)
    seed: int = opt(0, "Prompt i is sampled with seed + i.")
    max_prompt_length: int | None = opt(None, "Keep only the last this many prompt tokens (engine only).", min=1)
    limit: int | None = opt(None, "Evaluate only the first this many prompts.", min=1)
    output: str | None = opt(None, "Write one JSON record per sample to this JSONL file.")
    concurrency: int = opt(64, "Requests in flight at once against a server.", min=1)
    device: str = opt("auto", "Where the engine runs: auto (cuda if available), cpu or cuda.",
                      choices=("auto", "cpu", "cuda"))
    dtype: str = opt("auto", "Engine weight dtype: auto (bfloat16 on cuda, float32 on cpu), bfloat16, "
                     "float16 or float32.", choices=("auto", "bfloat16", "float16", "float32"))

    def __post_init__(self):
        coerce_fields(self)
        if self.pass_k and max(self.pass_k) > self.n:
            raise ConfigError(f"pass_k: each k must be <= n={self.n}, got {list(self.pass_k)}")

    @property
    def ks(self) -> tuple[int, ...]:
        return self.pass_k or tuple(sorted({1, self.n}))


@dataclass
class EvalResult:
    num_prompts: int
    n: int
    pass_at_k: dict[int, float]  # k -> mean over prompts
    reward: float  # mean total reward
    rewards: dict[str, float]  # reward function -> mean over the samples it applies to
    samples: list[dict]  # one record per sample, prompt-major

    @property
    def accuracy(self) -> float:
        return self.pass_at_k.get(1, math.nan)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples, c of them correct: 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(sampler, rows: list[dict], rewards, cfg: EvalConfig | None = None) -> EvalResult:
    """Score `cfg.n` samples of each row's "prompt"; sampler: an `LLM`, an `EngineSampler` or an
    `OpenAISampler`; rewards: as `load_rewards` takes them (specs, callables or Reward objects)."""
    cfg = cfg or EvalConfig()
    if not rows:
        raise ValueError("evaluate: no prompts")
    sampler = sampler if hasattr(sampler, "sample") else EngineSampler(sampler)
    prompts = [row["prompt"] for row in rows]
    completions = sampler.sample(prompts, cfg)  # [prompt][sample] -> (text, finish_reason)
    flat_rows = [row for row in rows for _ in range(cfg.n)]
    texts = [text for per_prompt in completions for text, _ in per_prompt]
    as_completions = [[{"role": "assistant", "content": t}] if is_conversational(r["prompt"]) else t
                      for r, t in zip(flat_rows, texts)]
    columns = {key: [row.get(key) for row in flat_rows] for key in rows[0] if key != "prompt"}
    reward_list = load_rewards(rewards)
    with RewardRunner(reward_list, num_workers=0) as runner:
        scores = runner([r["prompt"] for r in flat_rows], as_completions, columns)
    correct = (np.nan_to_num(scores.per_function[:, 0], nan=0.0) >= 1.0).reshape(len(rows), cfg.n)
    metrics = scores.metrics()
    return EvalResult(
        num_prompts=len(rows), n=cfg.n,
        pass_at_k={k: float(np.mean([pass_at_k(cfg.n, int(c), k) for c in correct.sum(axis=1)]))
                   for k in cfg.ks},
        reward=metrics["reward"], rewards={r.name: metrics[f"rewards/{r.name}/mean"] for r in reward_list},
        samples=_records(rows, completions, scores, correct),
    )


def _records(rows, completions, scores, correct) -> list[dict]:
    records = []
    for i, (row, per_prompt) in enumerate(zip(rows, completions)):
        for j, (text, finish_reason) in enumerate(per_prompt):
            flat = i * len(per_prompt) + j
            values = [None if np.isnan(v) else float(v) for v in scores.per_function[flat]]
            records.append({
                "prompt_index": i, "sample_index": j, "prompt": row["prompt"], "completion": text,
                "finish_reason": finish_reason, "rewards": dict(zip(scores.names, values)),
                "reward": float(scores.total[flat]), "correct": bool(correct[i, j]),
                "row": {k: v for k, v in row.items() if k != "prompt"},
            })
    return records


def write_samples(path: str, result: EvalResult) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in result.samples)


def sampling_params(cfg: EvalConfig, prompt_index: int) -> SamplingParams:
    return SamplingParams(n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                          seed=cfg.seed + prompt_index)


# ------------------------------------------------------------------------------------------------ samplers


class EngineSampler:
    """Completions from the in-process engine."""

    def __init__(self, llm):
        self.llm = llm

    def sample(self, prompts: list, cfg: EvalConfig) -> list[list[tuple[str, str | None]]]:
        tokenizer = self.llm.get_tokenizer()
        ids = [encode_prompt(p, tokenizer, cfg.max_prompt_length) for p in prompts]
        params = [sampling_params(cfg, i) for i in range(len(prompts))]
        outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        return [[(c.text, c.finish_reason) for c in out.outputs] for out in outputs]


class OpenAISampler:
    """Completions from an OpenAI-compatible server, `cfg.concurrency` requests in flight at once."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None):
        try:
            import openai
        except ImportError:
            raise ValueError("evaluating a served model (base_url) needs the openai client: "
                             "pip install 'barerl[eval]'") from None
        self._openai = openai
        self.base_url, self.model = base_url, model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"

    def sample(self, prompts: list, cfg: EvalConfig) -> list[list[tuple[str, str | None]]]:
        if cfg.max_prompt_length is not None:
            raise ValueError("max_prompt_length: truncating prompts needs the tokenizer, which a served model "
                             "keeps on its server; leave it unset with base_url")
        return asyncio.run(self._sample_all(prompts, cfg))

    async def _sample_all(self, prompts: list, cfg: EvalConfig):
        client = self._openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=3600)
        try:
            model = self.model or (await client.models.list()).data[0].id
            slots = asyncio.Semaphore(cfg.concurrency)

            async def one(i, prompt):
                async with slots:
                    return await self._ask(client, model, prompt, sampling_params(cfg, i))

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        except self._openai.APIError as e:
            raise ValueError(f"{self.base_url}: {e}") from None
        finally:
            await client.close()

    async def _ask(self, client, model: str, prompt, params: SamplingParams):
        fields = {"model": model, "n": params.n, "temperature": params.temperature, "top_p": params.top_p,
                  "max_tokens": params.max_tokens, "seed": params.seed}
        if is_conversational(prompt):
            response = await client.chat.completions.create(messages=prompt, **fields)
            choices = sorted(response.choices, key=lambda c: c.index)
            return [(c.message.content or "", c.finish_reason) for c in choices]
        response = await client.completions.create(prompt=prompt, extra_body={"add_special_tokens": False}, **fields)
        return [(c.text, c.finish_reason) for c in sorted(response.choices, key=lambda c: c.index)]
