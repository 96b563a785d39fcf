"""Grading a math answer against a reference: Hugging Face's math-verify when installed, else a built-in grader.

Two graders behind one call, `grade(completion, reference, grader)`:
- "math_verify": the `math-verify` package (the `barerl[math]` extra), which TRL's and open-r1's accuracy
  rewards use: it extracts LaTeX and plain expressions and compares them symbolically with SymPy (fractions,
  intervals, sets, equations, units, percentages). Its timeouts use `signal.alarm`, which works only in a
  process's main thread, so in other threads (a `RewardRunner` with `num_workers=0`) it runs without them.
- "builtin": a small hand-written grader with no dependencies: the last `\\boxed{}` (else an `Answer:` line,
  a GSM8K `####`, or the last math span or number), normalised, compared numerically when both sides are
  numbers, item by item for tuples and intervals, and as strings otherwise. It stays the fallback so that the core install grades math without SymPy.
- "auto" (the default): math-verify when it is importable, else the built-in grader. Asking for
  "math_verify" (`math_accuracy`'s `grader` argument, or the built-in reward `math_verify`) without the
  package is an error naming the extra, never a silent fallback.

A reference is a dataset's `answer` (the whole value, or its `\\boxed{}` / `####` part) or a worked
`solution` (its final answer is extracted as from a completion). A reference that yields no answer grades
as None: "not applicable", never a wrong 0.
"""

from __future__ import annotations

import importlib.util
import math
import re
import threading

GRADERS = ("auto", "math_verify", "builtin")
MATH_VERIFY_TIMEOUT_S = 5  # per parse and per comparison (math-verify's own default)


def grade(completion: str, reference, grader: str = "auto", is_solution: bool = False) -> float | None:
    """1.0 when `completion`'s final answer equals the reference's, 0.0 when not, None when the reference
    gives no answer. reference: a dataset's `answer` value, or its worked `solution` when is_solution."""
    if reference is None:
        return None
    if resolve_grader(grader) == "math_verify":
        return _grade_with_math_verify(completion, str(reference), is_solution)
    ref = extract_answer(str(reference)) if is_solution else reference_answer(reference)
    return None if ref is None else float(answers_match(extract_answer(completion), ref))


def resolve_grader(grader: str) -> str:
    """"math_verify" or "builtin" for a `grader` setting; an error when math-verify is asked for but missing."""
    if grader not in GRADERS:
        raise ValueError(f"math_accuracy: grader must be one of {list(GRADERS)}, got {grader!r}")
    installed = importlib.util.find_spec("math_verify") is not None
    if grader == "math_verify" and not installed:
        raise ValueError("math_accuracy: grader='math_verify' needs the math-verify package: "
                         "pip install 'barerl[math]'")
    if grader == "auto":
        return "math_verify" if installed else "builtin"
    return grader


# ---------------------------------------------------------------------------------------------------------
# math-verify


def _grade_with_math_verify(completion: str, reference: str, is_solution: bool) -> float | None:
    from math_verify import parse, verify

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(reference if is_solution else _as_latex(reference), parsing_timeout=timeout)
    if not gold:
        return None
    predicted = parse(completion, parsing_timeout=timeout)
    return float(verify(gold, predicted, timeout_seconds=timeout))


def _as_latex(answer: str) -> str:
    """A bare `answer` value in math delimiters, so that math-verify reads it as one LaTeX expression
    (bare, `2\\sqrt{2}` would be read as the plain number 2); the part after a GSM8K `####` only."""
    answer = answer.rsplit("####", 1)[-1].strip()
    delimited = any(mark in answer for mark in ("$", "\\(", "\\[", "\\boxed", "\\fbox"))
    return answer if delimited else f"${answer}$"


# ---------------------------------------------------------------------------------------------------------
# The built-in grader


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included; None if absent."""
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    if max(boxed, fbox) < 0:
        return None
    rest = text[boxed + len("\\boxed"):] if boxed > fbox else text[fbox + len("\\fbox"):]
    rest = rest.lstrip()
    if not rest.startswith("{"):  # "\boxed 5": up to the next space or $
        match = re.match(r"([^\s$]+)", rest)
        return match.group(1) if match else None
    depth = 0
    for j, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:j]
    return None  # unbalanced braces


_FRACTION = r"-?\\[dtc]?frac\{\d+\}\{\d+\}"
_NUMBER = _FRACTION + r"|-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d*\.\d+|-?\d+(?:/\d+)?"
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", flags=re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The final answer in a model's text: the last \\boxed{}, else the last `Answer:` line, else the text
    after the last `####` (GSM8K), else the last math span ($...$, \\(...\\), \\[...\\]) or number, whichever
    ends later. Of an `Answer:` line, a leading "the final answer is" goes and its last math span is taken
    when it has one. None when there is none of these."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (r"answer\s*:\s*(.+)", r"####\s*(.+)"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            line = re.sub(r"^the final answer is\s*", "", found[-1].strip(), flags=re.IGNORECASE)
            spans = list(_MATH_SPAN.finditer(line))
            return _span_text(spans[-1]) if spans else line.rstrip(".")
    spans = list(_MATH_SPAN.finditer(text))
    numbers = list(re.finditer(_NUMBER, text))
    if spans and (not numbers or spans[-1].end() >= numbers[-1].end()):
        return _span_text(spans[-1])
    return numbers[-1].group(0) if numbers else None


def _span_text(span: re.Match) -> str:
    return next(group for group in span.groups() if group is not None).strip()


def reference_answer(value) -> str | None:
    """A dataset's gold answer: its \\boxed{} or `####` part when it has one, else the whole value."""
    if value is None:
        return None
    text = str(value)
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    return text.rsplit("####", 1)[-1].strip() if "####" in text else text.strip()


_DROPPED = ("$", "\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "^\\circ", "^{\\circ}", "\\%", "%")
_RELATIONS = {"geq": ">=", "ge": ">=", "leq": "<=", "le": "<=", "neq": "!=", "ne": "!=", "gt": ">", "lt": "<"}


def normalize_answer(answer: str) -> str:
    """Canonical form for string comparison: no $, spacing commands, spaces, thousands commas, text
    wrappers (\\text, \\textbf, \\mathrm, ...); \\dfrac, \\tfrac and \\cfrac as \\frac, with braces (\\frac94 is
    \\frac{9}{4}, \\sqrt3 is \\sqrt{3}); \\geq, \\leq, \\neq, ... as >=, <=, !=; an equation or a chain of
    them as its last side ("x=5" is "5"), "x \\in [0,1]" as "[0,1]"; "(b)" as "b"."""
    s = answer.strip()
    for token in _DROPPED:
        s = s.replace(token, "")
    s = re.sub(r"\\(?:text|textbf|textnormal|textrm|mathrm|mathbf|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\{[^{}]*\})(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\(geq|ge|leq|le|neq|ne|gt|lt)(?![a-zA-Z])", lambda m: _RELATIONS[m.group(1)], s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    while re.search(r"\d,\d{3}(?!\d)", s):  # 1,234,567 -> 1234567 (not "1,2" lists)
        s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s)
    if "=" in s and not re.search(r"[<>!]", s):  # "x=5" -> "5", "(p,q)=(3,2)" -> "(3,2)", "z=1+1=2" -> "2"
        s = s.rsplit("=", 1)[1]
    s = re.sub(r"^[a-zA-Z]\\in", "", s)  # "x\in[0,1]" -> "[0,1]"
    while s.startswith("{") and s.endswith("}") and extract_boxed("\\boxed" + s) == s[1:-1]:
        s = s[1:-1]
    s = s.lower()
    return re.sub(r"^\(([a-z])\)$", r"\1", s)  # a multiple-choice letter


def parse_number(answer: str) -> float | None:
    """A normalised answer's numeric value: integers, decimals, a/b, \\frac{a}{b}, \\frac ab, with or
    without a unit word after it ("125 miles", "28 percent"); else None."""
    s = normalize_answer(answer)
    sign = -1.0 if s.startswith("-") else 1.0
    s = re.sub(r"(?<=[\d}])[a-z]{2,}$", "", s.lstrip("-"))  # a unit: letters only, 2 or more ("2x" stays)
    frac = re.fullmatch(r"\\frac\{?(\d+(?:\.\d+)?)\}?\{?(\d+(?:\.\d+)?)\}?", s) or re.fullmatch(
        r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", s
    )
    try:
        if frac:
            return sign * float(frac.group(1)) / float(frac.group(2))
        return sign * float(s) if re.fullmatch(r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", s) else None
    except ZeroDivisionError:
        return None


def answers_match(predicted: str | None, reference: str | None, rel_tol: float = 1e-6) -> bool:
    """Numeric equivalence (relative tolerance) when both parse as numbers; tuples and intervals with the
    same brackets element by element; else normalised equality."""
    if predicted is None or reference is None:
        return False
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
    p, r = normalize_answer(predicted), normalize_answer(reference)
    if p == r:
        return True
    p_items, r_items = _bracketed_items(p), _bracketed_items(r)
    return (p_items is not None and r_items is not None and p[0] + p[-1] == r[0] + r[-1]
            and len(p_items) == len(r_items) and all(map(answers_match, p_items, r_items)))


def _bracketed_items(s: str) -> list[str] | None:
    """The comma-separated items of "(a,b)", "[a,b)", ... (commas inside braces or brackets kept);
    None for anything else."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    items, depth, start = [], 0, 1
    for i, ch in enumerate(s[1:-1], start=1):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append(s[start:i])
            start = i + 1
    return [*items, s[start:-1]] if items else None
