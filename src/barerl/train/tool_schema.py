"""JSON schemas for Python tool functions, from their signatures and Google-style docstrings.

The output is the format chat templates expect in `tools=[...]` and the one transformers'
`get_json_schema` writes (our oracle in tests/train/test_tool_schema.py), so a TRL user's tools carry over:

    def multiply(a: float, b: float = 1.0) -> float:
        '''Multiply two numbers.

        Args:
            a: The first factor.
            b: The second factor.
        '''

    function_schema(multiply) == {"type": "function", "function": {
        "name": "multiply", "description": "Multiply two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "description": "The first factor."},
            "b": {"type": "number", "description": "The second factor."}}, "required": ["a"]},
        "return": {"type": "number"}}}

Type hints map as: int integer, float number, str string, bool boolean, None null, list[X] array of X,
tuple[X, Y] array with prefixItems, dict[str, X] object with additionalProperties X, Literal[...] and Enum
classes enum, X | Y a list of types (anyOf when a member carries more than a type), Optional adds
`nullable`. An argument description ending in `(choices: [...])` becomes an enum. Every argument needs a
type hint and a description; a problem raises `ToolSchemaError` naming the function and the argument.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_CONTAINERS = {list: "array", tuple: "array", dict: "object"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Raises):\s*$", re.MULTILINE)
_ARG = re.compile(r"^(\s*)(\w+)\s*(?:\([^()\n]*\))?\s*:\s*(.*)$")
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE | re.DOTALL)


class ToolSchemaError(ValueError):
    """A function cannot be described as a tool: a missing or unsupported type hint, or no description."""


def _enum_schema(values: list) -> dict:
    kinds = list(dict.fromkeys(_SCALARS.get(type(v)) for v in values))
    if None in kinds:
        raise TypeError(f"enum values must be int, float, str, bool or None, got {values}")
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _union_schema(args: tuple) -> dict:
    members = [type_schema(a) for a in args if a is not type(None)]
    if len(members) == 1:
        schema = members[0]
    elif all(m.keys() == {"type"} and isinstance(m["type"], str) for m in members):
        names = sorted({m["type"] for m in members})
        schema = {"type": names[0] if len(names) == 1 else names}
    else:
        schema = {"anyOf": members}
    if type(None) in args:
        schema["nullable"] = True
    return schema


def type_schema(hint: Any) -> dict:
    """The JSON schema of one type hint; TypeError for hints with no JSON equivalent."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if origin is None:
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            if not list(hint):
                raise TypeError(f"the Enum {hint.__name__} has no members")
            return _enum_schema([member.value for member in hint])
        if hint in _SCALARS:
            return {"type": _SCALARS[hint]}
        if hint in _CONTAINERS:
            return {"type": _CONTAINERS[hint]}
        raise TypeError(f"no JSON schema for {hint!r} (use int, float, str, bool, Enum, Literal, list, tuple, "
                        "dict and unions of them, or write the schema by hand)")
    if origin in (typing.Union, types.UnionType):
        return _union_schema(args)
    if origin is typing.Literal:
        return _enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise TypeError(f"{hint}: only fixed-length tuples of two or more types convert (use list[X])")
        return {"type": "array", "prefixItems": [type_schema(a) for a in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])} if len(args) == 2 else {
            "type": "object"}
    raise TypeError(f"no JSON schema for {hint!r}")


def parse_docstring(doc: str) -> tuple[str | None, dict[str, str], str | None]:
    """A Google-style docstring -> (description, {argument: description}, returns description)."""
    sections = _SECTION.split(doc)
    description = sections[0].strip() or None
    named = dict(zip(sections[1::2], sections[2::2]))
    args_text = named.get("Args", named.get("Arguments", ""))
    arguments: dict[str, str] = {}
    indent, current = None, None
    for line in args_text.splitlines():
        match = _ARG.match(line)
        if match and (indent is None or len(match.group(1)) <= indent):
            indent, current = len(match.group(1)), match.group(2)
            arguments[current] = match.group(3).strip()
        elif current is not None and line.strip():
            arguments[current] = f"{arguments[current]} {line.strip()}".strip()
    returns = named.get("Returns", "").strip() or None
    return description, arguments, returns


def _receiver(signature: inspect.Signature) -> str | None:
    """`self` / `cls` without a hint: the implicit first argument of a method, left out of the schema."""
    first = next(iter(signature.parameters.values()), None)
    if first is not None and first.name in ("self", "cls") and first.annotation is inspect.Parameter.empty:
        return first.name
    return None


def function_schema(fn: Callable) -> dict:
    """The tool schema of `fn` (see the module docstring), in transformers' `get_json_schema` format."""
    name = getattr(fn, "__name__", "operation")
    doc = inspect.getdoc(fn)
    if not doc:
        raise ToolSchemaError(f"tool {name!r} has no docstring: describe it and each argument (Google style)")
    description, arg_docs, returns_doc = parse_docstring(doc.strip())
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # noqa: BLE001 -- unresolvable annotations raise NameError, TypeError, ...
        raise ToolSchemaError(f"tool {name!r}: cannot resolve its type hints: {e}") from None
    skip = _receiver(signature)
    properties, required = {}, []
    for param in signature.parameters.values():
        if param.name == skip:
            continue
        if param.name not in hints:
            raise ToolSchemaError(f"tool {name!r}: argument {param.name!r} has no type hint")
        try:
            schema = type_schema(hints[param.name])
        except TypeError as e:
            raise ToolSchemaError(f"tool {name!r}: argument {param.name!r}: {e}") from None
        if param.name not in arg_docs:
            raise ToolSchemaError(f"tool {name!r}: the docstring's Args section does not describe {param.name!r}")
        text = arg_docs[param.name]
        choices = _CHOICES.search(text)
        if choices:
            schema["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
            text = text[: choices.start()].strip()
        properties[param.name] = {**schema, "description": text}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    function = {"name": name, "description": description, "parameters": parameters}
    returns = _return_schema(hints.get("return", inspect.Parameter.empty), returns_doc)
    if returns is not None:
        function["return"] = returns
    return {"type": "function", "function": function}


def _return_schema(hint, doc: str | None) -> dict | None:
    if hint is inspect.Parameter.empty:
        return None
    try:
        schema = type_schema(hint)
    except TypeError:
        return None  # the model never writes the return value: an unconvertible hint is left out
    return {**schema, "description": doc} if doc is not None else schema
