"""Incremental detokenisation for streaming generated text.

A token may end in the middle of a UTF-8 character (byte-level BPE splits emoji and CJK across tokens), and
some decoders change a token's text depending on what precedes it (sentencepiece drops the leading space of
the first token). So we never decode a token alone: we decode a short window of recent tokens twice, without
and with the new ones, and emit the difference once it no longer ends in U+FFFD (the replacement character
that an incomplete byte sequence decodes to). The window then slides forward. Each step decodes only the
window, so streaming a long reply stays linear, and the emitted pieces concatenate to `decode(all ids)`.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Feed token ids one at a time with `add`; each call returns the text completed by that token."""

    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are emitted and no longer affect new text
        self._read = 0  # tokens before this have had their text emitted

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        emitted = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self.ids))
        if len(text) <= len(emitted) or text.endswith("\ufffd"):
            return ""  # nothing new yet, or an unfinished character: wait for more tokens
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(emitted) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a sequence that ended on an incomplete character)."""
        emitted = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self.ids))
        self._prefix = self._read = len(self.ids)
        return text[len(emitted) :]

    @property
    def text(self) -> str:
        """Everything decoded so far, held-back tokens included."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)
