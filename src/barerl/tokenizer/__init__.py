"""Tokenizers and chat templates: Hugging Face folders or GGUF files in, token ids equal to transformers' out."""

from barerl.tokenizer.chat_template import ChatTemplateError, render_chat
from barerl.tokenizer.from_gguf import GGUFTokenizerError
from barerl.tokenizer.streaming import IncrementalDetokenizer
from barerl.tokenizer.tokenizer import Tokenizer, TokenizerError


def load_tokenizer(path) -> Tokenizer | None:
    """The tokenizer of a model folder (tokenizer.json) or .gguf file; None for a folder without one."""
    import os

    from barerl.formats.paths import resolve_model_path

    path = resolve_model_path(path)
    if os.path.isdir(path):
        return Tokenizer.from_pretrained(path) if os.path.isfile(os.path.join(path, "tokenizer.json")) else None
    from barerl.formats.gguf import read_gguf

    model = read_gguf(path)
    return Tokenizer.from_gguf(model) if model.tokenizer_spec is not None else None


__all__ = [
    "ChatTemplateError",
    "GGUFTokenizerError",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "render_chat",
]
