"""Where a T1 micro-batch's time goes: time per backend op of one forward + backward with recomputation
(Qwen3-0.6B shape, random bf16 weights, 16 packed sequences of 1,152 tokens), with the matrix ops' achieved
TFLOP/s against the bf16 matrix rate measured in the same run.

On the GPU each op is bracketed by CUDA events on the stream: a training op is large (tens of microseconds and
up), so the host's launch time hides behind the GPU's queue and the events measure GPU time. On the CPU
(`--quick`: a tiny model) the same table times the reference ops with the wall clock.

    PYTHONPATH=src python bench/profile_train_step.py [--quick] [--seqs 16] [--seqlen 1152] [--keep attention,linear]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from common import ceilings
from op_proxy import OpProxy
from shapes import QWEN3_06B, TINY


def attention_flops(q, cu_seqlens, backward: bool) -> float:
    """Causal attention of packed sequences: QK^T and PV (4 L^2/2 D H per sequence); backward 2.5x that."""
    lens = np.diff(np.asarray(cu_seqlens.get() if hasattr(cu_seqlens, "get") else cu_seqlens))
    _, heads, dim = q.shape
    forward = float(sum(4 * n * n / 2 * dim * heads for n in lens))
    return 2.5 * forward if backward else forward


def op_flops(name: str, args) -> float:
    """Matrix FLOPs of one call (0 for the elementwise and reduction ops)."""
    if name == "linear":
        (tokens, k), n = args[0].shape, args[1].shape[0]
        return 2.0 * tokens * n * k
    if name == "linear_backward":  # dx and dw
        (tokens, n), k = args[0].shape, args[1].shape[1]
        return 4.0 * tokens * n * k
    if name in ("lm_head_logprobs", "lm_head_logprobs_filtered"):
        return 2.0 * args[0].shape[0] * args[1].shape[0] * args[0].shape[1]
    if name == "lm_head_backward":  # recomputed logits, dh and dw
        return 6.0 * args[1].shape[0] * args[2].shape[0] * args[1].shape[1]
    if name == "attention":
        return attention_flops(args[0], args[3], backward=False)
    if name == "attention_backward":
        return attention_flops(args[1], args[6], backward=True)
    return 0.0


def row_name(name: str, args) -> str:
    """The table's row: linear layers by weight shape (N x K), every other op by name."""
    if name in ("linear", "linear_backward"):
        n, k = args[1].shape if name == "linear" else args[2].shape
        return f"{name} {n}x{k}"
    return name


class TimedOps(OpProxy):
    """The backend with every op timed: CUDA events on the GPU, the wall clock on the CPU."""

    def __init__(self, backend, gpu: bool):
        super().__init__(backend)
        self.gpu = gpu
        self.calls: dict[str, list] = defaultdict(list)  # name -> [(start, end, flops)]

    def call(self, name, op, args, kwargs):
        start = self._mark()
        out = op(*args, **kwargs)
        self.calls[row_name(name, args)].append((start, self._mark(), op_flops(name, args)))
        return out

    def _mark(self):
        if not self.gpu:
            return time.perf_counter()
        import cupy

        event = cupy.cuda.Event()
        event.record()
        return event

    def report(self) -> dict[str, tuple[float, int, float]]:
        """op -> (ms, calls, matrix FLOPs)."""
        if self.gpu:
            import cupy

            cupy.cuda.Device().synchronize()

        def ms(a, b) -> float:
            return cupy.cuda.get_elapsed_time(a, b) if self.gpu else (b - a) * 1e3

        return {name: (sum(ms(a, b) for a, b, _ in calls), len(calls), sum(f for _, _, f in calls))
                for name, calls in self.calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU (smoke test)")
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=1152)
    parser.add_argument("--keep", default="attention", help="ops kept through recomputation, comma-separated")
    args = parser.parse_args()
    if args.seqs < 1 or args.seqlen < 2:
        parser.error(f"--seqs must be >= 1 and --seqlen >= 2 (a target per token), got {args.seqs}, {args.seqlen}")

    from barerl.config import ModelConfig
    from barerl.model.model import Model, PackedBatch
    from barerl.train.optimizer import AdamW

    gpu = not args.quick
    keep = tuple(filter(None, args.keep.split(",")))
    cfg_dict = {**QWEN3_06B, **(TINY if args.quick else {})}
    seqs, seqlen = (4, 64) if args.quick else (args.seqs, args.seqlen)
    cfg = ModelConfig.from_dict(cfg_dict, source="Qwen3-0.6B shape")
    model = Model.random(cfg, device="cuda" if gpu else "cpu", dtype="bfloat16" if gpu else "float32", seed=0)
    xp = model.xp
    grads = AdamW(model.params, model.backend).grads
    rng = np.random.default_rng(1)
    batch = PackedBatch.from_sequences(rng.integers(0, cfg.vocab_size, (seqs, seqlen)).tolist())
    n = float(seqs * (seqlen - 1))

    def loss_fn(logp, entropy):
        return float(-logp.sum()) / n, xp.full(logp.shape, -1.0 / n, np.float32), {}

    def micro_batch() -> float:
        start = time.perf_counter()
        model.forward_backward(batch, loss_fn, grads, checkpoint=True, keep_ops=keep)
        if gpu:
            import cupy

            cupy.cuda.Device().synchronize()
        return (time.perf_counter() - start) * 1e3

    backend = model.ops
    micro_batch()  # compiles kernels, grows the memory pool
    plain_ms = min(micro_batch() for _ in range(3))
    timed = TimedOps(backend, gpu)
    model.ops = timed
    micro_batch()
    model.ops = backend
    per_op = timed.report()

    ceiling = ceilings("cupy")["matmul_tflops"] if gpu else float("nan")
    total = sum(ms for ms, _, _ in per_op.values())
    print(f"micro-batch {seqs} x {seqlen} tokens, forward + backward with recomputation: {plain_ms:.1f} ms "
          f"(ops timed one by one: {total:.1f} ms); bf16 matrix ceiling {ceiling:.0f} TFLOP/s")
    print(f"{'op':28s} {'calls':>6s} {'ms':>9s} {'share':>7s} {'TFLOP/s':>8s} {'of ceiling':>10s}")
    for name, (ms, calls, flops) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        rate = flops / (ms / 1e3) / 1e12 if flops and ms else float("nan")
        rate_text = f"{rate:8.1f} {100 * rate / ceiling:9.1f}%" if flops and gpu else f"{'':8s} {'':10s}"
        print(f"{name:28s} {calls:6d} {ms:9.2f} {100 * ms / total:6.1f}% {rate_text}")


if __name__ == "__main__":
    main()
