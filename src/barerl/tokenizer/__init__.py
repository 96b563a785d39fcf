"""Tokenizers and chat templates: Hugging Face folders or GGUF files in, token ids equal to transformers' out."""

from barerl.tokenizer.chat_template import ChatTemplateError, render_chat
from barerl.tokenizer.from_gguf import GGUFTokenizerError
from barerl.tokenizer.streaming import IncrementalDetokenizer
from barerl.tokenizer.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "ChatTemplateError",
    "GGUFTokenizerError",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerError",
    "render_chat",
]
