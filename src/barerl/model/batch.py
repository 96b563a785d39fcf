"""The packed batch every training op consumes: sequences concatenated with no padding.

input_ids (T,) int32; targets (T,) int32: the next token of the same sequence (0 at a sequence's last token);
loss_mask (T,) float32: 1 where the target is trained on; positions (T,) int32: position in its sequence;
cu_seqlens (S+1,) int32: sequence boundaries. Attention never crosses a boundary, so packing changes
nothing but speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PackedBatch:
    input_ids: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    positions: np.ndarray
    cu_seqlens: np.ndarray
    num_sequences: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @classmethod
    def from_examples(cls, examples: Sequence) -> PackedBatch:
        """Pack objects with `input_ids` and `loss_mask` lists (loss_mask[i] = 1: token i is trained on)."""
        lengths = [len(e.input_ids) for e in examples]
        if any(n == 0 for n in lengths):
            raise ValueError("cannot pack an empty sequence")
        input_ids = np.array([t for e in examples for t in e.input_ids], dtype=np.int32)
        targets, loss_mask = np.zeros_like(input_ids), np.zeros(input_ids.shape, dtype=np.float32)
        cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        for e, start in zip(examples, cu_seqlens[:-1]):
            n = len(e.input_ids)
            targets[start : start + n - 1] = e.input_ids[1:]
            loss_mask[start : start + n - 1] = e.loss_mask[1:]
        positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]) if lengths else input_ids
        return cls(input_ids, targets, loss_mask, positions.astype(np.int32), cu_seqlens, len(examples))

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> PackedBatch:
        """Pack token lists, every next-token prediction trained on."""
        return cls.from_examples([_Tokens(list(s), [1] * len(s)) for s in sequences])


@dataclass
class _Tokens:
    input_ids: list[int]
    loss_mask: list[int]
