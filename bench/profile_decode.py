"""Where a G1 decode step's time goes: GPU time per backend op of one step (Qwen3-0.6B shape, random bf16
weights, 64 sequences at a context of 640 tokens, block 16), against the whole step replayed from a CUDA
graph and against the step's HBM floor (weights + KV read once).

Each op is bracketed by CUDA events on the stream (the GPU time of its kernels, including the gaps between
them, not the host's launch time); ops run eagerly, so the sum minus the graph replay shows what launches
and their gaps cost inside the graph too.

    PYTHONPATH=src python bench/profile_decode.py [--seqs 64] [--context 640]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from bench_train_step import QWEN3_06B


class TimedOps:
    """The backend with every op bracketed by CUDA events; `report` sums each op's GPU time."""

    def __init__(self, backend):
        self.backend = backend
        self.events = defaultdict(list)

    def __getattr__(self, name):
        import cupy

        op = getattr(self.backend, name)
        if not callable(op) or name.startswith("xp"):
            return op

        def timed(*args, **kwargs):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            out = op(*args, **kwargs)
            end.record()
            self.events[name].append((start, end))
            return out

        return timed

    def report(self, steps: int) -> dict[str, tuple[float, int]]:
        """op -> (GPU ms per step, calls per step)."""
        import cupy

        cupy.cuda.Device().synchronize()
        return {name: (sum(cupy.cuda.get_elapsed_time(a, b) for a, b in pairs) / steps, len(pairs) // steps)
                for name, pairs in self.events.items()}


def decode_inputs(cfg, seqs: int, context: int, block_size: int, num_blocks: int):
    """One decode step of `seqs` sequences whose caches hold `context` tokens, in shuffled physical blocks."""
    import cupy

    rng = np.random.default_rng(0)
    blocks_per_seq = -(-(context + 1) // block_size)
    tables = rng.permutation(num_blocks)[: seqs * blocks_per_seq].reshape(seqs, blocks_per_seq).astype(np.int32)
    positions = np.full(seqs, context, np.int32)
    slots = tables[:, context // block_size] * block_size + context % block_size
    return {
        "input_ids": cupy.asarray(rng.integers(0, cfg.vocab_size, seqs), dtype=np.int32),
        "positions": cupy.asarray(positions), "cu_seqlens_q": cupy.arange(seqs + 1, dtype=np.int32),
        "context_lens": cupy.asarray(positions + 1), "block_tables": cupy.asarray(tables),
        "slot_mapping": cupy.asarray(slots.astype(np.int32)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import cupy

    from barerl.config import ModelConfig
    from barerl.model.model import Model

    cfg = ModelConfig.from_dict(QWEN3_06B, source="Qwen3-0.6B shape")
    model = Model.random(cfg, device="cuda", dtype="bfloat16", seed=0)
    block_size = 16
    num_blocks = args.seqs * (-(-(args.context + 1) // block_size)) + 8
    kv = model.allocate_kv_cache(num_blocks, block_size)
    kv[...] = cupy.random.standard_normal(kv.shape, dtype=np.float32).astype(kv.dtype)
    inputs = decode_inputs(cfg, args.seqs, args.context, block_size, num_blocks)
    sampling = {"temperature": cupy.ones(args.seqs, np.float32), "top_k": cupy.zeros(args.seqs, np.int32),
                "top_p": cupy.ones(args.seqs, np.float32), "min_p": cupy.zeros(args.seqs, np.float32),
                "seeds": cupy.arange(args.seqs, dtype=np.uint64), "counters": cupy.zeros(args.seqs, np.int64)}

    def step(ops):
        logits = model.forward_paged(**inputs, kv_cache=kv, max_position=args.context + 1)
        return ops.sample(logits, *sampling.values())

    backend = model.backend
    step(backend)  # compiles
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        step(backend)
        stream.synchronize()
        stream.begin_capture()
        step(backend)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(args.steps):
            graph.launch(stream)
        end.record(stream)
        end.synchronize()
    graph_ms = cupy.cuda.get_elapsed_time(start, end) / args.steps

    timed = TimedOps(backend)
    model.backend = timed
    wall = time.perf_counter()
    for _ in range(args.steps):
        step(timed)
    cupy.cuda.Device().synchronize()
    eager_ms = (time.perf_counter() - wall) * 1e3 / args.steps
    model.backend = backend
    per_op = timed.report(args.steps)

    weights = cfg.num_parameters() * 2
    kv_read = args.seqs * (args.context + 1) * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    floor_ms = (weights + kv_read) / 4.17e12 * 1e3  # the copy rate bench_generate measured on the H200
    print(f"decode step, {args.seqs} seqs x {args.context} context: graph replay {graph_ms:.3f} ms, eager "
          f"{eager_ms:.3f} ms wall, HBM floor {floor_ms:.3f} ms (weights {weights / 1e9:.2f} GB + KV "
          f"{kv_read / 1e9:.2f} GB at 4.17 TB/s)")
    total = sum(ms for ms, _ in per_op.values())
    print(f"{'op':24s} {'calls':>6s} {'GPU ms':>8s} {'share':>7s}")
    for name, (ms, calls) in sorted(per_op.items(), key=lambda kv_: -kv_[1][0]):
        print(f"{name:24s} {calls:6d} {ms:8.3f} {100 * ms / total:6.1f}%")
    print(f"{'sum of ops':24s} {'':6s} {total:8.3f}   (graph replay {graph_ms:.3f}: the rest is work between ops)")


if __name__ == "__main__":
    main()
