"""Does L2 already spare the re-reads of a prompt shared by 8 samples? G1-shaped decode attention (64 sequences x
640 context, 16 q heads / 8 kv heads, head_dim 128, bf16, block 16) with every sequence's blocks distinct, then
with the first 128 tokens' blocks shared by each group of 8 sequences (as GRPO's samples share their prompt).

    PYTHONPATH=src:bench python bench/results/session8/shared_prefix_attention.py
"""

import numpy as np
from bench_decode_kernels import BF16, BLOCK, D, H, K, gpu_ms


def case(shared_tokens: int, groups: int = 8, per_group: int = 8, context: int = 640, seed: int = 0):
    import cupy

    rng = np.random.default_rng(seed)
    per_seq = context // BLOCK
    shared = shared_tokens // BLOCK
    seqs = groups * per_group
    own = per_seq - shared
    num_blocks = groups * shared + seqs * own
    physical = rng.permutation(num_blocks).astype(np.int32)
    tables = np.zeros((seqs, per_seq), np.int32)
    for s in range(seqs):
        g = s // per_group
        tables[s, :shared] = physical[g * shared:(g + 1) * shared]
        start = groups * shared + s * own
        tables[s, shared:] = physical[start:start + own]
    q = cupy.asarray(rng.standard_normal((seqs, H, D), np.float32).astype(BF16))
    k_cache = cupy.asarray(rng.standard_normal((num_blocks, BLOCK, K, D), np.float32).astype(BF16))
    v_cache = cupy.asarray(rng.standard_normal((num_blocks, BLOCK, K, D), np.float32).astype(BF16))
    lens = cupy.full(seqs, context, np.int32)
    cu = cupy.arange(seqs + 1, dtype=np.int32)
    unique = num_blocks * BLOCK * K * D * 2 * 2
    return (q, k_cache, v_cache, cupy.asarray(tables), lens, cu, D**-0.5), unique


def cascade_proxies():
    """What a cascade (prefix read once per group of 8 samples) would run at G1's mean context: the suffixes
    (64 sequences x 512 keys) and the prefixes (8 groups x 128 keys, each with its 8 samples' 16 q heads per kv
    head as the 16 heads of one query token)."""
    import cupy

    from barerl.backend import cuda
    from barerl.kernels import paged_attention as pa

    suffix, _ = case(0, context=512)
    rng = np.random.default_rng(1)
    blocks = 8 * 128 // BLOCK
    tables = cupy.asarray(rng.permutation(blocks).astype(np.int32).reshape(8, 128 // BLOCK))
    k_cache = cupy.asarray(rng.standard_normal((blocks, BLOCK, K, D), np.float32).astype(BF16))
    q = cupy.asarray(rng.standard_normal((8, 16 * K, D), np.float32).astype(BF16))
    prefix = (q, k_cache, k_cache, tables, cupy.full(8, 128, np.int32), cupy.arange(9, dtype=np.int32), D**-0.5)
    print(f"cascade proxy: suffixes 64 x 512 {1e3 * gpu_ms(cuda.paged_attention, suffix):6.1f} us "
          f"({pa.num_splits(64, K, 512)} splits); prefixes 8 groups x 128 keys x 16 heads per kv head "
          f"{1e3 * gpu_ms(cuda.paged_attention, prefix):6.1f} us ({pa.num_splits(8, K, 128)} splits)")


def main() -> None:
    from barerl.backend import cuda

    cascade_proxies()

    logical = 64 * 640 * K * D * 2 * 2
    for shared in (0, 128, 256):
        args, unique = case(shared)
        for name, fn in (("paged_attention", cuda.paged_attention),
                         ("paged_attention_invariant", cuda.paged_attention_invariant)):
            ms = gpu_ms(fn, args)
            print(f"{name:26s} prompt shared by 8: {shared:3d} tokens: {1e3 * ms:6.1f} us, "
                  f"{logical / ms / 1e9:5.2f} TB/s of logical bytes, {unique / ms / 1e9:5.2f} TB/s of unique bytes")


if __name__ == "__main__":
    main()
