"""OpenAI request bodies read into engine terms, and OpenAI's error shape.

Design decisions:
- Validation is ours, field by field, so that every bad request gets one `APIError` (HTTP 400 unless said
  otherwise) naming the field, in the shape OpenAI's clients parse: {"error": {"message", "type", "param",
  "code"}}. Sampling fields then pass through `SamplingParams`, whose own checks name the field too.
- Fields of OpenAI's API that barerl cannot honour (penalties, logit_bias, echo, suffix, top-N log-probs, a
  forced tool choice, JSON response formats) are refused when set to anything but their neutral value, never
  silently ignored; fields that only describe the caller (user, metadata, store, ...) are ignored.
- vLLM's extra sampling fields are read as vLLM reads them: top_k, min_p, min_tokens, ignore_eos,
  stop_token_ids, skip_special_tokens, include_stop_str_in_output, add_special_tokens (completions),
  chat_template_kwargs and add_generation_prompt (chat).
- Defaults follow OpenAI's: temperature 1, max_tokens 16 for completions and up to the context for chat.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from barerl.engine.sampling_params import SamplingParams


class APIError(Exception):
    """An error answered to the client: HTTP status and OpenAI's error object."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    prompts: list  # each a str or a list of token ids
    params: SamplingParams
    stream: bool
    include_usage: bool
    add_special_tokens: bool


@dataclass
class ChatRequest:
    messages: list[dict]
    params: SamplingParams
    stream: bool
    include_usage: bool
    tools: list[dict] | None
    parse_tool_calls: bool  # tools given and tool_choice not "none"
    add_generation_prompt: bool
    chat_template_kwargs: dict


def field(body: dict, name: str, kinds: tuple[type, ...], what: str, default=None):
    """body[name] when it is one of `kinds` (bool is never an int here), default when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise APIError(f"{name}: must be {what}, got {value!r:.80}", param=name)
    return value


def check_model(body: dict, served_model_name: str) -> None:
    model = field(body, "model", (str,), "a string")
    if model is not None and model != served_model_name:
        raise APIError(f"The model `{model}` does not exist: this server serves `{served_model_name}`",
                       status=404, param="model", code="model_not_found")


def parse_completion_request(body: dict) -> CompletionRequest:
    _refuse(body, {"echo": False, "suffix": None})
    logprobs = field(body, "logprobs", (int,), "an integer")
    if logprobs not in (None, 0):
        raise APIError("logprobs: barerl returns the log-prob of the sampled token only, not the top "
                       f"{logprobs} alternatives: use logprobs=0", param="logprobs")
    params = _sampling_params(body, field(body, "max_tokens", (int,), "an integer", default=16),
                              logprobs is not None)
    best_of = field(body, "best_of", (int,), "an integer")
    if best_of not in (None, params.n):
        raise APIError("best_of: not supported (only best_of = n)", param="best_of")
    return CompletionRequest(_prompts(body), params, *_stream_options(body),
                             field(body, "add_special_tokens", (bool,), "true or false", default=True))


def parse_chat_request(body: dict) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages: must be a non-empty list of messages", param="messages")
    response_format = field(body, "response_format", (dict,), "an object", default={"type": "text"})
    if response_format.get("type") != "text":
        raise APIError("response_format: only {'type': 'text'} is supported", param="response_format")
    logprobs = field(body, "logprobs", (bool,), "true or false", default=False)
    top = field(body, "top_logprobs", (int,), "an integer")
    if top not in (None, 0):
        raise APIError(f"top_logprobs: barerl returns the log-prob of the sampled token only, not the top {top} "
                       "alternatives: use top_logprobs=0", param="top_logprobs")
    max_tokens = field(body, "max_completion_tokens", (int,), "an integer")
    max_tokens = field(body, "max_tokens", (int,), "an integer") if max_tokens is None else max_tokens
    tools = field(body, "tools", (list,), "a list of tools")
    tool_choice = field(body, "tool_choice", (str, dict), "a string or an object", default="auto")
    if tool_choice not in ("auto", "none"):
        raise APIError("tool_choice: only 'auto' and 'none' are supported", param="tool_choice")
    return ChatRequest(
        [_message(m, i) for i, m in enumerate(messages)], _sampling_params(body, max_tokens, logprobs),
        *_stream_options(body), tools or None, bool(tools) and tool_choice == "auto",
        field(body, "add_generation_prompt", (bool,), "true or false", default=True),
        field(body, "chat_template_kwargs", (dict,), "an object", default={}),
    )


# ------------------------------------------------------------------------------------------------ helpers


_VLLM_SAMPLING = {  # field -> (types, what)
    "top_k": ((int,), "an integer"), "min_p": ((int, float), "a number"), "min_tokens": ((int,), "an integer"),
    "ignore_eos": ((bool,), "true or false"), "stop_token_ids": ((list,), "a list of token ids"),
    "skip_special_tokens": ((bool,), "true or false"),
    "include_stop_str_in_output": ((bool,), "true or false"),
}


def _sampling_params(body: dict, max_tokens: int | None, logprobs: bool) -> SamplingParams:
    _refuse(body, {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}})
    given = {
        "n": field(body, "n", (int,), "an integer"),
        "temperature": field(body, "temperature", (int, float), "a number"),
        "top_p": field(body, "top_p", (int, float), "a number"),
        "stop": field(body, "stop", (str, list), "a string or a list of strings"),
        "seed": field(body, "seed", (int,), "an integer"),
        **{name: field(body, name, kinds, what) for name, (kinds, what) in _VLLM_SAMPLING.items()},
    }
    kwargs = {k: v for k, v in given.items() if v is not None}
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=True if logprobs else None, **kwargs)
    except ValueError as e:  # "SamplingParams.max_tokens: must be ..."
        message = str(e).removeprefix("SamplingParams.")
        raise APIError(message, param=message.partition(":")[0]) from None


def _refuse(body: dict, neutral: dict) -> None:
    for name, value in neutral.items():
        if body.get(name) not in (None, value):
            raise APIError(f"{name}: not supported by barerl (leave it at {value!r})", param=name)


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = field(body, "stream", (bool,), "true or false", default=False)
    options = field(body, "stream_options", (dict,), "an object", default={})
    return stream, bool(stream and options.get("include_usage"))


def _prompts(body: dict) -> list:
    """`prompt`: a string, a list of strings, a list of token ids, or a list of token-id lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and _is_token_ids(prompt)):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_token_ids(p) for p in prompt):
        return list(prompt)
    raise APIError("prompt: must be a string, a list of strings, a list of token ids or a list of token-id "
                   "lists", param="prompt")


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


_ROLES = ("system", "developer", "user", "assistant", "tool")


def _message(message, i: int) -> dict:
    """A message as chat templates take it: text content (text parts joined), tool-call arguments as
    objects (templates write them with `tojson`; OpenAI sends them as JSON strings)."""
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise APIError(f"messages[{i}]: must be an object with a role among {list(_ROLES)}", param="messages")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise APIError(f"messages[{i}].content: only text parts are supported", param="messages")
        content = "".join(str(p.get("text", "")) for p in content)
    elif content is not None and not isinstance(content, str):
        raise APIError(f"messages[{i}].content: must be a string or a list of text parts", param="messages")
    out = {**message, "content": content}
    if message.get("tool_calls"):
        out["tool_calls"] = [_templated_tool_call(call, i) for call in message["tool_calls"]]
    return out


def _templated_tool_call(call, i: int) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError(f"messages[{i}].tool_calls: each needs a function with a name", param="messages")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise APIError(f"messages[{i}].tool_calls: arguments are not valid JSON", param="messages") from None
    return {**call, "function": {**function, "arguments": arguments}}
