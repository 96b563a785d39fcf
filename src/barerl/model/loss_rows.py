"""The rows of a packed batch that carry a loss, where the LM head runs.

A batch's other rows (prompt tokens, each sequence's last token) get no gradient from the head, so computing
their logits is wasted: 11% of R1's head (128 prompt tokens of 1,152), more in SFT on chat data whose prompts
are masked. The head runs on the loss rows alone; the loss function still sees (T,) arrays, with 0 for the
log-prob and entropy of the other rows (the loss masks them), and the head's input gradient is 0 there.
"""

from __future__ import annotations

import numpy as np


class LossRows:
    def __init__(self, xp, loss_mask: np.ndarray):
        self.xp = xp
        self.rows = np.flatnonzero(np.asarray(loss_mask))  # on the host: chunk bounds are host integers
        self.num_tokens = int(loss_mask.shape[0])
        self.index = xp.asarray(self.rows)

    @property
    def needed(self) -> bool:
        """Whether compacting saves anything (some rows carry no loss, and some do)."""
        return 0 < self.rows.shape[0] < self.num_tokens

    def gather(self, a):
        return a[self.index]

    def scatter(self, a):
        """(R, ...) on the loss rows -> (T, ...), zeros elsewhere."""
        out = self.xp.zeros((self.num_tokens, *a.shape[1:]), a.dtype)
        out[self.index] = a
        return out

    def loss_fn(self, loss_fn):
        """loss_fn over (T,) arrays as one over the loss rows: (logp, entropy) (R,) -> (loss, dlogp (R,), metrics)."""

        def on_rows(logp, entropy):
            loss, dlogp, metrics = loss_fn(self.scatter(logp), self.scatter(entropy))
            return loss, None if dlogp is None else self.xp.asarray(dlogp)[self.index], metrics

        return on_rows

    def token_grad(self, token_grad):
        """A TokenGrad over (T,) as one over the loss rows: a chunk a..b of them is the span of tokens from its
        first to its last, whose other rows read log-prob 0 and whose gradient there is dropped."""

        def on_rows(logp, a: int, b: int):
            start, stop = int(self.rows[a]), int(self.rows[b - 1]) + 1
            local = self.index[a:b] - start
            span = self.xp.zeros(stop - start, logp.dtype)
            span[local] = logp
            return self.xp.asarray(token_grad(span, start, stop))[local]

        return on_rows
