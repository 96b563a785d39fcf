"""Every op of the network, optimizer and sampler, on two backends with the same names and signatures.

`ops.ref` (NumPy, and the same code on CuPy arrays) is the definition and the oracle; `ops.cuda` runs our
kernels and cuBLASLt on CuPy arrays. Model, engine and trainer code call only `<backend>.<op>`: choosing a
device picks the module (`get_backend`), and nothing above this package touches a kernel.

A model's own choice of arithmetic is bound here too (`ModelOps`): with `batch_invariant`, the products and
the decode attention compute a row the same way whatever else is in its batch, so the engine's decode steps
and the trainer's packed forward give the same bits. The choice belongs to the model, not to the process:
two models (or an engine and a trainer over one) never change each other's arithmetic.
"""

from __future__ import annotations

from functools import partial
from types import ModuleType

DEVICES = ("cpu", "cuda")
# ops that take `batch_invariant`: their fast arithmetic depends on the batch (split-K products, split keys)
BATCH_INVARIANT_OPS = (
    "linear", "linear_backward", "lm_head_logits", "lm_head_logprobs", "lm_head_backward",
    "lm_head_forward_backward", "paged_attention",
)


def get_backend(device: str = "cpu") -> ModuleType:
    """The ops module of a device: `ops.ref` for "cpu", `ops.cuda` for "cuda" (needs CuPy)."""
    if device == "cpu":
        from barerl.ops import ref

        return ref
    if device == "cuda":
        from barerl.ops import cuda

        return cuda
    raise ValueError(f"device must be one of {DEVICES}, got {device!r}")


class ModelOps:
    """A backend's ops as one model calls them: those of BATCH_INVARIANT_OPS with the model's
    `batch_invariant` bound, every other op the backend's own."""

    def __init__(self, backend: ModuleType, batch_invariant: bool = False):
        self.backend, self.batch_invariant = backend, bool(batch_invariant)
        for name in BATCH_INVARIANT_OPS:
            setattr(self, name, partial(getattr(backend, name), batch_invariant=self.batch_invariant))

    def __getattr__(self, name: str):
        return getattr(self.backend, name)
