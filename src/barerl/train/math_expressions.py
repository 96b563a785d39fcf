"""A small safe evaluator of LaTeX arithmetic for the built-in math grader (math_grading.py): an expression
parsed to a tree of tuples ("num", v), ("var", name), ("neg", a), ("abs", a), ("fact", a), ("call", function,
a), (binary operation, a, b), evaluated over the complex numbers. Never `eval`; text it does not read as an
expression (relations, lists, words, unknown commands, nesting too deep) parses to None.
"""

from __future__ import annotations

import cmath
import math
import operator
import re

_FUNCTIONS = {
    "sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "sec": lambda z: 1 / cmath.cos(z),
    "csc": lambda z: 1 / cmath.sin(z), "cot": lambda z: 1 / cmath.tan(z), "arcsin": cmath.asin,
    "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh, "tanh": cmath.tanh,
    "exp": cmath.exp, "ln": cmath.log, "log": cmath.log,
}
_CONSTANTS = {"pi": cmath.pi}
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
           "pow": operator.pow}
# an answer's expression is short; the bound also keeps the trees' depth within Python's recursion limit
MAX_TOKENS = 256
_TOKEN = re.compile(r"\\[a-zA-Z]+|\d+\.?\d*|\.\d+|\S")


class _NotExpression(ValueError):
    """Text that the evaluator does not read as an expression: relations, lists, words, unknown commands."""


def parse_expression(text: str) -> tuple | None:
    """The expression tree of `text`, or None when it is no expression the evaluator knows (a completion
    nested deeper than Python's recursion limit included: grading never raises on what a model wrote)."""
    try:
        return _Parser(text).parse()
    except (_NotExpression, RecursionError):
        return None


def expression_variables(tree: tuple) -> set[str]:
    if tree[0] == "var":
        return {tree[1]}
    return set().union(*(expression_variables(child) for child in tree[1:] if isinstance(child, tuple)))


def evaluate_expression(tree: tuple, values: dict[str, complex]) -> complex | None:
    """The tree's value, or None where it is undefined (a division by zero, an overflow) or not finite."""
    try:
        value = _value(tree, values)
    except (ArithmeticError, ValueError, RecursionError):
        return None
    return value if cmath.isfinite(value) else None


def _value(tree: tuple, values: dict[str, complex]) -> complex:
    kind = tree[0]
    if kind == "num":
        return complex(tree[1])
    if kind == "var":
        return values[tree[1]]
    if kind == "call":
        return complex(_FUNCTIONS[tree[1]](_value(tree[2], values)))
    if kind in _BINARY:
        return complex(_BINARY[kind](_value(tree[1], values), _value(tree[2], values)))
    operand = _value(tree[1], values)
    if kind == "neg":
        return -operand
    if kind == "abs":
        return complex(abs(operand))
    if abs(operand.imag) > 1e-12 or operand.real < 0:  # "fact": n!, of a non-negative real
        raise ValueError("factorial of a complex or negative number")
    return complex(math.gamma(operand.real + 1))


def _starts_factor(token: str | None) -> bool:
    """Whether `token` begins a factor multiplied by juxtaposition: 2\\sqrt{2}, 3x, x(y+1), 2\\pi."""
    if token is None:
        return False
    if token.startswith("\\"):
        return token[1:] in ("frac", "sqrt", *_CONSTANTS, *_FUNCTIONS)
    return token[0].isalnum() or token[0] in ".({"


class _Parser:
    """Recursive descent over LaTeX arithmetic: + - * / ^ \\cdot \\times \\div, products by juxtaposition,
    \\frac, \\sqrt, \\sqrt[n], |x|, n!, functions (\\sin, \\tan^2 x, \\ln, \\log_b, ...), \\pi, e, and one-letter
    variables with subscripts (a_1, x_{12}). Anything else (relations, commas, \\infty, words) is refused."""

    def __init__(self, text: str):
        self.tokens, self.pos = _TOKEN.findall(text), 0
        if len(self.tokens) > MAX_TOKENS:
            raise _NotExpression("too long for a final answer")
        if re.search(r"[A-Za-z]{3,}", re.sub(r"\\[a-zA-Z]+", " ", text)):
            raise _NotExpression("a word")  # "yes" is no product y*e*s

    def parse(self) -> tuple:
        tree = self.sum()
        if self.peek() is not None:
            raise _NotExpression(f"unexpected {self.peek()!r}")
        return tree

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NotExpression(f"expected {expected or 'more'}, got {token!r}")
        self.pos += 1
        return token

    def sum(self) -> tuple:
        tree = self.product()
        while self.peek() in ("+", "-"):
            kind = "add" if self.take() == "+" else "sub"
            tree = (kind, tree, self.product())
        return tree

    def product(self) -> tuple:
        tree = self.signed()
        while True:
            token = self.peek()
            if token in ("*", "/", "\\cdot", "\\times", "\\div"):
                self.take()
                tree = ("div" if token in ("/", "\\div") else "mul", tree, self.signed())
            elif _starts_factor(token):
                tree = ("mul", tree, self.power())
            else:
                return tree

    def signed(self) -> tuple:
        if self.peek() in ("+", "-"):
            negative = self.take() == "-"
            operand = self.signed()
            return ("neg", operand) if negative else operand
        return self.power()

    def power(self) -> tuple:
        base = self.atom()
        while self.peek() == "!":
            self.take()
            base = ("fact", base)
        if self.peek() == "^":
            self.take()
            return ("pow", base, self.exponent())
        return base

    def exponent(self) -> tuple:
        """A braced exponent, or one token: in LaTeX x^23 is x^2 * 3."""
        token = self.peek()
        if token is not None and token[0].isdigit() and len(token) > 1:
            self.tokens[self.pos] = token[1:]
            return ("num", float(token[0]))
        return self.atom()

    def atom(self) -> tuple:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return ("num", float(token))
        if token == "(":
            return self.closed_by(")")
        if token == "{":
            return self.closed_by("}")
        if token == "|":
            return ("abs", self.closed_by("|"))
        if len(token) == 1 and token.isalpha():
            return self.variable(token)
        return self.command(token[1:]) if token.startswith("\\") else self.refuse(token)

    def closed_by(self, closing: str) -> tuple:
        tree = self.sum()
        self.take(closing)
        return tree

    def refuse(self, token: str) -> tuple:
        raise _NotExpression(f"unexpected {token!r}")

    def variable(self, letter: str) -> tuple:
        if self.peek() != "_":
            return ("num", math.e) if letter == "e" else ("var", letter)
        self.take()
        if self.peek() != "{":
            return ("var", f"{letter}_{self.take()}")
        self.take()
        subscript = []
        while self.peek() != "}":
            subscript.append(self.take())
        self.take()
        return ("var", f"{letter}_{''.join(subscript)}")

    def command(self, name: str) -> tuple:
        if name == "frac":
            numerator = self.exponent()
            return ("div", numerator, self.exponent())
        if name == "sqrt":
            index = ("num", 2.0)
            if self.peek() == "[":  # \sqrt[3]{x}
                self.take()
                index = self.closed_by("]")
            return ("pow", self.exponent(), ("div", ("num", 1.0), index))
        if name in _CONSTANTS:
            return ("num", _CONSTANTS[name])
        if name in _FUNCTIONS:
            return self.function(name)
        return self.refuse("\\" + name)

    def function(self, name: str) -> tuple:
        """\\sin x, \\sin(x), \\sin^2 x (the square of \\sin x; \\sin^{-1} is refused: it means arcsin),
        \\log_2 8."""
        base = None
        if name == "log" and self.peek() == "_":
            self.take()
            base = self.exponent()
        power = None
        if self.peek() == "^":
            self.take()
            power = self.exponent()
            if power[0] == "neg":
                raise _NotExpression("an inverse function written as a power")
        tree = ("call", name, self.power())
        if base is not None:
            tree = ("div", tree, ("call", "ln", base))
        return tree if power is None else ("pow", tree, power)
