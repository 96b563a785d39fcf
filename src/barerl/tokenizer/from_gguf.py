"""Build a `tokenizers` tokenizer from the vocabulary and merges a GGUF file stores.

This reproduces transformers' GGUF conversion (integrations/gguf/gguf_tokenizer_mapping.py) for byte-level
BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: Llama 3, Qwen2/2.5/3, SmolLM2):
- vocabulary as stored, except tokens using characters outside the GPT-2 byte alphabet, which are respelled
  byte by byte; merges split on the space; BPE with no unknown token;
- the ByteLevel pre-tokenizer and decoder (GPT2Tokenizer's), or, for the `tokenizer.ggml.pre` names whose
  merges were learnt with another split regex, that regex followed by ByteLevel without its own regex;
- tokens typed CONTROL (3) become special added tokens, USER_DEFINED (4) plain added tokens;
- a post-processor that adds BOS / EOS only when the file's add_bos_token / add_eos_token say so.
Sentencepiece vocabularies (`"llama"`) are not supported: none of our model families uses one.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from barerl.formats.gguf import GGUFTokenizerSpec

CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> split regex (the subset of transformers' table for our families; others use GPT-2's)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level BPE vocabularies are spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class GGUFTokenizerError(ValueError):
    """The GGUF's tokenizer metadata cannot be turned into a tokenizer."""


def build_backend(spec: GGUFTokenizerSpec) -> Backend:
    """A `tokenizers.Tokenizer` equal to what transformers builds from the same GGUF file."""
    if spec.model != "gpt2":
        raise GGUFTokenizerError(
            f"{spec.source}: metadata 'tokenizer.ggml.model' is {spec.model!r}; only 'gpt2' (byte-level BPE) "
            "vocabularies are supported"
        )
    if not spec.merges:
        raise GGUFTokenizerError(f"{spec.source}: metadata 'tokenizer.ggml.merges' is missing or empty")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(spec.tokens)
    }
    merges = [tuple(m.split(" ")) for m in spec.merges]
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise GGUFTokenizerError(f"{spec.source}: metadata 'tokenizer.ggml.merges' has a malformed merge {bad!r}")
    try:
        bpe = BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    except Exception as e:  # noqa: BLE001 (the Rust library raises plain Exception, e.g. a merge not in vocab)
        raise GGUFTokenizerError(f"{spec.source}: tokenizer.ggml.tokens and .merges do not fit: {e}") from None
    backend = Backend(bpe)
    split = PRE_TOKENIZER_SPLITS.get(spec.pre)
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    _add_typed_tokens(backend, spec, alphabet)
    backend.post_processor = template_processor(
        spec.tokens[spec.bos_token_id] if spec.add_bos_token and spec.bos_token_id is not None else None,
        spec.tokens[spec.eos_token_id] if spec.add_eos_token and spec.eos_token_id is not None else None,
        backend,
    )
    return backend


def _add_typed_tokens(backend: Backend, spec: GGUFTokenizerSpec, alphabet: set[str]) -> None:
    types = spec.token_types or ()
    # A "control" token outside the byte alphabet is a llama.cpp mislabel; transformers skips it.
    control = [t for t, k in zip(spec.tokens, types) if k == CONTROL and set(t) <= alphabet]
    if control:
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    vocab = backend.get_vocab()
    user = [t for t, k in zip(spec.tokens, types) if k == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def template_processor(bos: str | None, eos: str | None, backend: Backend) -> processors.TemplateProcessing:
    """Post-processor adding `bos` before and `eos` after a sequence (either may be None), as transformers'
    `update_post_processor` writes it."""
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])])
    special = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
