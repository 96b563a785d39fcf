"""Micro-benchmarks of the inference engine's kernels on the GPU: paged attention, store_kv (alone and fused
into qk_norm_rope), sampler.

Prints one table (time per call, bytes that must move, achieved GB/s and its fraction of the measured
device-to-device copy bandwidth) and writes it as CSV. Shapes follow the Qwen3-0.6B workloads of
WORKLOADS.md (16 query heads, 8 kv heads, head_dim 128, bf16 cache, block size 16, vocab 151,936).

    PYTHONPATH=src python bench/bench_decode_kernels.py [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import importlib

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
H, K, D, BLOCK = 16, 8, 128, 16
VOCAB = 151936


def gpu_ms(fn, args=(), calls: int = 10, repeat: int = 20) -> float:
    """Median device time of one fn(*args) in ms: `calls` calls captured in a CUDA graph, replayed `repeat`
    times between CUDA events, so host launch overhead is excluded as it is in the engine's decode graph.
    Falls back to timing eager calls where capture fails."""
    import cupy

    cupy.cuda.Device().synchronize()  # inputs come from the legacy stream, which `stream` does not wait for
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn(*args)  # compiles, and warms this stream's memory pool so that capture allocates nothing new
        stream.synchronize()
        try:
            stream.begin_capture()
            for _ in range(calls):
                fn(*args)
            graph = stream.end_capture()
        except Exception as e:  # noqa: BLE001 - report and time eagerly instead
            print(f"graph capture failed ({type(e).__name__}: {e}); timing eager calls")
            from cupyx.profiler import benchmark

            times = benchmark(fn, args, n_repeat=repeat * calls, n_warmup=5).gpu_times[0]
            return float(np.median(times) * 1e3)
        graph.launch(stream)
        times = []
        for _ in range(repeat):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return float(np.median(times))


def copy_bandwidth() -> float:
    import cupy

    a = cupy.ones(1 << 30, np.uint8)
    b = cupy.empty_like(a)
    ms = gpu_ms(b.__setitem__, (Ellipsis, a), 5, 10)
    return 2 * a.nbytes / ms / 1e6  # GB/s, bytes read + written


def attention_case(rng, contexts, new_tokens, shared_blocks: int = 0, group: int = 1):
    """Arguments of paged_attention for sequences with these context lengths and new tokens each; with
    shared_blocks, each run of `group` sequences shares its first blocks (GRPO's samples of one prompt)."""
    import cupy

    blocks = -(-contexts // BLOCK)
    if shared_blocks > blocks.min() or group < 1:
        raise ValueError(f"attention_case: {shared_blocks} shared blocks in groups of {group}: a sequence holds "
                         f"only {blocks.min()}")
    own = blocks.copy()
    own[np.arange(len(contexts)) % group != 0] -= shared_blocks  # the group's first sequence owns the prompt
    num_blocks = int(own.sum())
    physical = rng.permutation(num_blocks).astype(np.int32)
    tables = np.zeros((len(contexts), int(blocks.max())), np.int32)
    offsets = np.concatenate([[0], np.cumsum(own)])
    for s in range(len(contexts)):
        mine = physical[offsets[s]:offsets[s + 1]]
        if s % group:
            first = tables[s - s % group]
            tables[s, :blocks[s]] = np.concatenate([first[:shared_blocks], mine])
        else:
            tables[s, :blocks[s]] = mine
    cu = np.concatenate([[0], np.cumsum(new_tokens)]).astype(np.int32)
    T = int(cu[-1])

    def normal(shape):
        return cupy.asarray(rng.standard_normal(shape, np.float32).astype(BF16))

    q = normal((T, H, D))
    k_cache, v_cache = normal((num_blocks, BLOCK, K, D)), normal((num_blocks, BLOCK, K, D))
    lens = cupy.asarray(contexts.astype(np.int32))
    args = (q, k_cache, v_cache, cupy.asarray(tables), lens, cupy.asarray(cu), D**-0.5)
    kv_bytes = int(contexts.sum()) * K * D * 2 * BF16.itemsize
    return args, kv_bytes + 2 * q.nbytes


def sample_case(rng, rows, temperature, top_k, top_p):
    import cupy

    logits = cupy.asarray(rng.standard_normal((rows, VOCAB), np.float32) * 2)
    settings = [cupy.full(rows, value, dtype) for value, dtype in
                ((temperature, np.float32), (top_k, np.int32), (top_p, np.float32), (0.0, np.float32))]
    seeds, counters = cupy.arange(rows, dtype=np.uint64), cupy.full(rows, 7, np.int64)
    return (logits, *settings, seeds, counters), logits.nbytes


def rope_case(rng, tokens: int):
    """qk_norm_rope's arguments for `tokens` decode tokens: bf16 qkv and norms, positions below 4096."""
    import cupy

    qkv = cupy.asarray(rng.standard_normal((tokens, (H + 2 * K) * D), np.float32).astype(BF16))
    positions = cupy.asarray(rng.integers(0, 4096, tokens).astype(np.int32))
    angles = rng.uniform(0, 6.3, (4096, D // 2))
    cos, sin = (cupy.asarray(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
    norm = cupy.asarray(rng.standard_normal(D).astype(BF16))
    return qkv, positions, cos, sin, H, K, norm, norm, 1e-6


def rope_then_store(rotate, cache, slots):
    """The unfused decode path: qk_norm_rope, then store_kv of its k and v."""
    from barerl.ops import cuda

    out = cuda.qk_norm_rope(*rotate)[0]
    kv = out[:, H * D :].reshape(-1, 2, K, D)
    cuda.store_kv(kv[:, 0], kv[:, 1], cache, cache, slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default="bench_decode_kernels.csv")
    args = parser.parse_args()
    import cupy

    from barerl.ops import cuda
    paged_attention = importlib.import_module("barerl.ops.cuda.paged_attention")  # the module, not the op
    num_splits = paged_attention.num_splits

    rng = np.random.default_rng(0)
    bandwidth = copy_bandwidth()
    rows = [("copy 1 GiB (device to device)", 2 * (1 << 30) / bandwidth / 1e6, 2 * (1 << 30), "")]
    decode_cases = {
        "decode G1: 64 seqs x 640 ctx": np.full(64, 640),
        "decode G1 ragged: 64 seqs x 128..1152": rng.integers(128, 1153, 64),
        "decode G2: 256 seqs x 384 ctx": np.full(256, 384),
        "decode 1 seq x 32k ctx": np.full(1, 32768),
        "decode 4 seqs x 16k ctx": np.full(4, 16384),
        "decode 16 seqs x 4k ctx": np.full(16, 4096),
    }
    for name, contexts in decode_cases.items():
        case, nbytes = attention_case(rng, contexts, np.ones(len(contexts), np.int64))
        splits = num_splits(len(contexts), K, case[3].shape[1] * BLOCK)
        rows.append((name, gpu_ms(cuda.paged_attention, case), nbytes, f"{splits} splits"))
    knobs = ("_CTAS_PER_SM", "_UNSPLIT_CTAS_PER_SM")  # the split heuristic's (defaults: paged_attention.py)
    defaults = [getattr(paged_attention, knob) for knob in knobs]
    for ctas_per_sm in (2, 4, 8, 16):  # split to this many CTAs per SM whenever T x K gives fewer
        for knob in knobs:
            setattr(paged_attention, knob, ctas_per_sm)
        for name in ("decode G1: 64 seqs x 640 ctx", "decode G1 ragged: 64 seqs x 128..1152",
                     "decode 1 seq x 32k ctx"):
            case, nbytes = attention_case(rng, decode_cases[name], np.ones(len(decode_cases[name]), np.int64))
            rows.append((f"{name}, {ctas_per_sm} CTAs/SM", gpu_ms(cuda.paged_attention, case), nbytes,
                         f"{num_splits(len(decode_cases[name]), K, case[3].shape[1] * BLOCK)} splits"))
    for knob, default in zip(knobs, defaults):
        setattr(paged_attention, knob, default)
    case, nbytes = attention_case(rng, np.full(64, 128), np.full(64, 128))
    rows.append(("prefill 64 seqs x 128 tokens (no prefix)", gpu_ms(cuda.paged_attention, case), nbytes,
                 "K/V re-read per query"))
    for tokens in (64, 8192):
        k = cupy.asarray(rng.standard_normal((tokens, K, D), np.float32).astype(BF16))
        cache = cupy.zeros((tokens // BLOCK + 1, BLOCK, K, D), BF16)
        slots = cupy.asarray(rng.permutation(tokens).astype(np.int32))
        rows.append((f"store_kv {tokens} tokens", gpu_ms(cuda.store_kv, (k, k, cache, cache, slots)),
                     4 * k.nbytes, ""))
        rotate = rope_case(rng, tokens)  # the decode path's q/k norm + rope, with and without the store fused
        moved = 2 * rotate[0].nbytes + 2 * k.nbytes  # qkv read, out written, k and v written to the cache
        fused = gpu_ms(cuda.qk_norm_rope_store, (*rotate, cache, cache, slots))
        rows.append((f"qk_norm_rope_store {tokens} tokens", fused, moved, ""))
        unfused = gpu_ms(rope_then_store, (rotate, cache, slots))
        rows.append((f"qk_norm_rope + store_kv {tokens} tokens", unfused, moved + 2 * k.nbytes, "2 kernels"))
    sample_modes = {"greedy": (0.0, 0, 1.0), "temperature 1": (1.0, 0, 1.0), "top-k 50": (1.0, 50, 1.0),
                    "top-p 0.9": (1.0, 0, 0.9), "top-k 50 + top-p 0.9": (1.0, 50, 0.9)}
    for name, (t, top_k, top_p) in sample_modes.items():
        for batch in (64, 256):
            case, nbytes = sample_case(rng, batch, t, top_k, top_p)
            rows.append((f"sample {batch} x {VOCAB} {name}", gpu_ms(cuda.sample, case), nbytes, ""))

    print(f"{'case':48s} {'ms':>9s} {'MB':>9s} {'GB/s':>8s} {'% copy':>7s}  note")
    with open(args.csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["case", "ms", "bytes", "GB/s", "fraction_of_copy", "note"])
        for name, ms, nbytes, note in rows:
            gbs = nbytes / ms / 1e6
            share = 100 * gbs / bandwidth
            print(f"{name:48s} {ms:9.4f} {nbytes / 1e6:9.1f} {gbs:8.0f} {share:6.1f}%  {note}")
            writer.writerow([name, f"{ms:.5f}", nbytes, f"{gbs:.1f}", f"{gbs / bandwidth:.4f}", note])


if __name__ == "__main__":
    main()
