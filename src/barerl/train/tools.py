"""Tools: Python functions the model calls, their loading from config, and running a call without ever
raising into the rollout.

A tool is a plain function with type hints and a Google-style docstring (`tool_schema.function_schema`
describes it to the chat template), named in config like a reward: `"module:function"`,
`"path/to/file.py:function"`, or the built-in `"python"`, which runs the model's code in the sandbox.

Design decisions:
- `call_tool` turns every failure into a `ToolResult` with `error` set, whose content the model reads as
  the tool's response: a malformed call, an unknown tool (the known ones are listed), arguments that do
  not fit the signature or the schema's JSON types, and an exception the tool raised (its type and
  message; the traceback stays out of the model's context).
- A tool's return value becomes text: strings as they are, None as "", anything else as JSON (str() when
  it is not JSON-serialisable).
- Tools run in a `WorkerPool` thread each (see worker_pool.py): in-process functions should be quick and
  thread-safe; code goes through the sandbox, which runs it in a killable process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from barerl.tokenizer.tool_calls import ToolCall
from barerl.train.sandbox import Sandbox
from barerl.train.specs import load_object
from barerl.train.tool_schema import ToolSchemaError, function_schema

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


class ToolError(ValueError):
    """A tool could not be loaded or described (a configuration problem, reported before training)."""


@dataclass(frozen=True)
class Tool:
    """A callable with the JSON schema the chat template shows the model."""

    name: str
    function: Callable[..., Any]
    schema: dict

    @classmethod
    def from_function(cls, fn: Callable) -> Tool:
        try:
            schema = function_schema(fn)
        except ToolSchemaError as e:
            raise ToolError(str(e)) from None
        return cls(schema["function"]["name"], fn, schema)


@dataclass(frozen=True)
class ToolResult:
    """A call's outcome: `content` is what the model reads; `error` is set when the call failed."""

    call: ToolCall
    content: str
    error: str | None = None
    seconds: float = 0.0

    def message(self) -> dict:
        """The tool message appended to the conversation (rendered by the chat template)."""
        message = {"role": "tool", "content": self.content}
        return {**message, "name": self.call.name} if self.call.name else message


def python_tool(sandbox: Sandbox) -> Tool:
    """The built-in `python` tool: runs the model's program in `sandbox`."""

    def python(code: str) -> str:
        """Run a Python program in a sandbox (no network, no files but its own) and return what it printed.

        Args:
            code: The complete program. Print every value you want to see.
        """
        return sandbox.run_python(code).describe()

    return Tool.from_function(python)


def load_tools(specs: Sequence[str | Callable | Tool], sandbox: Sandbox | None = None) -> dict[str, Tool]:
    """Tools by name from specs ('module:function', 'file.py:function', 'python'), functions or Tools.
    `sandbox` runs the built-in python tool (default: a Sandbox with default limits)."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        if isinstance(spec, Tool):
            tool = spec
        elif spec == "python":
            tool = python_tool(sandbox or Sandbox())
        elif isinstance(spec, str):
            tool = Tool.from_function(load_object(spec, kind="tool", builtins={"python": None}, error=ToolError))
        elif callable(spec):
            tool = Tool.from_function(spec)
        else:
            raise ToolError(f"a tool must be a spec string, a function or a Tool, got {type(spec).__name__}")
        if tool.name in tools:
            raise ToolError(f"two tools are named {tool.name!r}: tool names must be unique")
        tools[tool.name] = tool
    return tools


def _argument_problem(tool: Tool, arguments: dict) -> str | None:
    """Why the arguments do not fit the tool's schema, or None: unknown or missing names, wrong JSON types."""
    parameters = tool.schema["function"]["parameters"]
    properties = parameters["properties"]
    unknown = [name for name in arguments if name not in properties]
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if unknown or missing:
        return (f"{'unknown arguments ' + str(unknown) if unknown else ''}{'; ' if unknown and missing else ''}"
                f"{'missing arguments ' + str(missing) if missing else ''}; {tool.name} takes {list(properties)}")
    for name, value in arguments.items():
        schema = properties[name]
        if value is None and schema.get("nullable"):
            continue
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if kinds and not any(_JSON_TYPES[k](value) for k in kinds if k in _JSON_TYPES):
            return f"argument {name!r} must be {' or '.join(kinds)}, got {json.dumps(value)[:80]}"
        if "enum" in schema and value not in schema["enum"]:
            return f"argument {name!r} must be one of {schema['enum']}, got {json.dumps(value)[:80]}"
    return None


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def call_tool(tools: Mapping[str, Tool], call: ToolCall) -> ToolResult:
    """Run one call; never raises (see the module docstring)."""
    start = time.monotonic()
    if call.error is not None:
        return ToolResult(call, f"Error: {call.error}.", "malformed")
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(call, f"Error: unknown tool {call.name!r}; the tools are {sorted(tools)}.", "unknown_tool")
    problem = _argument_problem(tool, call.arguments)
    if problem is not None:
        return ToolResult(call, f"Error: bad arguments for {call.name}: {problem}.", "bad_arguments")
    try:
        value = tool.function(**call.arguments)
    except Exception as e:  # noqa: BLE001 -- the model reads what went wrong
        return ToolResult(call, f"Error: {call.name} raised {type(e).__name__}: {e}", "raised",
                          time.monotonic() - start)
    return ToolResult(call, _as_text(value), None, time.monotonic() - start)
