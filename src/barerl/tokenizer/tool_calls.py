"""Tool calls in model text, in the Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Qwen2.5 / Qwen3 and the Hermes models write each call as one JSON object between `<tool_call>` and
`</tool_call>`, after any text of their own. This module reads them back, for the multi-turn trainer (which
runs them and tells the model what was wrong with a bad one) and for the OpenAI-compatible server (which
returns them as `tool_calls`). Plain json and str: no library fits a format this small.

- `parse_tool_calls(text) -> (content, calls)`: every `<tool_call>` block gives one `ToolCall`, in the order
  the model wrote them; content is the text outside the blocks. A block that is not a call (invalid JSON, no
  name, arguments that are not an object, no closing tag) gives a `ToolCall` with `error` set instead of
  raising. Accepted variations, seen in the wild: `arguments` given as a JSON string of an object (OpenAI's
  wire form), `parameters` instead of `arguments` (Llama 3.1's JSON form), no arguments at all, and
  whitespace or newlines around the JSON.
- `api_tool_calls(text)`: what a server returns, strictly: the calls only when every block is a well-formed
  call and nothing but whitespace stands between and after them (content is then the text before the first
  call); otherwise the whole text as content and no calls, so nothing the model wrote is lost or half-read.
- `streamable_content(text)`: the part of a growing text that is content whatever comes next, so a server can
  stream content while holding back what may start a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: a name and keyword arguments, or `error` saying why the block is not a valid call."""

    name: str | None
    arguments: dict = field(default_factory=dict)
    error: str | None = None
    text: str = field(default="", compare=False)  # the block's content as the model wrote it

    def arguments_json(self) -> str:
        """The arguments as OpenAI's API carries them: a JSON string."""
        return json.dumps(self.arguments, ensure_ascii=False)


def _parse_block(body: str) -> ToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, error=f"the tool call is not valid JSON ({e.msg} at position {e.pos})", text=body)
    if not isinstance(data, dict):
        return ToolCall(None, error="the tool call must be a JSON object with 'name' and 'arguments'", text=body)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, error="the tool call has no 'name' string", text=body)
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(name, error="the tool call's 'arguments' string is not valid JSON", text=body)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(name, error="the tool call's 'arguments' must be a JSON object", text=body)
    return ToolCall(name, arguments, text=body)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside the tool calls, the calls in order). A block without its closing tag runs to
    the end of the text and is an error call."""
    calls = []
    for match in _BLOCK.finditer(text):
        body = match.group(1)
        if not match.group(2):
            calls.append(ToolCall(None, error=f"unterminated {TOOL_CALL_START} (no {TOOL_CALL_END})", text=body))
        else:
            calls.append(_parse_block(body.strip()))
    content = _BLOCK.sub("", text).strip() if calls else text
    return content, calls


def api_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) for an API reply (see the module docstring): (text, []) unless the text is content
    followed by well-formed calls and whitespace alone."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    rest, calls = parse_tool_calls(text[start:])
    if rest.strip() or any(call.error for call in calls):
        return text, []
    return text[:start].rstrip(), calls


def streamable_content(text: str) -> str:
    """The longest prefix of a growing text that stays content whatever follows: up to the first
    `<tool_call>` or a partial one at the end, less trailing whitespace (content drops it before a call)."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        start = len(text)
        for size in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
            if TOOL_CALL_START.startswith(text[-size:]):
                start -= size
                break
    return text[:start].rstrip()
