"""Which ops give a row the same bits whatever batch it is computed in (batch invariance), on the GPU.

The engine computes a token in a decode batch of a few rows; the trainer computes the same token inside a
packed micro-batch of thousands. For each op of a Qwen3-0.6B layer, rows of a small batch are compared bit for
bit with the same rows computed inside a large one. Matrix products: every algorithm cuBLASLt proposes at
each size, with its configuration (tile, split-K parts, reduction scheme), against the large batch's product
with the algorithm in use. Prints the fraction of differing elements; a probe, not a test (attention has
its own GPU test, tests/ops/test_paged_attention.py).

    python bench/batch_invariance.py [--big 8192]
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from shapes import QWEN3_06B

BF16 = np.dtype(ml_dtypes.bfloat16)
SMALL = (1, 16, 64, 256, 1024)


def differing(a, b) -> float:
    bits = np.uint16 if a.dtype.itemsize == 2 else np.uint32
    return float((a.view(bits) != b.view(bits)).mean())


def probe_products(cfg, big: int) -> None:
    import cupy

    from barerl.ops.cuda import cublaslt

    C, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * D
    shapes = [("qkv", qkv, C, False, BF16), ("o_proj", C, cfg.q_size, True, BF16),
              ("gate_up", 2 * I, C, False, BF16), ("down", C, I, True, BF16),
              ("lm_head", cfg.vocab_size, C, False, np.dtype(np.float32))]
    rng = cupy.random.default_rng(0)
    for name, N, K, residual, out_dtype in shapes:
        rows = min(big, 2048) if name == "lm_head" else big  # (2048, 151936) fp32 is 1.2 GB already
        x = rng.standard_normal((rows, K), dtype=np.float32).astype(BF16)
        w = (rng.standard_normal((N, K), dtype=np.float32) * 0.02).astype(BF16)
        res = rng.standard_normal((rows, N), dtype=np.float32).astype(BF16) if residual else None

        def run(m, algo=None, x=x, w=w, res=res, N=N, out_dtype=out_dtype, residual=residual):
            out = cupy.empty((m, N), out_dtype)
            c = None if res is None else res[:m]
            return cublaslt.matmul(x[:m], w, out, transb=True, beta=1.0 if residual else 0.0, c=c, algo=algo)

        want = run(rows)
        for m in (*[s for s in SMALL if s < rows], rows):
            probe = cupy.empty((m, N), out_dtype)
            configs = cublaslt.candidate_configs(x[:m], w, probe, transb=True, c=None if res is None else res[:m])
            default = differing(run(m), want[:m])
            print(f"{name:8s} M={m:5d} default: {default:.4f} differ")
            for i, config in enumerate(configs):
                got = run(m, i)
                cfg_text = " ".join(f"{k}={v}" for k, v in config.items())
                print(f"{name:8s} M={m:5d} cand {i:2d} [{cfg_text}]: {differing(got, want[:m]):.4f}")
        cupy.get_default_memory_pool().free_all_blocks()


def probe_rowwise(cfg, big: int) -> None:
    """rmsnorm, q/k norm + rope (with and without the KV-cache store), swiglu: rows of 64 vs of big."""
    import cupy

    from barerl.model.rope import rope_tables
    from barerl.ops import cuda

    rng = cupy.random.default_rng(1)
    C, D, H, K = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    x = rng.standard_normal((big, C), dtype=np.float32).astype(BF16)
    norm_w = (1 + 0.1 * rng.standard_normal(C, dtype=np.float32)).astype(BF16)
    small = 64
    h_big, _ = cuda.rmsnorm(x, norm_w, cfg.rms_norm_eps)
    h_small, _ = cuda.rmsnorm(x[:small], norm_w, cfg.rms_norm_eps)
    print(f"rmsnorm           64 of {big}: {differing(h_small, h_big[:small]):.4f} differ")

    cos, sin = (cupy.asarray(t) for t in rope_tables(cfg, 4096))
    qkv = rng.standard_normal((big, (H + 2 * K) * D), dtype=np.float32).astype(BF16)
    positions = cupy.asarray(np.random.default_rng(2).integers(0, 4096, big).astype(np.int32))
    q_norm = (1 + 0.1 * rng.standard_normal(D, dtype=np.float32)).astype(BF16)
    k_norm = (1 + 0.1 * rng.standard_normal(D, dtype=np.float32)).astype(BF16)
    args = (cos, sin, H, K, q_norm, k_norm, cfg.rms_norm_eps)
    rot_big = cuda.qk_norm_rope(qkv, positions, *args)[0]
    rot_small = cuda.qk_norm_rope(qkv[:small], positions[:small], *args)[0]
    print(f"qk_norm_rope      64 of {big}: {differing(rot_small, rot_big[:small]):.4f} differ")
    cache = cupy.zeros((2, 16, 16, K, D), BF16)
    slots = cupy.arange(small, dtype=np.int32)
    rot_store = cuda.qk_norm_rope_store(qkv[:small], positions[:small], *args, cache[0], cache[1], slots)[0]
    print(f"qk_norm_rope_store vs qk_norm_rope, 64 rows: {differing(rot_store, rot_big[:small]):.4f} differ")

    gate_up = rng.standard_normal((big, 2 * cfg.intermediate_size), dtype=np.float32).astype(BF16)
    act_big, act_small = cuda.swiglu(gate_up), cuda.swiglu(gate_up[:small])
    print(f"swiglu            64 of {big}: {differing(act_small, act_big[:small]):.4f} differ")


def main() -> None:
    from barerl.config import ModelConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=int, default=8192, help="rows of the large batch")
    args = parser.parse_args()
    cfg = ModelConfig.from_dict(QWEN3_06B, source="Qwen3-0.6B shape")
    probe_rowwise(cfg, args.big)
    probe_products(cfg, args.big)


if __name__ == "__main__":
    main()
