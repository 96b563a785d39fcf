"""Data parallelism for the training loops: each rank trains on its share of a step's micro-batches, the
gradients are summed across ranks in a fixed order, and the optimizer state is sharded (ZeRO-1).

A step on N ranks equals the step of one rank on the same global batch:
- Data: every rank sees the step's whole list of micro-batches (SFT packs them from one seeded sampler,
  GRPO gathers every rank's rollouts first), so normalisers (tokens or sequences of the whole step) and
  metrics come out as one process's; each rank runs forward / backward on its block (`local`).
- Gradients (`gradient_sum`): "accumulate" adds a rank's micro-batches into one buffer, in order (one
  process's behaviour; ranks agree with one process to rounding, ~1e-7 relative); "tree" computes each
  micro-batch's gradient on its own and adds them in the fixed binary tree of `layout.py`, whose shape
  depends on the step's micro-batch count alone, so any power-of-two number of ranks gives one rank's bits,
  for up to ceil(log2 k) more fp32 gradient buffers on a rank with k micro-batches (none with one).
  Across ranks the shards are summed by `collectives.reduce_scatter`, in the same tree.
- Optimizer (`zero_stage`): 1 shards the fp32 master weights and AdamW moments (`AdamW(shard=...)`): the
  gradients are reduce-scattered, each rank updates its shard, and the updated working weights (bf16 on the
  GPU) are all-gathered: less traffic than an all-reduce of fp32 gradients and 1/N of the state per GPU.
  0 all-reduces the gradients and every rank updates the whole state. Both take the gradient norm of
  `norm.py`, whose bits do not depend on the sharding.
- Overlap with backward: none. The reduction runs once per optimizer step after the last micro-batch's
  backward, in buckets that bound the staging memory. Within a node it cannot pay: an all-reduce of R1's
  2.4 GB of fp32 gradients over NVLink takes ~10 ms against a ~3.4 s GRPO step (generation is 70% of it),
  and 8B's 33 GB ~0.15 s against ~23 s. Across nodes (~50 GB/s per GPU) it would save up to ~3-6% of a step,
  at the price of a hook in every layer's backward, of buckets that are final only on the last micro-batch,
  and (tree) of the fixed order.
- What is trained is one flat buffer, the model's parameters or under LoRA the adapters' (`LoraWeights`):
  the layout, the gradient sums and the shards are the same over either.
- Checkpoints: rank 0 writes them (the sharded state gathered to it first, in the one-process format), every
  rank reads them, with any number of ranks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from barerl.distributed.collectives import all_gather, reduce_scatter, xp_of
from barerl.distributed.communicator import communicator_for
from barerl.distributed.group import ProcessGroup
from barerl.distributed.layout import ShardLayout, left_size, rank_blocks
from barerl.distributed.norm import gradient_norm
from barerl.model.lora import LoraWeights
from barerl.model.weights import ParameterBuffer

Trained = ParameterBuffer | LoraWeights  # the flat buffer the optimizer trains, in its layout


class DataParallel:
    def __init__(self, group: ProcessGroup, params: Trained, device: str, gradient_sum: str = "accumulate",
                 zero_stage: int = 1, bucket_mb: float = 64.0, timeout: float | None = None):
        if gradient_sum not in ("accumulate", "tree"):
            raise ValueError(f"gradient_sum must be 'accumulate' or 'tree', got {gradient_sum!r}")
        self.group, self.rank, self.size = group, group.rank, group.size
        if timeout is not None:
            group.timeout = timeout
        self.gradient_sum = gradient_sum
        self.sharded = zero_stage == 1 and group.size > 1
        bucket_elements = max(group.size, int(bucket_mb * 2**20) // 4)
        self.layout = ShardLayout.build(params.flat.shape[0], group.size, bucket_elements)
        self.comm = communicator_for(group, device)

    @classmethod
    def from_config(cls, group: ProcessGroup, params: Trained, device: str, cfg) -> DataParallel:
        """From a `TrainConfig`'s gradient_sum, zero_stage, ddp_bucket_cap_mb and ddp_timeout."""
        return cls(group, params, device, cfg.gradient_sum, cfg.zero_stage, cfg.ddp_bucket_cap_mb, cfg.ddp_timeout)

    @property
    def is_main(self) -> bool:
        return self.group.is_main

    @property
    def optimizer_shard(self) -> slice | None:
        """The elements this rank's optimizer updates (None: all of them)."""
        return self.layout.shard(self.rank) if self.sharded else None

    # -- data ----------------------------------------------------------------------------------------------
    def local(self, items: list) -> list:
        """This rank's block of a step's micro-batches (contiguous, a subtree of the gradient tree)."""
        block = rank_blocks(len(items), self.size)[self.rank]
        return items[block.start : block.stop]

    def gather_in_order(self, local_items: list, what: str = "metrics") -> list:
        """Every rank's `local` results joined in the order of the step's list (picklable items)."""
        if self.size == 1:
            return local_items
        return [item for part in self.group.allgather(local_items, what) for item in part]

    def gather_arrays_in_order(self, arrays: list, xp, what: str = "per-token metrics") -> list:
        """`gather_in_order` for arrays (NumPy or CuPy, given back as `xp` arrays)."""
        if self.size == 1:
            return arrays
        host = [a if isinstance(a, np.ndarray) else a.get() for a in arrays]
        return [xp.asarray(a) for a in self.gather_in_order(host, what)]

    # -- gradients -----------------------------------------------------------------------------------------
    def micro_batch_gradients(self, items: list, grads: Trained) -> Iterator[tuple[object, Trained]]:
        """Each of this rank's micro-batches with the buffer its backward accumulates into; once the loop is
        done, `grads` (zeroed by the caller) holds their sum (module docstring: `gradient_sum`)."""
        if self.gradient_sum == "accumulate":
            for item in items:
                yield item, grads
            return
        if items:
            yield from _tree_of_buffers(items, grads)

    def step(self, optimizer, lr: float) -> dict:
        """Sum the gradients over ranks, clip by the global norm, update, share the updated weights; the
        optimizer's step metrics."""
        grads = optimizer.grads.flat
        if self.size > 1:
            self.group.arrive("gradient reduction")  # every rank's backward is done (or the job ends here)
            reduce_scatter(self.comm, self.layout, grads)
            if not self.sharded:
                all_gather(self.comm, self.layout, grads, "gradient all-gather")
        norm = gradient_norm(grads, self.layout, self.group, self.sharded)
        metrics = optimizer.step(lr, grad_norm=norm)
        if self.sharded and not metrics["skipped"]:
            all_gather(self.comm, self.layout, optimizer.params.flat)
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------------------
    def whole_optimizer_state(self, optimizer):
        """Something whose `state_dict()` is the whole optimizer's, on rank 0 (None on the others): the
        optimizer itself, or its shards gathered (a collective: every rank calls it)."""
        if not self.sharded:
            return optimizer if self.is_main else None
        state = optimizer.state_dict()
        keys = sorted(state["arrays"])
        host = [_to_host(state["arrays"][key]) for key in keys]
        parts = self.group.gather_to_main(host, "optimizer state gather")
        if parts is None:
            return None
        arrays = {key: np.concatenate([p[i] for p in parts]) for i, key in enumerate(keys)}
        return _SavedState({**state, "arrays": arrays})

    def on_main(self, fn, what: str):
        """fn() on rank 0 (writing files); its result, or its error, on every rank."""
        return self.group.on_main(fn, what)


def _tree_of_buffers(items: list, out: Trained) -> Iterator[tuple[object, Trained]]:
    """Depth first: the left half into `out`, the right half into a fresh zero buffer, then out += right."""
    if len(items) == 1:
        yield items[0], out
        return
    half = left_size(len(items))
    yield from _tree_of_buffers(items[:half], out)
    right = out.with_flat(xp_of(out.flat).zeros_like(out.flat))
    yield from _tree_of_buffers(items[half:], right)
    out.flat += right.flat


class _SavedState:
    """A gathered optimizer state, as `save_training_state` reads an optimizer."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def _to_host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()
