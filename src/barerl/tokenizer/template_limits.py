"""Time and size bounds on rendering a chat template: templates come with checkpoints, and jinja's sandbox keeps
them away from Python's internals but not from running forever or filling the memory (a nested loop hung a
run; `'a' * 300000000` took 24 GB until the kernel killed the process).

Design decisions:
- Time: a template can only run long by looping (`for`) or recursing (macros, recursive loops), so the
  deadline is checked at every call the template makes (the sandbox's `call`: macros, methods, `range`) and
  every 256 iterations of every loop: each `for` of a compiled template iterates through
  `_LoopBound.checked`, inserted into its syntax tree where the template cannot rename or shadow it. A
  recursion too deep ends in RecursionError, reported like the rest. (A trace function on every line of
  template code would do it too, at five times the cost of a render.)
- Size: a chat prompt may be `max_chars` long (1 MiB, or 8 characters per character of input if that is more).
  The output is counted as it streams out of the template. Single operations that could allocate more at
  once are checked *before* they run: `*`, `+`, `%` and `**` (intercepted binary operators), `~` (jinja's
  string join), the output of a macro, the padding and replacing str methods (ljust, center, zfill,
  expandtabs, replace, join, translate, format) and filters (center, indent, replace, join, format), and
  tojson's indent (`check_json_indent`). What accumulates across a loop (a namespace attribute) is built by
  those operations, so it is bounded by them.
- A limit that fires is a jinja SecurityError; `render_chat` reports it as a ChatTemplateError naming the
  template's source, as every other template failure.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from functools import update_wrapper

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDER_SECONDS = 5.0
MIN_MAX_CHARS = 2**20
CHARS_PER_INPUT_CHAR = 8
MAX_JSON_INDENT = 64
_WIDTH = re.compile(r"[%:][^a-zA-Z%{}]*?(\d+)")  # widths and precisions in %-formats and format specs

_budget = threading.local()  # the render in progress on this thread: max_chars, deadline, seconds
_CHECK_EVERY = 256  # loop iterations between looks at the clock


def max_chars_for(inputs) -> int:
    """The longest prompt a render of these inputs (messages, tools, documents, variables) may produce; their
    repr's length stands for their size (it is computed in C, and a little larger)."""
    return max(MIN_MAX_CHARS, CHARS_PER_INPUT_CHAR * len(repr(inputs)))


def check_size(size: int, what: str) -> None:
    if size <= MIN_MAX_CHARS:  # within every render's limit
        return
    limit = getattr(_budget, "max_chars", MIN_MAX_CHARS)
    if size > limit:
        raise SecurityError(f"{what} would make {size:,} characters, more than the {limit:,} a chat prompt may "
                            "have here (a template that renders without bound)")


def check_time() -> None:
    deadline = getattr(_budget, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise SecurityError(f"rendering took more than {_budget.seconds:g} s (a template that loops without bound)")


@contextmanager
def bounded(max_chars: int, seconds: float | None = None):
    """Render within these bounds on this thread (see the module docstring)."""
    seconds = MAX_RENDER_SECONDS if seconds is None else seconds
    previous = vars(_budget).copy()
    _budget.max_chars, _budget.seconds, _budget.deadline = max_chars, seconds, time.monotonic() + seconds
    try:
        yield
    finally:
        vars(_budget).clear()
        vars(_budget).update(previous)


class _LoopBound(Extension):
    """Holds `checked`, which every compiled `for` iterates through (see BoundedSandbox._parse)."""

    @staticmethod
    def checked(iterable):
        for count, item in enumerate(iterable):
            if count % _CHECK_EVERY == 0:
                check_time()
            yield item


def check_json_indent(indent) -> None:
    width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
    if width > MAX_JSON_INDENT:
        raise SecurityError(f"tojson: an indent of {width} is more than {MAX_JSON_INDENT}")


def _sized(value) -> bool:
    return isinstance(value, (str, list, tuple, bytes))


def _check_widths(fmt, what: str) -> None:
    if isinstance(fmt, str):
        widths = [int(w) for w in _WIDTH.findall(fmt)]
        if widths:
            check_size(max(widths), what)


def _check_str_method(name: str, text: str, args: tuple, kwargs: dict) -> None:
    """Before a str method that can make a longer string runs: the length it would make, roughly."""
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        check_size(args[0], f"str.{name}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        check_size(text.count("\t") * size if isinstance(size, int) else 0, "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        occurrences = len(text) + 1 if not args[0] else text.count(args[0])
        check_size(len(text) + occurrences * max(0, len(args[1]) - len(args[0])), "str.replace")
    elif name == "join" and args and _sized(args[0]):
        check_size(len(text) * len(args[0]) + sum(len(x) for x in args[0] if isinstance(x, str)), "str.join")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        check_size(len(text) * longest, "str.translate")
    elif name in ("format", "format_map"):
        _check_widths(text, f"str.{name}")


_STR_METHODS = ("ljust", "rjust", "center", "zfill", "expandtabs", "replace", "join", "translate")


def _checked_method(method):
    name, text = method.__name__, method.__self__

    def checked(*args, **kwargs):
        _check_str_method(name, text, args, kwargs)
        return method(*args, **kwargs)

    return update_wrapper(checked, method)


def _checked_filter(name: str, filter_fn):
    """center(width), indent(width), replace(old, new), join(d) and format(...) checked before they run."""

    def checked(*args, **kwargs):
        values = [a for a in args if not hasattr(a, "environment")]  # drop the eval context jinja may pass
        text = values[0] if values else ""
        if name == "center" and len(values) > 1 and isinstance(values[1], int):
            check_size(values[1], "filter center")
        elif name == "indent":
            width = values[1] if len(values) > 1 else kwargs.get("width", 4)
            lines = text.count("\n") + 1 if isinstance(text, str) else 1
            check_size(len(str(text)) + lines * (width if isinstance(width, int) else len(str(width))),
                       "filter indent")
        elif name == "replace" and isinstance(text, str):
            _check_str_method("replace", text, tuple(values[1:3]), {})
        elif name == "join" and _sized(text):
            joiner = values[1] if len(values) > 1 else kwargs.get("d", "")
            check_size(len(text) * len(str(joiner)) + sum(len(x) for x in text if isinstance(x, str)), "filter join")
        elif name == "format":
            _check_widths(text, "filter format")
        return filter_fn(*args, **kwargs)

    return update_wrapper(checked, filter_fn)


def _bounded_join(join):
    """jinja's str_join / markup_join (the `~` operator), checked before the string is built."""

    def checked(seq):
        parts = list(seq)
        check_size(sum(len(p) if isinstance(p, str) else 8 for p in parts), "'~'")
        return join(parts)

    return checked


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the time and size checks of the module docstring."""

    intercepted_binops = frozenset(["*", "+", "%", "**"])

    def __init__(self, **options):
        options["extensions"] = [*options.get("extensions", ()), _LoopBound]
        super().__init__(**options)
        for name in ("center", "indent", "replace", "join", "format"):
            self.filters[name] = _checked_filter(name, self.filters[name])

    def _parse(self, source, name, filename):
        """The template's syntax tree, each loop iterating through _LoopBound.checked."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            checked = nodes.ExtensionAttribute(_LoopBound.identifier, "checked")
            loop.iter = nodes.Call(checked, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def call(self, context, obj, /, *args, **kwargs):  # positional-only: a template's kwargs may be named so
        check_time()
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        if operator == "+":  # the most frequent by far: checked after, as it makes at most twice an operand
            result = left + right
            if _sized(result):
                check_size(len(result), "'+'")
            return result
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if _sized(seq) and isinstance(count, int):
                    check_size(len(seq) * count, "'*'")
        elif operator == "%":
            _check_widths(left, "'%'")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            check_size(right * abs(left).bit_length() // 3, "'**'")  # ~ digits of the result
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value):
        """str.format / format_map sandboxed as jinja does, after their widths are checked; the padding and
        replacing str methods checked likewise, at access (so that every way of calling them is covered)."""
        name = getattr(value, "__name__", None)
        text = getattr(value, "__self__", None)
        if isinstance(text, str) and name in ("format", "format_map"):
            _check_widths(text, f"str.{name}")
        wrapped = super().wrap_str_format(value)
        if wrapped is None and isinstance(text, str) and name in _STR_METHODS:
            return _checked_method(value)
        return wrapped

    @staticmethod
    def concat(parts):  # a macro's output, and render()'s
        parts = list(parts)
        check_size(sum(len(p) for p in parts), "a macro's output")
        return "".join(parts)


def bound_compiled(template) -> None:
    """The `~` joins of a compiled template checked too (jinja imports them into the template's globals)."""
    names = template.root_render_func.__globals__
    for name in ("str_join", "markup_join"):
        if name in names:
            names[name] = _bounded_join(names[name])
