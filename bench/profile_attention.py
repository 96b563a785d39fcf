"""Attention kernels at T1 shape (16 x 1152, H16 K8 D128): one forward and one backward launch for a profiler
(`ncu -k regex:flash_attention_forward`), then torch's SDPA flash kernels on the same data as a peer, timed.

--paged instead times paged attention's decode cases (G1, G1 ragged, G2, one 32k sequence, G1 with each prompt's blocks shared by its 8 samples) for each cp.async
pipeline shape UNROLL,STAGES given (none given: paged_attention.py's _UNROLL, _STAGES, which
bench/with_settings.py can set), device time from CUDA-graph replays (bench_decode_kernels.gpu_ms) and GB/s
of the K/V read.

usage: PYTHONPATH=src python bench/profile_attention.py [--peer]
       PYTHONPATH=src python bench/profile_attention.py --paged [UNROLL,STAGES ...]
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np
from bench_kernels import BF16, D, H, K, timed

SEQS, L = 16, 1152


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", action="store_true", help="also time torch's SDPA flash kernels")
    parser.add_argument("--paged", nargs="*", metavar="UNROLL,STAGES", help="time paged attention instead")
    args = parser.parse_args()
    if args.paged is not None:
        paged([tuple(int(v) for v in shape.split(",")) for shape in args.paged])
    else:
        flash(args.peer)


def flash(with_peer: bool) -> None:
    import cupy

    from barerl.ops import cuda

    T = SEQS * L
    qkv = (cupy.random.standard_normal((T, (H + 2 * K) * D), dtype=np.float32)).astype(BF16)
    q = qkv[:, : H * D].reshape(T, H, D)
    k = qkv[:, H * D : (H + K) * D].reshape(T, K, D)
    v = qkv[:, (H + K) * D :].reshape(T, K, D)
    cu = cupy.arange(0, T + 1, L, dtype=np.int32)
    for _ in range(2):  # warm-up: compiles; the profiler skips these launches
        o, lse = cuda.attention(q, k, v, cu, D**-0.5)
        cuda.attention_backward(o, q, k, v, o, lse, cu, D**-0.5)
    o, lse = cuda.attention(q, k, v, cu, D**-0.5)
    cuda.attention_backward(o, q, k, v, o, lse, cu, D**-0.5)
    cupy.cuda.Device().synchronize()
    if with_peer:
        peer(q, k, v)


def paged(shapes: list[tuple[int, int]]) -> None:
    """Decode paged attention per pipeline shape; an empty list times paged_attention.py's own."""
    from barerl.ops import cuda
    paged_attention = importlib.import_module("barerl.ops.cuda.paged_attention")  # the launchers' module
    from bench_decode_kernels import BLOCK, attention_case, gpu_ms

    rng = np.random.default_rng(0)
    contexts = {"G1 64 x 640": np.full(64, 640), "G1 ragged 64 x 128..1152": rng.integers(128, 1153, 64),
                "G2 256 x 384": np.full(256, 384), "1 x 32k": np.full(1, 32768)}
    cases = {name: attention_case(rng, lens, np.ones(len(lens), np.int64)) for name, lens in contexts.items()}
    # G1 as the engine holds it: each prompt's 8 samples share its 128 tokens' blocks (bytes counted per read)
    cases["G1 64 x 640, 8 share 128"] = attention_case(rng, np.full(64, 640), np.ones(64, np.int64),
                                                         128 // BLOCK, 8)
    print(f"{'UNROLL,STAGES':<15}{'case':<26}{'us':>9}{'GB/s':>8}")
    for unroll, stages in shapes or [(paged_attention._UNROLL, paged_attention._STAGES)]:
        paged_attention._UNROLL, paged_attention._STAGES = unroll, stages
        for name, (case, nbytes) in cases.items():
            ms = gpu_ms(cuda.paged_attention, case)
            print(f"{f'{unroll},{stages}':<15}{name:<26}{ms * 1e3:>9.1f}{nbytes / ms / 1e6:>8.0f}")


def peer(q, k, v) -> None:
    """torch.nn.functional.scaled_dot_product_attention (flash backend) on the same q, k, v."""
    import cupy
    import torch
    import torch.nn.functional as F

    def to_torch(x):  # (T, h, D) -> (SEQS, h, L, D) bf16
        t = torch.from_dlpack(cupy.ascontiguousarray(x).view(np.uint16)).view(torch.bfloat16)
        return t.reshape(SEQS, L, x.shape[1], D).transpose(1, 2).contiguous().requires_grad_(True)

    tq, tk, tv = to_torch(q), to_torch(k), to_torch(v)
    flops = 4 * SEQS * (L * L / 2) * D * H
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        tk2, tv2 = (
            tk.repeat_interleave(H // K, 1),
            tv.repeat_interleave(H // K, 1),
        )  # flash SDPA needs equal heads
        out = F.scaled_dot_product_attention(tq, tk2, tv2, is_causal=True)
        grad = torch.randn_like(out)
        ms_f = timed(lambda: F.scaled_dot_product_attention(tq, tk2, tv2, is_causal=True))
        ms_b = timed(lambda: torch.autograd.grad(out, (tq, tk2, tv2), grad, retain_graph=True))
    print(f"torch SDPA flash forward  {ms_f:.3f} ms  {flops / ms_f / 1e9:.1f} TFLOP/s")
    print(f"torch SDPA flash backward {ms_b:.3f} ms  {2.5 * flops / ms_b / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
