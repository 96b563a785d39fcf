"""Rotary-embedding angle tables (cos, sin), including Llama 3's frequency scaling.

Computed in fp32 exactly as Hugging Face does (fp32 inverse frequencies times fp32 positions), so the
reference model matches transformers to rounding.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """(D/2,) fp32 rotation speeds, scaled per `rope_scaling` when it says llama3."""
    D = cfg.head_dim
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D))))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_scaling is None:
        return inv_freq
    s = cfg.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: ModelConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables of shape (num_positions, D/2), fp32, on the host."""
    angles = np.arange(num_positions, dtype=np.float32)[:, None] * inverse_frequencies(cfg)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
