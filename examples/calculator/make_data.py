"""Writes train.jsonl and test.jsonl of the calculator example: multi-step arithmetic a small model gets
wrong in its head and right with the calculator. `python examples/calculator/make_data.py` (seeded)."""

import json
import random
from pathlib import Path

SYSTEM = ("You can use a calculator. To call it, write\n<tool_call>\n"
          '{"name": "calculate", "arguments": {"expression": "12 * 34"}}\n</tool_call>\n'
          "and wait for its answer. When you know the result, reply with it in \\boxed{}.")


def problem(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(100, 9999), rng.randint(12, 999), rng.randint(10, 9999)
    form = rng.choice(["{a} * {b} + {c}", "{a} * {b} - {c}", "({a} + {c}) * {b}", "{a} * {b} * {d}"])
    expression = form.format(a=a, b=b, c=c, d=rng.randint(2, 19))
    return expression, eval(expression)


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        expression, answer = problem(rng)
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {expression}?"}]
        out.append({"prompt": prompt, "answer": str(answer)})
    return out


if __name__ == "__main__":
    here = Path(__file__).parent
    for name, count, seed in (("train.jsonl", 512, 0), ("test.jsonl", 64, 1)):
        (here / name).write_text("".join(json.dumps(row) + "\n" for row in rows(count, seed)))
