"""The calculator tool of the calculator example: exact arithmetic on integers and decimals.

Named in the example's YAML as `tools: [examples/calculator/calculator.py:calculate]`; barerl builds its
JSON schema from the signature and the docstring. The expression is parsed (ast), never eval'd: only
numbers, + - * / // % **, unary minus and parentheses are accepted, and powers are bounded.
"""

import ast
import operator
from fractions import Fraction

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_EXPONENT = 100


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > _MAX_EXPONENT):
            raise ValueError(f"exponents must be integers up to {_MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r} (use numbers, + - * / // % ** and parentheses)")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    decimal = float(value)
    return f"{decimal:.10g}" if Fraction(str(decimal)) != value else repr(decimal)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: The expression, e.g. "(1234 * 56 - 789) / 3". Numbers, + - * / // % ** and parentheses.

    Returns:
        The value: an integer when it is one, else a decimal.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {e.msg}") from None
    return _format(_value(tree.body))
