"""ggml tensor types: block sizes and NumPy dequantisers (GGUF -> float32).

A ggml tensor is stored row by row; a row of `n` elements is `n / block_size` blocks of `type_size` bytes.
Each dequantiser turns a (num_blocks, type_size) uint8 array into (num_blocks, block_size) float32, following
ggml's C reference (ggml-quants.c `dequantize_row_*`) with the float operations in the same order, so the
results are bit-identical to llama.cpp's and to the `gguf` package's (the test oracle).

Only the types that real checkpoints of our model families use are here; an unsupported type is reported by
name so the user knows which one (`GGML_TYPE_NAMES`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

QK_K = 256  # elements per "K-quant" super-block

GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n, 1) float32, reading little-endian IEEE half floats."""
    return b.view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) packed bytes -> (n, 2k): all low nibbles first, then all high nibbles (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _f32(b: np.ndarray) -> np.ndarray:
    return b.view("<f4").astype(np.float32)


def _bf16(b: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an fp32: shift the 16 bits into place and reinterpret.
    return (b.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d, q = _f16(b[:, :2]), b[:, 2:].view(np.int8).astype(np.float32)
    return q * d


def _q4_0(b: np.ndarray) -> np.ndarray:
    d, q = _f16(b[:, :2]), _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m, q = _f16(b[:, :2]), _f16(b[:, 2:4]), _nibbles(b[:, 4:]).astype(np.float32)
    return d * q + m


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes = one little-endian uint32 per block -> (n, 32) bits as uint8, bit j for element j."""
    bits = qh.view("<u4") >> np.arange(32, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _q5_0(b: np.ndarray) -> np.ndarray:
    d, qh, qs = _f16(b[:, :2]), b[:, 2:6], b[:, 6:]
    q = (_nibbles(qs) | (_high_bits_32(qh) << 4)).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m, qh, qs = _f16(b[:, :2]), _f16(b[:, 2:4]), b[:, 4:8], b[:, 8:]
    q = (_nibbles(qs) | (_high_bits_32(qh) << 4)).astype(np.float32)
    return d * q + m


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins per super-block (ggml get_scale_min_k4)."""
    lo, hi, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32): each 32-byte group gives sub-block 2i (low nibbles) and 2i+1 (high)."""
    g = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (g & 0x0F).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_low_nibbles(b[:, 16:]).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qh = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit j: sub-block j
    q = (_k_low_nibbles(b[:, 48:]) | ((qh & 1) << 4)).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    # Two halves of 128 elements; in each, 64 ql bytes give 4 low bits (low nibbles, then high nibbles) and
    # 32 qh bytes give the 2 high bits of the four 32-element quarters (shifts 0, 2, 4, 6).
    low = _nibbles(ql.reshape(-1, 2, 64)).reshape(-1, 2, 4, 32)
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(-1, 16, 16).astype(np.float32)
    scale = (d * sc.view(np.int8).astype(np.float32))[:, :, None]  # one scale per 16 elements
    return (scale * q).reshape(-1, QK_K)


# ggml type id -> (elements per block, bytes per block, dequantiser)
GGML_TYPES: dict[int, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    0: (1, 4, _f32),
    1: (1, 2, _f16),
    30: (1, 2, _bf16),
    8: (32, 34, _q8_0),
    2: (32, 18, _q4_0),
    3: (32, 20, _q4_1),
    6: (32, 22, _q5_0),
    7: (32, 24, _q5_1),
    12: (QK_K, 144, _q4_k),
    13: (QK_K, 176, _q5_k),
    14: (QK_K, 210, _q6_k),
}


def type_name(ggml_type: int) -> str:
    return GGML_TYPE_NAMES.get(ggml_type, f"unknown type {ggml_type}")


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes of one tensor (uint8, exactly its size) -> float32 array of `shape` (row-major)."""
    _, type_size, fn = GGML_TYPES[ggml_type]
    blocks = np.ascontiguousarray(raw).reshape(-1, type_size)
    return np.ascontiguousarray(fn(blocks), dtype=np.float32).reshape(shape)
