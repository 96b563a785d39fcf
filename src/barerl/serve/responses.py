"""OpenAI response bodies from the engine's outputs: completions, chat completions, their stream chunks.

Design decisions:
- A `Sample` gathers one choice's deltas (text, token ids, log-probs, finish); a full response is built
  from the gathered samples and a stream chunk from one delta, by the same functions, so the streamed
  pieces add up to the response's text, tokens and log-probs.
- Log-probs are the sampled token's only (barerl keeps no alternatives): completions get `tokens`,
  `token_logprobs` and `text_offset` (offsets as the tokens' own texts add up, as vLLM counts them) with
  `top_logprobs` null; chat gets `content` entries with empty `top_logprobs`.
- Choices carry vLLM's `stop_reason` beside `finish_reason`: the stop string or token id that ended it.
- Tool calls (chat, when the request gave tools): the text is read by `api_tool_calls` once the sample
  ends; while streaming, content goes out as far as `streamable_content` allows, and the calls (with the rest
  of the content, if the calls turn out malformed) in the chunk that finishes the choice. A choice that
  stopped on its own with calls finishes with "tool_calls".
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from barerl.engine.outputs import CompletionOutput
from barerl.tokenizer.tool_calls import ToolCall, api_tool_calls, streamable_content


@dataclass
class Sample:
    """One choice, its deltas gathered."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_content_sent: int = 0  # characters of chat content streamed so far

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


def envelope(kind: str, request_id: str, model: str, created: int, choices: list[dict],
             usage: dict | None = None) -> dict:
    body = {"id": request_id, "object": kind, "created": created, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def new_id(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time())


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> dict:
    """OpenAI's usage; `cached_tokens`: prompt tokens the prefix cache held (computed by an earlier request)."""
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens,
            "prompt_tokens_details": {"cached_tokens": num_cached_tokens}}


# ------------------------------------------------------------------------------------------- completions


def completion_choice(index: int, text: str, sample: Sample, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason}


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], text_offset: int) -> dict:
    tokens = [tokenizer.decode([t]) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


# -------------------------------------------------------------------------------------------------- chat


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict:
    entries = []
    for t, logprob in zip(token_ids, logprobs):
        token = tokenizer.decode([t])
        entries.append({"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": entries}


def chat_message(sample: Sample, parse_tools: bool) -> tuple[dict, str | None]:
    """The finished sample's assistant message and finish reason."""
    content, calls = api_tool_calls(sample.text) if parse_tools else (sample.text, [])
    message = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = tool_calls_json(calls)
    return message, _finish_reason(sample, calls)


def chat_delta(sample: Sample, new_text: str, parse_tools: bool) -> dict:
    """What a stream chunk adds to the message after the sample got `new_text` (already in sample.text)."""
    if not parse_tools:
        return {"content": new_text} if new_text else {}
    calls = []
    if sample.finish_reason is not None:
        content, calls = api_tool_calls(sample.text)
    else:
        content = streamable_content(sample.text)
    delta = {"content": content[sample.num_content_sent :]} if len(content) > sample.num_content_sent else {}
    sample.num_content_sent = max(sample.num_content_sent, len(content))
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls_json(calls))]
    return delta


def chat_finish_reason(sample: Sample, parse_tools: bool) -> str | None:
    calls = api_tool_calls(sample.text)[1] if parse_tools and sample.finish_reason is not None else []
    return _finish_reason(sample, calls)


def _finish_reason(sample: Sample, calls: list[ToolCall]) -> str | None:
    return "tool_calls" if calls and sample.finish_reason == "stop" else sample.finish_reason


def tool_calls_json(calls: list[ToolCall]) -> list[dict]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_json()}} for call in calls]
