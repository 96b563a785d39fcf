"""Where a G1 decode step's time goes: GPU time per backend op of one step (Qwen3-0.6B shape, random bf16
weights, 64 sequences at a context of 640 tokens, block 16), against the whole step replayed from a CUDA
graph and against the step's HBM floor (weights + KV read once).

An op's cost is what the graph replay saves when that op's kernels are left out (its calls return outputs
recorded earlier): launches and the gaps between kernels inside the graph count, and nothing of the host.

    PYTHONPATH=src python bench/profile_decode.py [--seqs 64] [--context 640]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from op_proxy import OpProxy
from shapes import QWEN3_06B


def op_label(name: str, args) -> str:
    """Linear layers are told apart by their weight's shape (qkv, o, gate_up, down)."""
    if name == "linear" and len(args) > 1:
        return f"linear {args[1].shape[0]}x{args[1].shape[1]}"
    return name


class RecordingOps(OpProxy):
    """The backend, keeping every op's output in call order, so that an op can later be left out."""

    def __init__(self, backend):
        super().__init__(backend)
        self.outputs: dict[str, list] = defaultdict(list)

    def call(self, name, op, args, kwargs):
        out = op(*args, **kwargs)
        self.outputs[op_label(name, args)].append(out)
        return out


class OpsWithoutOne(OpProxy):
    """The backend with one op label's kernels left out: its calls return the recorded outputs."""

    def __init__(self, backend, recorded: RecordingOps, left_out: str):
        super().__init__(backend)
        self.outputs, self.left_out = recorded.outputs[left_out], left_out
        self.calls = 0

    def call(self, name, op, args, kwargs):
        if op_label(name, args) != self.left_out:
            return op(*args, **kwargs)
        self.calls += 1
        return self.outputs[(self.calls - 1) % len(self.outputs)]


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

    def graph_ms(ops) -> float:
        """GPU ms of one step replayed from a CUDA graph (the model's ops from `ops`)."""
        model.ops = ops
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            step(ops)
            stream.synchronize()
            stream.begin_capture()
            step(ops)
            graph = stream.end_capture()
            graph.launch(stream)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(args.steps):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
        model.ops = backend
        return cupy.cuda.get_elapsed_time(start, end) / args.steps

    backend = model.ops
    step(backend)  # compiles
    full_ms = graph_ms(backend)
    recorded = RecordingOps(backend)
    model.ops = recorded
    step(recorded)
    model.ops = backend
    cost = {label: (full_ms - graph_ms(OpsWithoutOne(backend, recorded, label)), len(outs))
            for label, outs in recorded.outputs.items()}

    weights = cfg.num_parameters() * 2
    kv_read = args.seqs * (args.context + 1) * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    floor_ms = (weights + kv_read) / 4.17e12 * 1e3  # the copy rate generate_barerl.py measured on the H200
    print(f"decode step, {args.seqs} seqs x {args.context} context: graph replay {full_ms:.3f} ms, HBM floor "
          f"{floor_ms:.3f} ms (weights {weights / 1e9:.2f} GB + KV {kv_read / 1e9:.2f} GB at 4.17 TB/s)")
    print(f"{'op (left out of the graph)':28s} {'calls':>6s} {'ms saved':>9s} {'us/call':>8s} {'share':>7s}")
    for label, (ms, calls) in sorted(cost.items(), key=lambda kv_: -kv_[1][0]):
        print(f"{label:28s} {calls:6d} {ms:9.3f} {1e3 * ms / calls:8.1f} {100 * ms / full_ms:6.1f}%")
    rest = full_ms - sum(ms for ms, _ in cost.values())
    print(f"{'rest (indexing, copies)':28s} {'':6s} {rest:9.3f} {'':8s} {100 * rest / full_ms:6.1f}%")


if __name__ == "__main__":
    main()
