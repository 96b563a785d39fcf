"""Selective recomputation: which ops' outputs a checkpointed layer keeps through the forward pass.

Checkpointing keeps each layer's input and recomputes the layer in backward. Some ops cost more to redo than
their outputs cost to keep (attention above all: 13 ms of a 249 ms T1 micro-batch for 2.1 GB). The layer
code stays as it is: `RecordingOps` stands in for the backend during a layer's forward pass and keeps the
outputs of the ops named in `keep`, in call order; `ReplayingOps` stands in during the recomputation and
hands those outputs back, in the same order, instead of calling the ops.
"""

from __future__ import annotations

RECOMPUTABLE = ("attention", "linear", "qk_norm_rope", "swiglu", "rmsnorm")
DEFAULT_KEEP = ("attention",)


def check_keep(keep) -> frozenset:
    unknown = sorted(set(keep) - set(RECOMPUTABLE))
    if unknown:
        raise ValueError(f"ops to keep through recomputation must be among {list(RECOMPUTABLE)}, got {unknown}")
    return frozenset(keep)


class RecordingOps:
    """The backend, keeping the outputs of the ops in `keep` (in call order) in `outputs`."""

    def __init__(self, ops, keep) -> None:
        self._ops, self._keep, self.outputs = ops, check_keep(keep), []

    def __getattr__(self, name: str):
        op = getattr(self._ops, name)
        if name not in self._keep:
            return op

        def recorded(*args, **kwargs):
            out = op(*args, **kwargs)
            self.outputs.append(out)
            return out

        return recorded


class ReplayingOps:
    """The backend, answering calls of the ops in `keep` with a RecordingOps' outputs, in the same order."""

    def __init__(self, ops, keep, outputs: list) -> None:
        self._ops, self._keep, self._outputs = ops, check_keep(keep), iter(outputs)

    def __getattr__(self, name: str):
        if name not in self._keep:
            return getattr(self._ops, name)
        return lambda *args, **kwargs: next(self._outputs)
