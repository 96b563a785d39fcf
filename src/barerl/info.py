"""`barerl info --model PATH`: a model's architecture, size and tokenizer facts as a short text table.

Reads only the config, the weight files' headers and the tokenizer: no weights are loaded, so it is instant
even for a large model. The tokenizer is duck-typed (ours or a transformers one): `vocab_size` (or
`len()`), `bos_token`, `bos_token_id`, `eos_token`, `eos_token_id` and `chat_template` are read when present.
"""

from __future__ import annotations

import argparse

from barerl.config import ModelConfig
from barerl.formats.paths import load_config, resolve_model_path, stored_dtypes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="a Hugging Face model folder (config.json + safetensors) or a .gguf file")


def run(args: argparse.Namespace) -> None:
    from barerl.tokenizer import load_tokenizer

    path = resolve_model_path(args.model)
    print(describe(load_config(path), load_tokenizer(path), stored_dtypes(path)))


def describe(cfg: ModelConfig, tokenizer=None, stored: dict[str, int] | None = None) -> str:
    """`stored`: dtype -> tensor count as on disk (`formats.paths.stored_dtypes`); default: the config's dtype."""
    heads = (f"{cfg.num_attention_heads} query, {cfg.num_key_value_heads} key/value "
             f"({cfg.num_attention_heads // cfg.num_key_value_heads} per group), head_dim {cfg.head_dim}")
    rows = [
        ("architecture", f"{cfg.architecture} ({cfg.family.model_type})"),
        ("layers", cfg.num_hidden_layers),
        ("hidden", cfg.hidden_size),
        ("heads", heads),
        ("intermediate", cfg.intermediate_size),
        ("vocab", cfg.vocab_size),
        ("embeddings", "tied (lm_head = embed_tokens)" if cfg.tie_word_embeddings else "untied"),
        ("attention", ", ".join(["q/k RMSNorm" if cfg.qk_norm else "no q/k norm",
                                 "q/k/v bias" if cfg.attention_bias else "no bias"])),
        ("rope", _rope(cfg)),
        ("max positions", cfg.max_position_embeddings),
        ("parameters", _count(cfg.num_parameters())),
        ("dtype on disk", ", ".join(f"{k} ({n} tensor{'s' * (n != 1)})" for k, n in stored.items())
         if stored else cfg.torch_dtype),
    ]
    rows += _tokenizer_rows(tokenizer) if tokenizer is not None else [("tokenizer", "none found")]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def _rope(cfg: ModelConfig) -> str:
    text = f"theta {cfg.rope_theta:g}"
    if cfg.rope_scaling:
        s = cfg.rope_scaling
        text += (f", scaling {s.get('rope_type', s.get('type'))} (factor {s['factor']:g}, low/high freq "
                 f"{s['low_freq_factor']:g}/{s['high_freq_factor']:g}, original max positions "
                 f"{s['original_max_position_embeddings']})")
    return text


def _count(n: int) -> str:
    short = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
    return f"{short} ({n:,})"


def _tokenizer_rows(tok) -> list[tuple[str, object]]:
    vocab = getattr(tok, "vocab_size", None) or (len(tok) if hasattr(tok, "__len__") else "?")

    def special(kind: str) -> str:
        token, token_id = getattr(tok, f"{kind}_token", None), getattr(tok, f"{kind}_token_id", None)
        return "none" if token is None and token_id is None else f"{token!r} (id {token_id})"

    return [
        ("tokenizer vocab", vocab),
        ("bos", special("bos")),
        ("eos", special("eos")),
        ("chat template", "yes" if getattr(tok, "chat_template", None) else "no"),
    ]
