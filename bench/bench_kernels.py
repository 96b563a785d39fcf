"""Per-kernel micro-benchmarks of the CUDA backend against the GPU's measured ceilings.

Measures the two ceilings first (a large device-to-device copy, counting bytes read + written; a bf16
8192^3 cuBLAS product), then times each op at the shapes of the T1 workload (Qwen3-0.6B, one micro-batch of
16 x 1152 tokens) with CUDA events (median of repeats after warm-up, fresh random inputs, never zeros), and
prints achieved GB/s or TFLOP/s and the fraction of the ceiling. Each op is timed twice: replayed from a
CUDA graph (device time, what the rates use) and called eagerly from Python (adds the launchers' host
cost). Bytes counted are the fewest each op must move (inputs read once, outputs written once); FLOPs are
the useful ones (causal attention: half the square).

usage: PYTHONPATH=src python bench/bench_kernels.py [--csv out.csv] [--only substring]
"""

from __future__ import annotations

import argparse
import csv
import importlib

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
T, C, I, V = 16 * 1152, 1024, 3072, 151936  # tokens of one micro-batch, hidden, intermediate, vocab
H, K, D = 16, 8, 128


def timed(fn, reps: int = 20, warmup: int = 3, stream=None) -> float:
    """Median milliseconds of fn() measured with CUDA events on `stream` (default: the current one)."""
    import cupy

    stream = stream or cupy.cuda.get_current_stream()
    with stream:
        for _ in range(warmup):
            fn()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def graph_timed(fn) -> float | None:
    """Median ms of a CUDA-graph replay of fn(): device time without Python launch overhead (None when fn
    cannot be captured, e.g. it reads a result back to the host)."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with stream:
            fn()  # the memory pool caches this stream's blocks, so the capture allocates nothing new
            stream.synchronize()
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()
    except Exception:  # noqa: BLE001 - any capture failure means: report the eager time only
        return None
    return timed(lambda: graph.launch(stream), stream=stream)


def rand(shape, dtype=BF16, scale=1.0):
    import cupy

    x = cupy.random.standard_normal(shape, dtype=np.float32) * scale
    return x.astype(dtype)


def ceilings() -> tuple[float, float]:
    """(copy GB/s counting read + write, bf16 GEMM TFLOP/s), measured now."""
    import cupy

    from barerl.ops.cuda.cublas import gemm

    src = cupy.random.standard_normal(512 << 20 >> 2, dtype=np.float32)  # 512 MiB, far past L2
    dst = cupy.empty_like(src)
    ms = timed(lambda: dst.__setitem__(Ellipsis, src))
    copy_gbs = 2 * src.nbytes / ms / 1e6
    n = 8192
    a, b, c = rand((n, n)), rand((n, n)), cupy.empty((n, n), BF16)
    ms = timed(lambda: gemm(a, b, c), reps=10)
    return copy_gbs, 2 * n**3 / ms / 1e9


def cases():
    """(name, shape text, fn, bytes moved, FLOPs) of each op at T1 shapes."""
    import cupy

    from barerl.ops import cuda
    flash_attention = importlib.import_module("barerl.ops.cuda.attention")  # the launchers' module

    x, w_norm = rand((T, C)), rand((C,))
    y, rstd = cuda.rmsnorm(x, w_norm, 1e-6)
    dw_norm = cupy.zeros(C, np.float32)
    yield "rmsnorm", f"{T}x{C}", lambda: cuda.rmsnorm(x, w_norm, 1e-6), 2 * x.nbytes + 4 * T, 0
    yield (
        "rmsnorm_backward",
        f"{T}x{C}",
        lambda: cuda.rmsnorm_backward(y, x, w_norm, rstd, dw_norm),
        3 * x.nbytes,
        0,
    )

    w_up = rand((2 * I, C), scale=C**-0.5)
    dw_up = cupy.zeros((2 * I, C), np.float32)
    gate_up = rand((T, 2 * I))
    yield "linear", f"{T}x{C} @ {C}x{2 * I}", lambda: cuda.linear(x, w_up), 0, 2 * T * C * 2 * I
    yield (
        "linear_backward",
        f"{T}x{2 * I} -> dx, dw fp32",
        lambda: cuda.linear_backward(gate_up, x, w_up, dw_up),
        0,
        4 * T * C * 2 * I,
    )

    a = cuda.swiglu(gate_up)
    yield "swiglu", f"{T}x{2 * I}", lambda: cuda.swiglu(gate_up), gate_up.nbytes + a.nbytes, 0
    yield (
        "swiglu_backward",
        f"{T}x{2 * I}",
        lambda: cuda.swiglu_backward(a, gate_up),
        2 * gate_up.nbytes + a.nbytes,
        0,
    )

    qkv = rand((T, (H + 2 * K) * D))
    positions = cupy.tile(cupy.arange(1152, dtype=np.int32), T // 1152)
    angles = cupy.arange(2048, dtype=np.float32)[:, None] * cupy.ones(D // 2, np.float32)[None, :] * 1e-3
    cos, sin = cupy.cos(angles), cupy.sin(angles)
    qn, kn = rand((D,)), rand((D,))
    out, q_rstd, k_rstd = cuda.qk_norm_rope(qkv, positions, cos, sin, H, K, qn, kn)
    dqn, dkn = cupy.zeros(D, np.float32), cupy.zeros(D, np.float32)
    yield (
        "qk_norm_rope",
        f"{T}x{(H + 2 * K) * D}",
        lambda: cuda.qk_norm_rope(qkv, positions, cos, sin, H, K, qn, kn),
        2 * qkv.nbytes,
        0,
    )
    yield (
        "qk_norm_rope_backward",
        f"{T}x{(H + 2 * K) * D}",
        lambda: cuda.qk_norm_rope_backward(
            out, qkv, positions, cos, sin, H, K, qn, kn, q_rstd, k_rstd, dqn, dkn
        ),
        3 * qkv.nbytes,
        0,
    )

    ids = cupy.random.randint(0, V, T).astype(np.int32)
    table = rand((V, C))
    dtable = cupy.zeros((V, C), np.float32)
    yield "embedding", f"{T} of {V}x{C}", lambda: cuda.embedding(ids, table), 2 * x.nbytes, 0
    yield (
        "embedding_backward",
        f"{T} into {V}x{C} fp32",
        lambda: cuda.embedding_backward(x, ids, dtable),
        x.nbytes + 2 * T * C * 4,
        0,
    )

    rows = 4096
    h = rand((rows, C))
    w_head = rand((V, C), scale=C**-0.5)
    targets = cupy.random.randint(0, V, rows).astype(np.int32)
    _, lse, _ = cuda.lm_head_logprobs(h, w_head, targets)
    dlogprobs = rand((rows,), np.float32)
    yield (
        "lm_head_logprobs",
        f"{rows}x{C} @ {C}x{V}",
        lambda: cuda.lm_head_logprobs(h, w_head, targets),
        0,
        2 * rows * C * V,
    )
    yield (
        "lm_head_backward",
        f"{rows}x{C} @ {C}x{V}",
        lambda: cuda.lm_head_backward(dlogprobs, h, w_head, targets, lse, dtable),
        0,
        6 * rows * C * V,
    )

    n = 596_000_000  # Qwen3-0.6B parameters: fp32 master, moments and grads, bf16 working weights
    master, grad_flat = rand((n,), np.float32), rand((n,), np.float32, 1e-3)
    exp_avg, exp_avg_sq = cupy.zeros(n, np.float32), cupy.zeros(n, np.float32)
    working = cupy.empty(n, BF16)
    yield (
        "adamw_step",
        f"{n} params",
        lambda: cuda.adamw_step(
            master, grad_flat, exp_avg, exp_avg_sq, None, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0, working
        ),
        30 * n,
        0,
    )
    yield "grad_norm", f"{n} fp32", lambda: cuda.grad_norm(grad_flat), 4 * n, 0

    cu = cupy.arange(0, T + 1, 1152, dtype=np.int32)
    q = qkv[:, : H * D].reshape(T, H, D)
    k = qkv[:, H * D : (H + K) * D].reshape(T, K, D)
    v = qkv[:, (H + K) * D :].reshape(T, K, D)
    o, lse_attn = cuda.attention(q, k, v, cu, D**-0.5)
    attn_flops = 4 * (T // 1152) * (1152 * 1152 / 2) * D * H

    def configured(fn, **config):
        def run():
            flash_attention.CONFIG.update(config)
            return fn()

        return run

    shape = f"16 x 1152, H{H} K{K} D{D}"
    forward = [
        {"fwd_warps": 4, "fwd_mt": 1, "fwd_bn": 64},
        {"fwd_warps": 8, "fwd_mt": 1, "fwd_bn": 64},
        {"fwd_warps": 4, "fwd_mt": 2, "fwd_bn": 64},
        {"fwd_warps": 8, "fwd_mt": 2, "fwd_bn": 64},
    ]
    for config in forward:  # block shapes of the forward kernel
        name = f"attention[{config['fwd_warps']}w mt{config['fwd_mt']} bn{config['fwd_bn']}]"
        yield name, shape, configured(lambda: cuda.attention(q, k, v, cu, D**-0.5), **config), 0, attn_flops
    for warps in (4, 8):
        yield (
            f"attention_backward[{warps}w]",
            shape,
            configured(
                lambda: cuda.attention_backward(o, q, k, v, o, lse_attn, cu, D**-0.5), bwd_warps=warps
            ),
            0,
            2.5 * attn_flops,
        )
    yield (
        "attention_backward[4w, no dQ: timing only]",
        shape,
        configured(
            lambda: cuda.attention_backward(o, q, k, v, o, lse_attn, cu, D**-0.5),
            bwd_warps=4,
            defines={"SKIP_DQ_ATOMICS": 1},
        ),
        0,
        2.5 * attn_flops,
    )
    flash_attention.CONFIG.update(fwd_warps=4, fwd_mt=2, fwd_bn=64, bwd_warps=4, defines={})

    # prefill against the paged cache, as at M1's continued turns: 64 sequences x new tokens after some cached
    # (the last sampled token and a 64-token tool result at M1's three turn boundaries; 80 after 1,088 as earlier)
    for new, cached in ((80, 1088), (65, 383), (65, 703), (65, 1023)):
        yield from paged_prefill_cases(H, K, D, 64, new, cached)
    # decode against the paged cache: G1's 64 sequences, R2's 64 at their longest, L1's 16 at its mean and longest
    for seqs, context in ((64, 1024), (64, 4352), (16, 8448), (16, 16640)):
        yield from paged_decode_cases(H, K, D, seqs, context)
    for chunk in (1024, 4096):
        yield (
            f"lm_head_backward[chunk {chunk}]",
            f"{rows}x{C} @ {C}x{V}",
            lambda chunk=chunk: cuda.lm_head_backward(dlogprobs, h, w_head, targets, lse, dtable, 1.0, chunk),
            0,
            6 * rows * C * V,
        )


def paged_prefill_cases(H, K, D, seqs, new, cached, block=16):
    """paged_attention of `seqs` sequences x `new` tokens after `cached` in the cache, in both settings."""
    import cupy

    from barerl.ops import cuda

    per_seq = -(-(cached + new) // block)
    k_cache, v_cache = rand((seqs * per_seq, block, K, D)), rand((seqs * per_seq, block, K, D))
    tables = cupy.arange(seqs * per_seq, dtype=np.int32).reshape(seqs, per_seq)
    contexts = cupy.full(seqs, cached + new, np.int32)
    cu_new = cupy.arange(0, seqs * new + 1, new, dtype=np.int32)
    q_new = rand((seqs * new, H, D))
    cache_bytes = 2 * seqs * (cached + new) * K * D * q_new.dtype.itemsize
    prefill_flops = 4 * D * H * seqs * sum(cached + i + 1 for i in range(new))
    for invariant in (False, True):
        yield (
            f"paged_attention prefill{'[batch_invariant]' if invariant else ''}",
            f"{seqs} x {new} after {cached} cached, H{H} K{K} D{D}",
            lambda invariant=invariant: cuda.paged_attention(q_new, k_cache, v_cache, tables, contexts, cu_new,
                                                             D**-0.5, batch_invariant=invariant),
            cache_bytes + 2 * q_new.nbytes,
            prefill_flops,
        )


def paged_decode_cases(H, K, D, seqs, context, block=16):
    """paged_attention of one new token for each of `seqs` sequences of `context` keys: the split-KV kernel, and
    each of the batch-invariant kernels (one warp a (sequence, kv head) pair, or several sharing its tiles)."""
    import cupy

    from barerl.ops import cuda
    paged = importlib.import_module("barerl.ops.cuda.paged_attention")

    per_seq = -(-context // block)
    k_cache, v_cache = rand((seqs * per_seq, block, K, D)), rand((seqs * per_seq, block, K, D))
    tables = cupy.arange(seqs * per_seq, dtype=np.int32).reshape(seqs, per_seq)
    contexts = cupy.full(seqs, context, np.int32)
    cu = cupy.arange(seqs + 1, dtype=np.int32)
    q = rand((seqs, H, D))
    cache_bytes = 2 * seqs * context * K * D * q.dtype.itemsize

    def decode(invariant: bool, pairs_per_sm: int = paged._INVARIANT_PAIRS_PER_SM):
        kept, paged._INVARIANT_PAIRS_PER_SM = paged._INVARIANT_PAIRS_PER_SM, pairs_per_sm
        try:
            return cuda.paged_attention(q, k_cache, v_cache, tables, contexts, cu, D**-0.5, batch_invariant=invariant)
        finally:
            paged._INVARIANT_PAIRS_PER_SM = kept

    shape = f"{seqs} x 1 after {context - 1} cached, H{H} K{K} D{D}"
    for name, fn in (("split", lambda: decode(False)), ("batch_invariant, one warp a pair", lambda: decode(True, 0)),
                     ("batch_invariant, warps a pair", lambda: decode(True, 10**6))):
        yield f"paged_attention decode[{name}]", shape, fn, cache_bytes + 2 * q.nbytes, 4 * D * H * seqs * context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="also write the table to this CSV file")
    parser.add_argument("--only", default="", help="only ops whose name contains this")
    args = parser.parse_args()
    import cupy

    copy_gbs, gemm_tflops = ceilings()
    print(
        f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: copy {copy_gbs:.0f} GB/s, "
        f"bf16 GEMM 8192^3 {gemm_tflops:.0f} TFLOP/s"
    )
    rows = []
    for name, shape, fn, nbytes, flops in cases():
        if args.only not in name:
            continue
        eager_ms = timed(fn)
        graph_ms = graph_timed(fn)
        ms = graph_ms or eager_ms
        if flops:
            rate, unit, frac = flops / ms / 1e9, "TFLOP/s", flops / ms / 1e9 / gemm_tflops
        else:
            rate, unit, frac = nbytes / ms / 1e6, "GB/s", nbytes / ms / 1e6 / copy_gbs
        graph_text = f"{graph_ms:.3f}" if graph_ms else "-"
        rows.append((name, shape, graph_text, f"{eager_ms:.3f}", f"{rate:.1f}", unit, f"{100 * frac:.0f}%"))
    header = ("op", "shape", "ms graph", "ms eager", "rate", "unit", "of ceiling")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])


if __name__ == "__main__":
    main()
