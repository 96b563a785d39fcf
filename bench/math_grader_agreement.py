"""How often barerl's math graders agree with math-verify's own test verdicts.

math-verify's test suite lists (gold, prediction, expected verdict) cases that its authors settled by hand:
LaTeX fractions, `\\boxed{}`, units, percentages, intervals, sets, equations, matrices, long model outputs.
This script collects every parametrised case of that suite and grades each prediction against its gold with
the `math_accuracy` reward (the gold as a dataset's `answer` column), once per grader, and prints the share
of verdicts each grader reproduces, in all and among the pairs settled equal and not equal (a grader that
rewards wrong answers loses the latter); `--show builtin` lists the cases the built-in grader gets wrong. It calls
only `math_accuracy(prompts, completions, answer=..., grader=...)`, so it also measures the built-in grader
of an older checkout (put its src/ first on PYTHONPATH, with `--graders builtin`; before the grader setting
existed the argument was ignored and the built-in grader was the only one).

The suite ships in math-verify's source distribution (not in its wheel):

    pip download math-verify==0.9.0 --no-deps --no-binary :all: && tar xzf math_verify-0.9.0.tar.gz
    python bench/math_grader_agreement.py --tests math_verify-0.9.0/tests [--show builtin]
    git worktree add /tmp/barerl-old REV && PYTHONPATH=/tmp/barerl-old/src \
        python bench/math_grader_agreement.py --tests math_verify-0.9.0/tests --graders builtin

Importing the test modules needs pytest and math-verify (both in the `test` extra). A handful of cases set
options of math-verify's own (precision, strictness, extraction targets); they are kept, with the verdict
the suite expects under those options.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

from barerl.train.rewards import math_accuracy

GRADERS = ("builtin", "math_verify")


def collect_cases(tests: Path) -> list[tuple[str, str, str, bool]]:
    """(test name, gold, prediction, expected) for every parametrised case with a gold and a prediction."""
    sys.path.insert(0, str(tests.parent))  # the suite imports its helpers as `tests.test_all`
    cases = []
    for path in sorted(tests.glob("test_*.py")):
        module = importlib.import_module(f"{tests.name}.{path.stem}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            for mark in getattr(function, "pytestmark", []):
                if mark.name != "parametrize" or "gold" not in mark.args[0]:
                    continue
                names = [n.strip() for n in mark.args[0].split(",")]
                for values in mark.args[1]:
                    case = dict(zip(names, values))
                    expected = case["expected"] if "expected" in case else case["result"]
                    cases.append((f"{path.stem}::{name}", case["gold"], case["pred"], bool(expected)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True, help="math-verify's tests/ folder")
    parser.add_argument("--graders", nargs="+", choices=GRADERS, default=GRADERS)
    parser.add_argument("--show", choices=GRADERS, help="list the cases this grader gets wrong")
    args = parser.parse_args()
    cases = collect_cases(args.tests.resolve())
    for grader in args.graders:
        wrong = [(test, gold, pred, expected) for test, gold, pred, expected in cases
                 if (math_accuracy(None, [pred], answer=[gold], grader=grader) == [1.0]) != expected]
        agree = len(cases) - len(wrong)
        equal = sum(expected for *_, expected in cases)
        equal_wrong = sum(expected for *_, expected in wrong)
        print(f"{grader:12s} agrees on {agree} of {len(cases)} verdicts ({agree / len(cases):.1%}): "
              f"{equal - equal_wrong} of {equal} settled equal, "
              f"{len(cases) - equal - (len(wrong) - equal_wrong)} of {len(cases) - equal} settled not equal")
        if grader == args.show:
            for test, gold, pred, expected in wrong:
                print(f"  {test}: gold {gold!r:.60} pred {pred!r:.80} expected {expected}")


if __name__ == "__main__":
    main()
