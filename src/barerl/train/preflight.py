"""Checks a training run makes before it loads or generates anything, so that a mistake costs seconds and
reads as one sentence: a missing model or dataset, a device that is not there, and GRPO's prompts and completions beyond the positions the
model was trained on (rotary positions past them are extrapolated: it would run, without a word, on garbage).
"""

from __future__ import annotations

from barerl.config import ConfigError
from barerl.device import resolve_device


def require_inputs(cfg, *, model=None, tokenizer=None, rows=None) -> None:
    """cfg.model and cfg.dataset, unless a model and tokenizer, or rows, were handed over in Python; and the
    device the model will load on (`cuda` without CuPy says what to install)."""
    if model is None:
        resolve_device(cfg.device)
    if not cfg.model and (model is None or tokenizer is None):
        raise ConfigError("model: no model given; set --model PATH (a Hugging Face folder or a .gguf file), or "
                          "'model:' in the config file")
    if not cfg.dataset and rows is None:
        raise ConfigError("dataset: no dataset given; set --dataset FILE (JSONL, Parquet, JSON or a `datasets` "
                          "folder), or 'dataset:' in the config file")


def check_positions(cfg, max_position_embeddings: int) -> None:
    """GRPO: a truncated prompt plus a whole completion must fit the model's positions."""
    if cfg.max_prompt_length is None or cfg.max_prompt_length + cfg.max_completion_length <= max_position_embeddings:
        return
    raise ConfigError(f"max_prompt_length ({cfg.max_prompt_length}) + max_completion_length "
                      f"({cfg.max_completion_length}) is more than the model's {max_position_embeddings} positions "
                      "(max_position_embeddings): lower one of them")


def check_prompt_fits(num_prompt_tokens: int, row: int, cfg, max_position_embeddings: int) -> None:
    """GRPO without max_prompt_length: this prompt plus a whole completion must fit the model's positions."""
    if num_prompt_tokens + cfg.max_completion_length <= max_position_embeddings:
        return
    raise ConfigError(f"dataset row {row}: its prompt has {num_prompt_tokens} tokens, which with "
                      f"max_completion_length {cfg.max_completion_length} is more than the model's "
                      f"{max_position_embeddings} positions (max_position_embeddings): set max_prompt_length "
                      "(prompts are cut from the left) or lower max_completion_length")
