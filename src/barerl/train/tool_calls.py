"""Tool calls in the Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

A pure function of the model's text, so the trainer's environments and the OpenAI-compatible server can
share it: `parse_tool_calls(text) -> (content, calls)`, where content is the text outside the calls and
calls are in the order the model wrote them. Every `<tool_call>` block gives one `ToolCall`; a block that
is not a call (invalid JSON, no name, arguments that are not an object, no closing tag) gives a
`ToolCall` with `error` set instead of raising, so that the model can be told what was wrong with it.

Accepted variations, seen in the wild: `arguments` given as a JSON string of an object (OpenAI's wire
form), `parameters` instead of `arguments` (Llama 3.1's JSON form), no arguments at all (a call without
any), and whitespace or newlines around the JSON.
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
    text: str = ""  # the block's content as the model wrote it


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
