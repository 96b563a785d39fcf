"""Grading a math answer against a reference: Hugging Face's math-verify when installed, else a built-in grader.

Two graders behind one call, `grade(completion, reference, grader)`:
- "math_verify": the `math-verify` package (the `barerl[math]` extra), which TRL's and open-r1's accuracy
  rewards use: it extracts LaTeX and plain expressions and compares them symbolically with SymPy (fractions,
  intervals, sets, equations, units, percentages). Its timeouts use `signal.alarm`, which works only in a
  process's main thread, so in other threads (a `RewardRunner` with `num_workers=0`) it runs without them.
- "builtin": a small hand-written grader with no dependencies: the last `\\boxed{}` (with the boxes listed
  just before it; "the final answer is ..." after it instead; else an `Answer:` line, a GSM8K `####`, or the
  last math span or number), normalised, and
  compared as numbers, strings, tuples and intervals item by item, sets and lists in any order, matrices
  entry by entry, relations (and a reference inequality against an interval), and expressions by their
  values at a few points, with a small safe evaluator of its own (math_expressions.py). It stays the fallback so that the core
  install grades math without SymPy.
- "auto" (the default): math-verify when it is importable, else the built-in grader. Asking for
  "math_verify" (`math_accuracy`'s `grader` argument, or the built-in reward `math_verify`) without the
  package is an error naming the extra, never a silent fallback.

A reference is a dataset's `answer` (the whole value, or its `\\boxed{}` / `Answer:` / `####` part) or a worked
`solution` (its final answer is extracted as from a completion). A reference that yields no answer grades
as None: "not applicable", never a wrong 0.
"""

from __future__ import annotations

import cmath
import importlib.util
import math
import random
import re
import threading

from barerl.train.math_expressions import evaluate_expression, expression_variables, parse_expression

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
# The built-in grader: finding the final answer


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included; None if absent."""
    boxes = _boxed_spans(text)
    return boxes[-1][2] if boxes else None


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each `\\boxed{}` / `\\fbox{}` in order; a box inside another is part of it."""
    spans: list[tuple[int, int, str]] = []
    closing = None
    for match in re.finditer(r"\\(?:boxed|fbox)", text):
        if spans and match.start() < spans[-1][1]:
            continue
        closing = _closing_braces(text) if closing is None else closing
        span = _box_at(text, match.start(), match.end(), closing)
        if span is not None:
            spans.append(span)
    return spans


def _closing_braces(text: str) -> dict[int, int]:
    """The index of each "{"'s matching "}" (unclosed ones absent), in one pass: a text of many unclosed boxes
    costs one scan, not one per box."""
    closing, open_at = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            open_at.append(i)
        elif ch == "}" and open_at:
            closing[open_at.pop()] = i
    return closing


def _box_at(text: str, start: int, end: int, closing: dict[int, int]) -> tuple[int, int, str] | None:
    """The box whose command is text[start:end]: its braced content, or for "\\boxed 5" the text up to the next
    space or $; None when its braces do not close."""
    while end < len(text) and text[end].isspace():
        end += 1
    if not text.startswith("{", end):
        match = re.compile(r"[^\s$]+").match(text, end)
        return (start, match.end(), match.group(0)) if match else None
    if end not in closing:
        return None
    return start, closing[end] + 1, text[end + 1:closing[end]]


# What may stand between boxes that together give one answer: "\boxed{1}, \boxed{2}", "$\boxed{1}$ and
# $\boxed{2}$", "\boxed{(2,2)} \quad \text{and} \quad \boxed{(6,2)}". Any other word keeps them apart.
_BOX_GAP = re.compile(r"(?:\s|[,;$]|\\[()\[\]]|\\q?quad|\\text\{\s*(?:and|or)?\s*\}|and|or)*", re.IGNORECASE)


def _boxed_run(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last of `boxes`, with the boxes just before it that only separators part from it, as one list
    "1, 2" (a model that boxes each solution). "\\boxed{3} for part (a) and \\boxed{1}" is 1."""
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _BOX_GAP.fullmatch(text, box[1], run[0][0]):
            break
        run.insert(0, box)
    return ", ".join(content for _, _, content in run)


_FRACTION = r"-?\\[dtc]?frac\{\d+\}\{\d+\}"
# digits in groups of three after commas or after spaces ("10,455", "1 000") are one number
_GROUPED_DIGITS = r"-?\d{1,3}(?:(?:,\d{3})+|(?: \d{3})+)(?:\.\d+)?(?!\d)"
# a number glued to a letter before it ("H2O", "x2", "AZYUK2A") is part of a word, not an answer
_NUMBER = r"(?<![A-Za-z])(?:" + _FRACTION + "|" + _GROUPED_DIGITS + r"|-?\d*\.\d+|-?\d+(?:/\d+)?)"
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", flags=re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The final answer in a model's text: its stated answer (`_stated_answer`), else the text after the last
    `####` (GSM8K), else the last math span ($...$, \\(...\\), \\[...\\]) or number, whichever ends later.
    None when there is none of these."""
    stated = _stated_answer(text)
    if stated is not None:
        return stated
    marked = re.findall(r"####\s*(.+)", text)
    return _answer_line_value(marked[-1]) if marked else _last_span_or_number(text)


# "the final answer is ..." after the last box restates the answer after boxing a step's result (math-verify
# too ranks this statement above boxes)
_FINAL_ANSWER_IS = re.compile(r"final answer is\s*:?\s*(.+)", flags=re.IGNORECASE)


def _stated_answer(text: str) -> str | None:
    """The last \\boxed{} (with the boxes listed just before it) unless "the final answer is" follows it (then
    what that statement gives), else the last `Answer:` line's value (`_answer_line_value`); None without a
    box or such a line."""
    boxes = _boxed_spans(text)
    if boxes:
        restated = list(_FINAL_ANSWER_IS.finditer(text, boxes[-1][1]))
        return _answer_line_value(restated[-1].group(1)) if restated else _boxed_run(text, boxes)
    answer_lines = re.findall(r"answer\s*:\s*(.+)", text, flags=re.IGNORECASE)
    return _answer_line_value(answer_lines[-1]) if answer_lines else None


def _last_span_or_number(text: str) -> str | None:
    """The last math span or number of `text`, whichever ends later; None when it has neither."""
    spans = list(_MATH_SPAN.finditer(text))
    numbers = list(re.finditer(_NUMBER, text))
    if spans and (not numbers or spans[-1].end() >= numbers[-1].end()):
        return _span_text(spans[-1])
    return numbers[-1].group(0) if numbers else None


def _answer_line_value(line: str) -> str:
    """The answer an `Answer:` line gives: its first sentence ("12,000,023. I hope it is correct." is
    12,000,023) without "the final answer is"; of a sentence in words ("The largest $n$ is 34") its last
    math span or number, whichever ends later, else its math spans as one list ("$12$ and $13$" is "12, 13"),
    else the whole sentence."""
    line = re.split(r"\.\s+(?=[A-Z<])", line.strip(), maxsplit=1)[0]
    line = re.sub(r"^the final answer is\s*", "", line, flags=re.IGNORECASE).rstrip(".")
    outside_spans = re.sub(r"\\[a-zA-Z]+", " ", _MATH_SPAN.sub(" ", line))
    words = re.search(r"\b(?!and\b)[A-Za-z]{3,}", outside_spans)  # "and" only lists the spans
    spans = list(_MATH_SPAN.finditer(line))
    if words:
        return _last_span_or_number(line) or line
    return ", ".join(_span_text(span) for span in spans) if spans else line


def _span_text(span: re.Match) -> str:
    return next(group for group in span.groups() if group is not None).strip()


def reference_answer(value) -> str | None:
    """A dataset's gold answer: its stated answer (\\boxed{}, boxes listed together: all of them; or an
    `Answer:` line, as a worked solution ends) or `####` part when it has one, else the whole value."""
    if value is None:
        return None
    text = str(value)
    stated = _stated_answer(text)
    if stated is not None:
        return stated
    return text.rsplit("####", 1)[-1].strip() if "####" in text else text.strip()


# ---------------------------------------------------------------------------------------------------------
# The built-in grader: normal forms


_DROPPED = ("\\$", "$", "\\left", "\\right", "\\!", "\\,", "\\;", "^\\circ", "^{\\circ}", "\\%", "%")
_RELATIONS = {"geq": ">=", "ge": ">=", "leq": "<=", "le": "<=", "neq": "!=", "ne": "!=", "gt": ">", "lt": "<"}
# commands that datasets stored with their backslash escaped twice (JSON): "\\frac", "\\le"
_ESCAPED_COMMANDS = r"(?:[dtc]?frac|sqrt|left|right|leq?|geq?|neq?|lt|gt|cdot|times|pi|infty|in|pm|text)"


def _clean(answer: str) -> str:
    """An answer without its LaTeX layout, spaces kept (they part words, commands and list items): no $,
    \\left, spacing commands, text wrappers (\\text, \\mathrm, ...); \\dfrac as \\frac with braces (\\frac94
    is \\frac{9}{4}, \\sqrt 3 is \\sqrt{3}); \\geq, \\leq, \\neq, ... as >=, <=, !=; no digit-grouping commas
    (1,234 and 14{,}916, not "1,2" or "32, 349", which are lists, nor "(12,102)", a pair)."""
    s = re.sub(rf"(?<!\\)\\\\(?={_ESCAPED_COMMANDS}(?![a-zA-Z]))", r"\\", answer.strip())
    s = re.sub(r"\s*\{\s*,\s*\}\s*|,\\!\s*", ",", s)  # LaTeX digit grouping: 14{,}916, 14 {, }916, 11,\! 111
    for token in _DROPPED:
        s = s.replace(token, "")
    s = re.sub(r"(?<!\\)\\ |\\q?quad", " ", s)  # not the "\\ " of a matrix row's end
    s = re.sub(r"\\(?:text|textbf|textnormal|textrm|mathrm|mathbf|mbox)\{([^{}]*)\}", r" \1 ", s)
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\(geq|ge|leq|le|neq|ne|gt|lt)(?![a-zA-Z])", lambda m: _RELATIONS[m.group(1)], s)
    return _GROUPED_NUMBER.sub(_without_grouping, s)


# a number in groups of three digits parted by commas: 1,234 or 12,000,023 ("1,2", "1,2345" are lists)
_GROUPED_NUMBER = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])")


def _without_grouping(number: re.Match) -> str:
    """A grouped number without its commas, unless it fills a pair of brackets alone: "(12,102)" is the pair
    (12, 102), as an interval or a point; a bracketed one-number answer would need no brackets."""
    text, start, end = number.string, number.start(), number.end()
    enclosed = start > 0 and text[start - 1] in "([" and text[end:end + 1] in (")", "]")
    return number.group(0) if enclosed else number.group(0).replace(",", "")


def normalize_answer(answer: str) -> str:
    """Canonical form for string comparison: `_clean`, without spaces; an equation or a chain of them
    whose left side is a name as its stated value (`_final_side`: "x=5" is "5"), "x \\in [0,1]" as "[0,1]";
    outer braces dropped, lower case, "(b)" as "b"."""
    s = re.sub(r"\s+", "", _clean(answer)).rstrip(".")
    s = _final_side(s)
    s = re.sub(r"^[a-zA-Z]\\in", "", s)  # "x\in[0,1]" -> "[0,1]"
    s = _without_outer_braces(s).lower()
    return re.sub(r"^\(([a-z])\)$", r"\1", s)  # a multiple-choice letter


def _without_outer_braces(s: str) -> str:
    """`s` without the braces that enclose all of it ("{{5}}" is "5"; "{1}{2}" stays)."""
    while s.startswith("{") and s.endswith("}") and extract_boxed("\\boxed" + s) == s[1:-1]:
        s = s[1:-1].strip()
    return s


def _is_assignee(s: str) -> bool:
    """Whether `s` is what an answer may give a value to: made of names only (x, AB, a_{37}, f(x), \\theta,
    (p, q), |AB|, A:B, \\frac{NO}{BO}), no number and no sum with one ("2x", "a+3z", "7", "\\sqrt{x}" are
    not), as math-verify reads an assignment."""
    s = re.sub(r"_\{[^{}]*\}|_\w|\\frac", "", s)  # subscripts may hold digits: a_{37}, V_1
    return (re.search(r"[A-Za-z]", s) is not None and "\\sqrt" not in s
            and re.fullmatch(r"(?:\\?[A-Za-z]+|[\s(){}|:/,+*])+", s) is not None)


def _final_side(s: str) -> str:
    """The value an answer states: "x=5" is 5, "z=1+1=2" is 2, "x=1/3\\approx0.33" is 1/3 (the last exact
    side: an approximation after it is commentary), "x\\approx11" is 11. An equation whose left side is not a
    name ("7=11a+c", "2x+z=1") stays whole: it is the answer, and its right side alone is not."""
    if re.search(r"[<>!]", s):
        return s
    parts = re.split(r"(=|\\approx)", s)
    if len(parts) == 1 or not _is_assignee(parts[0]):
        return s
    exact = [parts[i + 1] for i in range(1, len(parts), 2) if parts[i] == "="]
    return (exact or parts[-1:])[-1].strip()


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


# ---------------------------------------------------------------------------------------------------------
# The built-in grader: comparison


def answers_match(predicted: str | None, reference: str | None, rel_tol: float = 1e-6) -> bool:
    """Whether two answers are the same, by the first rule that applies: numbers (relative tolerance) or
    normalised strings; tuples and intervals item by item; sets and lists of answers in any order; matrices
    entry by entry; a relation against a relation or an interval; expressions by their values."""
    if predicted is None or reference is None:
        return False
    return (_scalars_match(predicted, reference, rel_tol) or _collections_match(predicted, reference)
            or _matrices_match(predicted, reference) or _relations_match(predicted, reference)
            or _expressions_match(predicted, reference, rel_tol))


def _scalars_match(predicted: str, reference: str, rel_tol: float) -> bool:
    """Numeric equivalence when both parse as numbers; tuples and intervals with the same brackets element by
    element; else normalised equality."""
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
    p, r = normalize_answer(predicted), normalize_answer(reference)
    if p == r:
        return True
    p_items, r_items = _bracketed_items(p), _bracketed_items(r)
    return (p_items is not None and r_items is not None and p[0] + p[-1] == r[0] + r[-1]
            and _same_sequence(p_items, r_items))


def _same_sequence(predicted: list[str], reference: list[str]) -> bool:
    return len(predicted) == len(reference) and all(map(answers_match, predicted, reference))


def _bracketed_items(s: str) -> list[str] | None:
    """The items of "(a,b)", "[a,b)", ..., parted by commas, or by semicolons where no comma parts them
    ("(0;-2;6)", as many countries write a point); separators inside braces or brackets kept. None for
    anything else."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    for separator in ",;":
        items, depth, start = [], 0, 1
        for i, ch in enumerate(s[1:-1], start=1):
            depth += (ch in "([{") - (ch in ")]}")
            if ch == separator and depth == 0:
                items.append(s[start:i])
                start = i + 1
        if items:
            return [*items, s[start:-1]]
    return None


# ---- sets and lists

# what parts a list's items: "1, 2", "-12; -11", "6 and 8", "(11,7) or (7,11)" (not the "or" of "for")
_LIST_SEPARATOR = re.compile(r",|;|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])")


def _collections_match(predicted: str, reference: str) -> bool:
    """Sets and lists of answers as sets: each item of one side equals an item of the other, in any order
    (`\\{1,2\\}` is `\\{2,1\\}`, "x=1, y=2" is "y=2, x=1"). A bare list against a tuple "(a, b)" is read in the
    tuple's order, since a tuple's order counts. An answer that is no list is a list of one item."""
    p_items, r_items = _listed_items(predicted), _listed_items(reference)
    if p_items is None and r_items is None:
        return False
    p_tuple, r_tuple = _tuple_items(predicted), _tuple_items(reference)
    if p_items is None and p_tuple is not None:
        return _same_sequence(p_tuple, r_items)
    if r_items is None and r_tuple is not None:
        return _same_sequence(p_items, r_tuple)
    return _same_set(p_items or [predicted], r_items or [reference])


def _same_set(predicted: list[str], reference: list[str]) -> bool:
    return (all(any(answers_match(p, r) for r in reference) for p in predicted)
            and all(any(answers_match(p, r) for p in predicted) for r in reference))


def _tuple_items(answer: str) -> list[str] | None:
    s = normalize_answer(answer)
    return _bracketed_items(s) if s.startswith("(") and s.endswith(")") else None


def _listed_items(answer: str) -> list[str] | None:
    """The items of a set `\\{a, b\\}` (even of one item), of a bare list "a, b" / "a; b" / "a and b" (braces
    around it, "x =" or "x \\in" before it dropped), or of "\\pm a" (the list -a, +a); None otherwise."""
    s = _clean(answer).strip()
    assignment = re.match(r"([^=]*?)(?:=|\\in(?![a-z]))", s)
    if assignment and _is_assignee(assignment.group(1)):
        s = s[assignment.end():].strip()
    s = _without_outer_braces(s)
    is_set = s.startswith("\\{") and s.endswith("\\}")
    items = [item for part in _split_top_level(s[2:-2] if is_set else s) for item in _expand_plus_minus(part)]
    return items if is_set or len(items) > 1 else None


def _split_top_level(s: str) -> list[str]:
    """`s` cut at the list separators outside brackets and braces; empty pieces dropped."""
    pieces, start, depth = [], 0, [0]
    for ch in s:
        depth.append(depth[-1] + (ch in "([{") - (ch in ")]}"))
    for match in _LIST_SEPARATOR.finditer(s):
        if depth[match.start()] == 0:
            pieces.append(s[start:match.start()])
            start = match.end()
    return [piece.strip() for piece in [*pieces, s[start:]] if piece.strip()]


def _expand_plus_minus(item: str) -> list[str]:
    """"a \\pm b" as the two answers "a - b" and "a + b"; other items as they are."""
    if item.count("\\pm") != 1:
        return [item]
    return [re.sub(r"\\pm(?![a-zA-Z])", sign, item) for sign in ("-", "+")]


# ---- matrices

_MATRIX = re.compile(r"[(\[]?\s*\\begin\{([pbB]?matrix|array)\}(.*)\\end\{\1\}\s*[)\]]?", flags=re.DOTALL)


def _matrices_match(predicted: str, reference: str) -> bool:
    """Matrices (pmatrix, bmatrix, array, ...: the brackets do not matter) of one shape, entry by entry."""
    p, r = _matrix_rows(predicted), _matrix_rows(reference)
    return (p is not None and r is not None and len(p) == len(r)
            and all(_same_sequence(p_row, r_row) for p_row, r_row in zip(p, r)))


def _matrix_rows(answer: str) -> list[list[str]] | None:
    """A matrix's entries row by row (rows end at \\\\, entries at &); None when the answer is no matrix."""
    match = _MATRIX.fullmatch(_clean(answer).strip())
    if match is None:
        return None
    body = match.group(2)
    if match.group(1) == "array":
        body = re.sub(r"^\{[^{}]*\}", "", body)  # its column layout, {cc}
    rows = [row for row in re.split(r"\\\\", body) if row.strip()]
    return [[entry.strip() for entry in row.split("&")] for row in rows]


# ---- relations

_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _relations_match(predicted: str, reference: str) -> bool:
    """A relation against a relation (`_same_relation`), or a reference inequality against the interval it
    describes ("-793 < a < 10" is (-793, 10), "x > 3" is (3, \\infty)). A predicted inequality against a
    reference interval is not accepted: math-verify's default, whose test verdicts this grader follows."""
    r_relation = _relation(reference)
    if r_relation is None:
        return False
    p_relation = _relation(predicted)
    if p_relation is None:
        return _interval_matches(predicted, _interval_of(r_relation))
    return _same_relation(p_relation, r_relation)


def _relation(answer: str) -> tuple[list[str], list[str]] | None:
    """(sides, relations) of "a < b", "a = b", "a <= x < b", ...; None when the answer has no relation."""
    s = _clean(answer)
    if "!=" in s or re.search(r"\\in(?![a-z])", s):
        return None
    parts = re.split(r"(<=|>=|<|>|=)", s)
    return ([side.strip() for side in parts[0::2]], parts[1::2]) if len(parts) > 1 else None


def _same_relation(predicted: tuple[list[str], list[str]], reference: tuple[list[str], list[str]]) -> bool:
    """Two relations, each written as "f op 0" with op one of =, <, <=, are the same when their f are
    proportional (with a positive factor for inequalities): "x <= 5" is "5 >= x", "x < 1" is "-x > -1",
    "2x+4y-3=0" is "y = -x/2 + 3/4"."""
    p, r = _zero_form(*predicted), _zero_form(*reference)
    return p is not None and r is not None and p[1] == r[1] and _proportional(p[0], r[0], positive=p[1] != "=")


def _zero_form(sides: list[str], relations: list[str]) -> tuple[tuple, str] | None:
    """(f, op) with "left relation right" the same as "f op 0", op one of =, <, <=; None for a chain or an
    unparsable side."""
    if len(relations) != 1:
        return None
    (left, right), op = sides, relations[0]
    if op in (">", ">="):
        left, right, op = right, left, _FLIPPED[op]
    trees = parse_expression(left), parse_expression(right)
    return None if None in trees else (("sub", *trees), op)


def _interval_of(relation: tuple[list[str], list[str]]) -> tuple[str, str, str] | None:
    """(brackets, low, high) of the interval an inequality describes: "a < x <= b" is ("(]", a, b), "x > 3"
    is ("()", 3, \\infty); None for other relations."""
    sides, relations = relation
    if relations[0] in (">", ">="):
        sides, relations = sides[::-1], [_FLIPPED[op] for op in reversed(relations)]
    if not set(relations) <= {"<", "<="}:
        return None
    if len(sides) == 2 and _is_assignee(sides[0]):
        sides = ["-\\infty", *sides]
        relations = ["<", *relations]
    elif len(sides) == 2 and _is_assignee(sides[1]):
        sides = [*sides, "\\infty"]
        relations = [*relations, "<"]
    if len(sides) != 3 or not _is_assignee(sides[1]):
        return None
    brackets = ("(" if relations[0] == "<" else "[") + (")" if relations[1] == "<" else "]")
    return brackets, sides[0], sides[2]


def _interval_matches(answer: str, interval: tuple[str, str, str] | None) -> bool:
    s = normalize_answer(answer)
    items = _bracketed_items(s)
    if interval is None or items is None or len(items) != 2:
        return False
    brackets, low, high = interval
    return s[0] + s[-1] == brackets and answers_match(items[0], low) and answers_match(items[1], high)


# ---- expressions, by their values


def _expressions_match(predicted: str, reference: str, rel_tol: float) -> bool:
    """Expressions with the same value: numerically (2\\sqrt{2} is \\sqrt{8}, \\sqrt{17} is 4.1231056...) or,
    with variables, at the same few points (\\tan^2 x + 1 is \\sec^2 x): a test that equivalent expressions
    pass and different ones fail but for a negligible chance. Both sides need the same variables."""
    f, g = parse_expression(_expression_text(predicted)), parse_expression(_expression_text(reference))
    if f is None or g is None or expression_variables(f) != expression_variables(g):
        return False
    for values in _sample_points(expression_variables(f)):
        a, b = evaluate_expression(f, values), evaluate_expression(g, values)
        if a is None or b is None or not cmath.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9):
            return False
    return True


def _proportional(f: tuple, g: tuple, positive: bool) -> bool:
    """Whether f = c * g for a constant c != 0 (c > 0 when `positive`), at the same few points."""
    names = expression_variables(f)
    if not names or names != expression_variables(g):
        return False
    ratios = []
    for values in _sample_points(names):
        a, b = evaluate_expression(f, values), evaluate_expression(g, values)
        if a is None or b is None or abs(a) < 1e-12 or abs(b) < 1e-12:
            return False
        ratios.append(a / b)
    c = ratios[0]
    return (not positive or (abs(c.imag) < 1e-9 and c.real > 0)) and all(
        cmath.isclose(ratio, c, rel_tol=1e-6) for ratio in ratios)


def _expression_text(answer: str) -> str:
    return _final_side(_clean(answer)).strip().rstrip(".")


def _sample_points(names: set[str]) -> list[dict[str, complex]]:
    """Values for the variables at a few generic points: fixed (grading stays deterministic), real and
    positive (square roots and logarithms of the variables stay on their principal branch)."""
    rng = random.Random(0)
    return [{name: complex(rng.uniform(0.5, 2.5)) for name in sorted(names)} for _ in range(4)]
