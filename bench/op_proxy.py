"""A backend whose every op call goes through one hook: how the profilers time ops or leave them out."""

from __future__ import annotations


class OpProxy:
    """Wraps a backend: calling op `name` runs `self.call(name, op, args, kwargs)`; attributes that are not ops
    (the array module `xp`) pass through. Subclasses override `call`."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        op = getattr(self.backend, name)
        if not callable(op) or name.startswith("xp"):
            return op
        return lambda *args, **kwargs: self.call(name, op, args, kwargs)

    def call(self, name: str, op, args: tuple, kwargs: dict):
        return op(*args, **kwargs)
