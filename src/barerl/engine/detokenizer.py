"""The text of one sample as it grows, and stop strings, with vLLM's semantics.

- Text grows through the tokenizer's `IncrementalDetokenizer` (a sliding decode window, so a token that
  ends inside a UTF-8 character adds text only once the character is complete).
- A token that ended the sample as a stop token (EOS, `stop_token_ids`) stays in `token_ids`, but its
  text is not added unless `include_stop_str_in_output`.
- Stop strings are searched only in the text the last token could have completed, and only once more than
  `min_tokens` tokens exist. The first stop string of the list that matches wins; the text is cut right
  before it (or right after it with `include_stop_str_in_output`). Token ids are not cut: they keep every
  token generated, including the one that completed the stop string.
- Streaming holds back the last `len(longest stop string) - 1` characters until the sample ends, so a
  stream never shows the start of a stop string that is then removed.
"""

from __future__ import annotations

from barerl.engine.sampling_params import SamplingParams


class Detokenizer:
    def __init__(self, tokenizer, params: SamplingParams):
        from barerl.tokenizer import IncrementalDetokenizer

        self.params = params
        self.stream = IncrementalDetokenizer(tokenizer, skip_special_tokens=params.skip_special_tokens)
        self.text = ""
        self.num_tokens = 0
        self._num_chars_sent = 0

    def update(self, token_id: int, finished: bool, stop_terminated: bool) -> str | None:
        """Add one generated token; returns the stop string it completed, if any (the text is then cut).

        finished: the sample ends with this token (flush what waits for more bytes); stop_terminated: it
        ends because this token is a stop token.
        """
        self.num_tokens += 1
        new_text = ""
        if not stop_terminated or self.params.include_stop_str_in_output:
            new_text = self.stream.add(token_id)
        if finished:
            new_text += self.stream.flush()
        self.text += new_text
        if not new_text or self.num_tokens <= self.params.min_tokens:
            return None
        return self._check_stop_strings(len(new_text))

    def _check_stop_strings(self, num_new_chars: int) -> str | None:
        for stop in self.params.stop_strings:
            # only a match overlapping the new characters is new
            start = max(0, len(self.text) - num_new_chars - len(stop) + 1)
            index = self.text.find(stop, start)
            if index == -1:
                continue
            if self.params.include_stop_str_in_output:
                index += len(stop)
            self.text = self.text[:index]
            return stop
        return None

    def next_text(self, finished: bool) -> str:
        """Text not streamed yet, holding back what might still become a stop string."""
        held_back = 0 if finished else self.params.stop_buffer_length
        end = max(self._num_chars_sent, len(self.text) - held_back)
        delta = self.text[self._num_chars_sent : end]
        self._num_chars_sent = end
        return delta
