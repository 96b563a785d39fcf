"""Chat templates cannot deny service: rendering stops, with one clear error naming the template, at a time
limit (loops, recursion) or before it builds a prompt past its size limit (one huge string at once, or one
that grows), while real templates render as before."""

import resource
import time

import pytest

from barerl.tokenizer import template_limits
from barerl.tokenizer.chat_template import ChatTemplateError, render_chat

MESSAGES = [{"role": "user", "content": "hi"}]


def render(template, messages=MESSAGES, **variables):
    return render_chat(template, "evil/tokenizer_config.json", messages, **variables)


@pytest.fixture
def short_time_limit(monkeypatch):
    monkeypatch.setattr(template_limits, "MAX_RENDER_SECONDS", 0.3)


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # the hang reported
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",  # 2^40 calls
])
def test_a_template_that_loops_without_bound_stops_at_the_time_limit(short_time_limit, template):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"evil/tokenizer_config.json: chat template failed: rendering took "
                                                r"more than 0.3 s \(a template that loops without bound\)"):
        render(template)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("template, operation", [
    ("{{ 'a' * 300000000 }}", "'\\*'"),  # the 24 GB reported
    ("{{ ['a'] * 300000000 }}", "'\\*'"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "'~'"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'\\+'"),
    ("{{ 'x'.ljust(1000000000) }}", "str.ljust"),
    ("{{ ('x' * 1000).replace('', 'y' * 100000) }}", "str.replace"),
    ("{{ ('x' * 100000).join(['a'] * 100000) }}", "str.join"),
    ("{{ '%999999999s' % 1 }}", "'%'"),
    ("{{ '{:>999999999}'.format(1) }}", "str.format"),
    ("{{ 'x'|center(1000000000) }}", "filter center"),
    ("{{ ('x\n' * 100000)|indent(100000) }}", "filter indent"),
    ("{{ 10 ** 100000000 }}", "'\\*\\*'"),
])
def test_an_operation_that_would_build_a_huge_string_is_refused_before_it_runs(template, operation):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ChatTemplateError, match=rf"chat template failed: {operation} would make [\d,]+ characters, "
                                                r"more than the [\d,]+ a chat prompt may have here"):
        render(template)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB: nothing was built


def test_a_prompt_that_grows_without_bound_stops_at_its_size_limit():
    with pytest.raises(ChatTemplateError, match=r"the prompt grew past 1,048,576 characters"):
        render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="tojson: an indent of 1000000 is more than 64"):
        render("{{ messages|tojson(indent=1000000) }}")
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")


def test_real_templates_and_long_conversations_render_as_before():
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    conversation = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 5000} for i in range(400)]
    text = render(template, conversation, add_generation_prompt=True)
    assert len(text) > 10_000_000 and text.endswith("<|im_start|>assistant\n")  # 10 MB of input: allowed
    assert render("{{ 'ab' * 3 }}{{ '%5s'|format('x') }}{{ 'x'.ljust(4) }}|") == "ababab    xx   |"
