"""Run a script with module attributes set first: an A/B of a knob in one run, no code edited.

    python bench/with_settings.py barerl.ops.cuda.paged_attention._UNSPLIT_CTAS_PER_SM=4 -- bench/generate_barerl.py --workloads G1
    python bench/with_settings.py barerl.ops.cuda.rmsnorm=@barerl.ops.ref.rmsnorm.rmsnorm -- ...

A value is a Python literal, or `@module.attr` for another object (a function, say).
"""

from __future__ import annotations

import ast
import importlib
import runpy
import sys
from pathlib import Path


def _resolve(path: str):
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def apply(setting: str) -> None:
    target, _, value = setting.partition("=")
    module, _, attr = target.rpartition(".")
    if not module or not attr:
        raise SystemExit(f"with_settings: expected module.attr=value, got {setting!r}")
    obj = importlib.import_module(module)
    if not hasattr(obj, attr):
        raise SystemExit(f"with_settings: {module} has no attribute {attr!r}")
    setattr(obj, attr, _resolve(value[1:]) if value.startswith("@") else ast.literal_eval(value))
    print(f"with_settings: {target} = {value}", flush=True)


def main() -> None:
    if "--" not in sys.argv:
        raise SystemExit(__doc__)
    split = sys.argv.index("--")
    for setting in sys.argv[1:split]:
        apply(setting)
    script, *args = sys.argv[split + 1 :]
    sys.path.insert(0, str(Path(script).resolve().parent))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
