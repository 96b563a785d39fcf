"""Tool calls: parsing (good, several, malformed), every failure as an error observation the model reads,
loading tools from specs, and the built-in sandboxed python tool."""

import pytest

from barerl.tokenizer.tool_calls import ToolCall, parse_tool_calls
from barerl.train.sandbox import Sandbox, SandboxLimits
from barerl.train.tools import Tool, ToolError, call_tool, load_tools


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def divide(x: float, y: float) -> float:
    """Divide x by y.

    Args:
        x: The dividend.
        y: The divisor.
    """
    return x / y


def convert(value: float, unit: str, exact: bool | None = None) -> dict:
    """Convert a length.

    Args:
        value: The length.
        unit: Its unit (choices: ["cm", "in"])
        exact: Whether to round.
    """
    return {"cm": value * 2.54 if unit == "in" else value}


TOOLS = load_tools([add, divide, convert])


# ---- parsing -------------------------------------------------------------------------------------------


def test_parses_several_calls_and_the_text_around_them():
    text = ('Let me compute.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>{"name": "divide", "arguments": {"x": 1, "y": 4}}</tool_call>')
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute."
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1, "b": 2}, None),
                                                               ("divide", {"x": 1, "y": 4}, None)]


def test_no_call_leaves_the_text_alone():
    assert parse_tool_calls("The answer is 3.\n") == ("The answer is 3.\n", [])


@pytest.mark.parametrize("body, name, arguments", [
    ('{"name": "add", "arguments": "{\\"a\\": 1}"}', "add", {"a": 1}),  # OpenAI's string form
    ('{"name": "add", "parameters": {"a": 1}}', "add", {"a": 1}),  # Llama 3.1's key
    ('{"name": "now"}', "now", {}),
    ('{"name": "now", "arguments": null}', "now", {}),
])
def test_accepted_variations(body, name, arguments):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")[1]
    assert (call.name, call.arguments, call.error) == (name, arguments, None)


@pytest.mark.parametrize("text, error", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
    ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "'arguments' must be a JSON object"),
    ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "'arguments' string is not valid JSON"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}', "unterminated <tool_call>"),
])
def test_malformed_calls_are_error_calls(text, error):
    (call,) = parse_tool_calls(text)[1]
    assert error in call.error


def test_a_malformed_call_keeps_its_place_among_good_ones():
    _, calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
                                "<tool_call>not json</tool_call>"
                                '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>')
    assert [c.error is None for c in calls] == [True, False, True]


# ---- running ------------------------------------------------------------------------------------------


def test_a_good_call_returns_the_tools_value_as_text():
    assert call_tool(TOOLS, ToolCall("add", {"a": 2, "b": 3})).content == "5"
    result = call_tool(TOOLS, ToolCall("convert", {"value": 1, "unit": "in"}))
    assert (result.content, result.error) == ('{"cm": 2.54}', None)
    assert result.message() == {"role": "tool", "name": "convert", "content": '{"cm": 2.54}'}


@pytest.mark.parametrize("call, error, says", [
    (ToolCall(None, error="the tool call is not valid JSON (x)"), "malformed", "not valid JSON"),
    (ToolCall("multiply", {"a": 1}), "unknown_tool", "unknown tool 'multiply'; the tools are ['add', 'convert', "),
    (ToolCall("add", {"b": 1}), "bad_arguments", "missing arguments ['a']; add takes ['a', 'b']"),
    (ToolCall("add", {"a": 1, "c": 2}), "bad_arguments", "unknown arguments ['c']"),
    (ToolCall("add", {"a": "1"}), "bad_arguments", "argument 'a' must be integer, got \"1\""),
    (ToolCall("add", {"a": True}), "bad_arguments", "argument 'a' must be integer"),
    (ToolCall("convert", {"value": 1, "unit": "km"}), "bad_arguments", "must be one of ['cm', 'in']"),
    (ToolCall("divide", {"x": 1, "y": 0}), "raised", "divide raised ZeroDivisionError: division by zero"),
])
def test_failures_become_error_observations(call, error, says):
    result = call_tool(TOOLS, call)
    assert result.error == error and result.content.startswith("Error: ") and says in result.content


def test_nullable_and_number_arguments_accept_their_json_types():
    assert call_tool(TOOLS, ToolCall("convert", {"value": 2, "unit": "cm", "exact": None})).error is None
    assert call_tool(TOOLS, ToolCall("divide", {"x": 1.5, "y": 3})).content == "0.5"


# ---- loading ------------------------------------------------------------------------------------------


def test_loading_from_specs(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text('def shout(text: str) -> str:\n    """Shout.\n\n    Args:\n        text: What.\n    """\n'
                    "    return text.upper()\n")
    tools = load_tools([f"{path}:shout", "tests.train.test_tools:add", Tool.from_function(divide)])
    assert list(tools) == ["shout", "add", "divide"]
    assert tools["shout"].schema == {"type": "function", "function": {
        "name": "shout", "description": "Shout.", "parameters": {
            "type": "object", "properties": {"text": {"type": "string", "description": "What."}},
            "required": ["text"]}, "return": {"type": "string"}}}


@pytest.mark.parametrize("specs, message", [
    (["calculator"], r"unknown tool 'calculator': not a built-in \(python\)"),
    (["missing_file.py:f"], "missing_file.py not found"),
    ([add, add], "two tools are named 'add'"),
    ([lambda x: x], "has no docstring"),
    ([3], "must be a spec string, a function or a Tool"),
])
def test_loading_errors_name_the_problem(specs, message):
    with pytest.raises(ToolError, match=message):
        load_tools(specs)


def test_builtin_python_tool_runs_in_the_sandbox():
    sandbox = Sandbox(SandboxLimits(wall_seconds=5))
    tools = load_tools(["python"], sandbox)
    assert tools["python"].schema["function"]["parameters"]["required"] == ["code"]
    assert call_tool(tools, ToolCall("python", {"code": "print(6 * 7)"})).content == "42"
    assert call_tool(tools, ToolCall("python", {"code": "x = 1"})).content == "[no output]"
    failed = call_tool(tools, ToolCall("python", {"code": "1 / 0"}))
    assert failed.error is None and "ZeroDivisionError" in failed.content and "[exit code 1]" in failed.content
