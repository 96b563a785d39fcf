"""Cascade decode attention at G1's shape: 64 sequences x 640 context in 8 groups of 8 that share their first
128 (or 256) tokens' blocks, as GRPO's samples share their prompt. paged_attention reading every key of every
sequence, against the cascade (each group's shared keys read once, by CTAs of their own in the same launch).
CUDA-graph replays (bench_decode_kernels.gpu_ms).

    PYTHONPATH=src:bench python bench/results/session9/cascade_attention.py
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session8"))
from bench_decode_kernels import K, gpu_ms
from shared_prefix_attention import case


def shared_prefix(shared_tokens: int, groups: int = 8, per_group: int = 8):
    import cupy

    from barerl.backend.ref import SharedPrefix

    seqs = groups * per_group
    lens = np.full(seqs, shared_tokens, np.int32)
    sizes = np.zeros(seqs, np.int32)
    sizes[::per_group] = per_group
    return SharedPrefix(cupy.asarray(lens), cupy.asarray(sizes), cupy.zeros(seqs * K, np.int32))


def measure(tokens: int) -> None:
    from barerl.backend import cuda, ref

    args, _ = case(tokens)
    shared = shared_prefix(tokens)
    want = ref.paged_attention(*args, shared)  # checks the statement; the oracle, on the GPU
    got = cuda.paged_attention(*args, shared_prefix=shared)
    err = float(abs(got.astype(np.float32) - want.astype(np.float32)).max())
    plain = gpu_ms(cuda.paged_attention, args)
    cascade = gpu_ms(lambda *a: cuda.paged_attention(*a, shared_prefix=shared), args)
    print(f"G1 64 x 640, {tokens} tokens shared by 8: paged_attention {1e3 * plain:6.1f} us, cascade "
          f"{1e3 * cascade:6.1f} us ({plain / cascade:.2f}x), max abs err vs fp32 ref {err:.2e}", flush=True)


def no_groups(groups: int, context: int) -> None:
    """A SharedPrefix with no group (distinct prompts): what the cascade's idle CTAs cost."""
    import cupy

    from barerl.backend import cuda
    from barerl.backend.ref import SharedPrefix

    args, _ = case(0, groups=groups, context=context)
    seqs = groups * 8
    none = SharedPrefix(cupy.zeros(seqs, np.int32), cupy.zeros(seqs, np.int32), cupy.zeros(seqs * K, np.int32))
    plain = gpu_ms(cuda.paged_attention, args)
    idle = gpu_ms(lambda *a: cuda.paged_attention(*a, shared_prefix=none), args)
    print(f"{seqs} x {context}, no groups: paged_attention {1e3 * plain:6.1f} us, with an empty SharedPrefix "
          f"{1e3 * idle:6.1f} us", flush=True)


def main() -> None:
    for tokens in (128, 256):
        measure(tokens)
    no_groups(8, 640)  # G1
    no_groups(32, 384)  # G2


if __name__ == "__main__":
    main()
