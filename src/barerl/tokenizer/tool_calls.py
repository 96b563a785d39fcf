"""Tool calls in model text, in the Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Qwen2.5 / Qwen3 and the Hermes models write each call as one JSON object between `<tool_call>` and
`</tool_call>`, after any text of their own. This module reads them back: the OpenAI-compatible server
returns them as `tool_calls`, and a multi-turn trainer can run them. It is plain Python (json and str) so
that both can use it, and no library fits a format this small.

Design decisions:
- Strict: every `<tool_call>` must close, hold a JSON object with a string "name" and an object "arguments"
  (a JSON string of an object, as some models write it, is read too), and only whitespace may stand between
  and after the calls. Text that breaks any of this is not a tool call: `parse_tool_calls` returns it whole
  as content with no calls, so nothing the model wrote is lost or half-read.
- Content is the text before the first call, without trailing whitespace.
- Streaming: `streamable_content(text)` is the part of a growing text that is content whatever comes next,
  so a server can stream content while holding back what may start a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), flags=re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict

    def arguments_json(self) -> str:
        """The arguments as OpenAI's API carries them: a JSON string."""
        return json.dumps(self.arguments, ensure_ascii=False)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls): the text before the first call and the calls in order; (text, []) when the text
    has no well-formed calls (see the module docstring)."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    calls, end = [], start
    for match in _CALL.finditer(text, start):
        call = _read_call(match.group(1))
        if call is None or text[end : match.start()].strip():
            return text, []
        calls.append(call)
        end = match.end()
    if not calls or text[end:].strip():  # an unclosed call, or text after the calls
        return text, []
    return text[:start].rstrip(), calls


def _read_call(body: str) -> ToolCall | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(call["name"], arguments) if isinstance(arguments, dict) else None


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
