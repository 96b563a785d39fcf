"""Tool schemas from signatures and docstrings equal transformers' `get_json_schema` (the oracle), and
functions that cannot be described are refused with the function and argument named."""

import enum
from typing import Any, Literal, Optional, Union

import pytest

from barerl.train.tool_schema import ToolSchemaError, function_schema, parse_docstring

get_json_schema = pytest.importorskip("transformers.utils").get_json_schema


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


def multiply(a: float, b: float = 1.0) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product.
    """
    return a * b


def search(query: str, limit: Optional[int] = None, tags: list[str] | None = None, exact: bool = False):  # noqa: UP045 -- typing.Optional on purpose
    """
    Search the index for documents
    that match a query.

    Args:
        query (str): What to look for; a long description
            that continues on the next line.
        limit: At most this many results.
        tags: Only documents with all of these tags.
        exact: Match the whole phrase.
    """


def shapes(point: tuple[int, int], weights: dict[str, float], anything: Any, either: Union[int, str],  # noqa: UP007
           mixed: int | list[int], mode: Literal["fast", "slow"], color: Color, unit: str = "cm",
           flags: list = ()) -> dict[str, int]:
    """Exercise every kind of type hint.

    Args:
        point: An (x, y) point.
        weights: A weight per name.
        anything: Any JSON value.
        either: A number or a name.
        mixed: One number or several.
        mode: How to run.
        color: A color.
        unit: The unit (choices: ["cm", "in"])
        flags: Free-form flags.

    Returns:
        Counts per name.

    Raises:
        ValueError: never.
    """


class Calculator:
    def add(self, x: int, y: int) -> int:
        """Add two integers.

        Args:
            x: First.
            y: Second.
        """
        return x + y


def no_arguments() -> str:
    """Say hello."""
    return "hello"


@pytest.mark.parametrize("fn", [multiply, search, shapes, Calculator().add, Calculator.add, no_arguments],
                         ids=lambda f: f.__qualname__)
def test_schema_equals_transformers(fn):
    assert function_schema(fn) == get_json_schema(fn)


def test_docstring_sections():
    description, args, returns = parse_docstring(multiply.__doc__)
    assert (description, args, returns) == ("Multiply two numbers.", {"a": "The first factor.",
                                                                      "b": "The second factor."}, "The product.")


def _no_doc(x: int):
    return x


def _no_hint(x):
    """Doc.

    Args:
        x: A value.
    """


def _undescribed(x: int, y: int):
    """Doc.

    Args:
        x: A value.
    """


def _custom_class(x: Calculator):
    """Doc.

    Args:
        x: A calculator.
    """


@pytest.mark.parametrize("fn, message", [
    (_no_doc, "'_no_doc' has no docstring"),
    (_no_hint, "argument 'x' has no type hint"),
    (_undescribed, "does not describe 'y'"),
    (_custom_class, "argument 'x': no JSON schema for"),
])
def test_unconvertible_functions_are_refused(fn, message):
    with pytest.raises(ToolSchemaError, match=message):
        function_schema(fn)
