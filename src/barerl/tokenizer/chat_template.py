"""Render a model's own Jinja chat template exactly as transformers does, in a sandbox.

The environment copies transformers' `_compile_jinja_template` (utils/chat_template_utils.py): an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}`
tag, `tojson` that does not escape HTML and takes json.dumps' options, and the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` that refuses underscore names. Templates are untrusted input from a
checkpoint: the sandbox keeps them away from Python internals, and rendering is bounded in time and size
(`template_limits`). Any failure becomes one `ChatTemplateError` naming where the template came from and
Jinja's message (with the line for syntax errors).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes

from barerl.tokenizer.template_limits import (
    BoundedSandbox,
    bound_compiled,
    bounded,
    check_json_indent,
    max_chars_for,
)


class ChatTemplateError(ValueError):
    """A chat template is missing, does not compile, or fails while rendering."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; rendering passes the body through."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore-prefixed attributes (as transformers does)."""

    def __init__(*args, **kwargs):  # same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


class _Dict:
    """`dict(...)` / `dict.fromkeys(...)` for templates, without exposing the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters (<, >, &, '), which would change the prompt text
    check_json_indent(indent)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str, source: str) -> jinja2.Template:
    env = BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(), namespace=_Namespace
    )
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"{source}: chat template syntax error at line {e.lineno}: {e.message}") from None
    bound_compiled(compiled)
    return compiled


def _streamed(compiled: jinja2.Template, inputs: dict, max_chars: int) -> str:
    """The rendered text, counted as it streams out, so that an endless output stops at max_chars."""
    parts, size = [], 0
    for part in compiled.generate(**inputs):
        size += len(part)
        if size > max_chars:
            raise jinja2.exceptions.SecurityError(f"the prompt grew past {max_chars:,} characters, the most a chat "
                                                  "prompt may have here (a template that renders without bound)")
        parts.append(part)
    return "".join(parts)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize(messages: list[dict]) -> list[dict]:
    """Drop None-valued keys and alias the reasoning fields, as transformers does before rendering."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat(
    template: str,
    source: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **variables: Any,
) -> str:
    """The rendered prompt text. `variables` (special tokens, enable_thinking, ...) are template globals.

    `continue_final_message` leaves the last message open (no end-of-turn), for prefilling a reply.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
    messages = _normalize(messages)
    final = None
    if continue_final_message:
        if not messages or not isinstance(messages[-1].get("content"), str):
            raise ChatTemplateError("continue_final_message needs a final message with string content")
        final = messages[-1]["content"]
        messages[-1] = {**messages[-1], "content": final + _CONTINUE_TAG}
    compiled = _compile(template, source)
    inputs = {"messages": messages, "tools": tools, "documents": documents,
              "add_generation_prompt": add_generation_prompt, **variables}
    max_chars = max_chars_for(inputs)
    try:
        with bounded(max_chars):
            text = _streamed(compiled, inputs, max_chars)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"{source}: chat template failed: {e.message or e}") from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError, RecursionError,
            MemoryError) as e:
        # a template calling a method on the wrong type, indexing past a list, recursing without end, ...
        raise ChatTemplateError(f"{source}: chat template failed: {type(e).__name__}: {e}") from None
    if final is not None:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ChatTemplateError(f"{source}: the chat template dropped the final message to continue")
        cut = text.rindex(tag)
        # if the template trimmed the tag's trailing space it may have trimmed the message's too
        text = text[:cut] if text[cut : cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:cut].rstrip()
    return text
