"""Hermes / Qwen tool calls read back from model text: well-formed calls, the strictness that keeps malformed
text whole, and the streamable prefix a server may send before it knows whether a call follows."""

import itertools

import pytest

from barerl.tokenizer.tool_calls import ToolCall, api_tool_calls, streamable_content

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_calls_and_the_content_before_them():
    assert api_tool_calls(CALL) == ("", [ToolCall("get_weather", {"city": "Paris"})])
    two = f"Let me look.\n\n{CALL}\n{CALL.replace('Paris', 'Rome')}\n"
    content, calls = api_tool_calls(two)
    assert content == "Let me look."
    assert [c.arguments["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0].arguments_json() == '{"city": "Paris"}'
    # arguments written as a JSON string, as some models do
    assert api_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')[1] == [
        ToolCall("f", {"x": 1})]


@pytest.mark.parametrize("text", [
    "no call here",
    '<tool_call>{"name": "f", "arguments": {}}',  # never closed
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": "[1"}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call> and then more text',
    f"{CALL} between {CALL}",
])
def test_anything_malformed_is_content_whole(text):
    assert api_tool_calls(text) == (text, [])


@pytest.mark.parametrize("text, streamable", [
    ("Hello", "Hello"),
    ("Hello <tool", "Hello"),  # may become a call
    ("Hello <tools are", "Hello <tools are"),
    ("Sure.\n\n<tool_call>\n{", "Sure."),
    ("a <", "a"),
    ("trailing space  ", "trailing space"),
])
def test_streamable_content(text, streamable):
    assert streamable_content(text) == streamable


def test_streamable_content_grows_into_the_parsed_content():
    text = f"I will check.\n{CALL}"
    prefixes = [streamable_content(text[:i]) for i in range(len(text) + 1)]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(prefixes))
    assert prefixes[-1] == api_tool_calls(text)[0]
