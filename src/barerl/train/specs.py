"""Load user code named in a config: `"module:name"`, `"path/to/file.py:name"` or a built-in name.

Rewards, tools and environments are all named this way, from the command line and from YAML. A spec stays a
string until it is loaded, so configs holding specs pickle and worker processes load the code themselves.

Design decisions:
- A location ending in `.py` or containing a path separator is a file, imported once per process under a
  name derived from its resolved path (two files with the same name do not clash); anything else is an
  importable module.
- Every failure is one exception of the caller's type (`RewardError`, `EnvironmentError`, ...) whose
  message names the spec and what was wrong with it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

_FILE_MODULES: dict[str, object] = {}


def _load_file_module(path: Path, spec: str, kind: str, error: type[Exception]):
    key = str(path.resolve())
    if key not in _FILE_MODULES:
        if not path.is_file():
            raise error(f"{kind} {spec!r}: file {path} not found")
        module_spec = importlib.util.spec_from_file_location(f"barerl_user_{abs(hash(key))}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[module_spec.name]
            raise error(f"{kind} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
        _FILE_MODULES[key] = module
    return _FILE_MODULES[key]


def is_file_location(location: str) -> bool:
    return location.endswith(".py") or "/" in location or "\\" in location


def load_object(spec: str, *, kind: str, builtins: Mapping[str, object], error: type[Exception],
                what: str = "function", check: Callable[[object], bool] = callable) -> object:
    """The object a spec names: a built-in by name, or `name` from a module or a .py file.

    kind names the thing in messages ("reward", "tool"); what names the attribute ("function", "class");
    check(obj) must hold for the attribute found (default: callable).
    """
    if ":" not in spec:
        if spec not in builtins:
            known = f"not a built-in ({', '.join(builtins)})" if builtins else "there are no built-ins"
            raise error(f"unknown {kind} {spec!r}: {known}; use 'module:{what}' or 'path/to/file.py:{what}'")
        return builtins[spec]
    location, _, name = spec.rpartition(":")
    if is_file_location(location):
        module = _load_file_module(Path(location), spec, kind, error)
    else:
        try:
            module = importlib.import_module(location)
        except Exception as e:  # a module that fails while importing is as unusable as a missing one
            raise error(f"{kind} {spec!r}: cannot import module {location!r}: {type(e).__name__}: {e}") from e
    obj = getattr(module, name, None)
    if obj is None or not check(obj):
        found = sorted(n for n, value in vars(module).items() if not n.startswith("_") and check(value)
                       and getattr(value, "__module__", None) == module.__name__)
        raise error(f"{kind} {spec!r}: {location} has no {what} {name!r} (it has: "
                    f"{', '.join(found) or 'none'})")
    return obj
