"""llama.cpp's conventions vs Hugging Face's: tensor names, the q/k row interleave, Llama 3 rope factors.

llama.cpp's converter (convert_hf_to_gguf.py) renames every tensor, interleaves the rows of each q/k head of
the llama architecture (its RoPE rotates adjacent pairs, Hugging Face's rotates the two halves of a head),
and replaces Llama 3's rope_scaling config by a tensor of per-frequency factors. These functions undo each,
exactly as transformers' GGUF loader does where it has an equivalent.
"""

from __future__ import annotations

import math

import numpy as np

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
ROPE_FREQS = "rope_freqs.weight"


def hf_name(gguf_name: str) -> str | None:
    """GGUF tensor name -> Hugging Face parameter name (None for names outside our model families)."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[3] not in ("weight", "bias"):
        return None
    leaf = _LAYER_TENSORS.get(parts[2])
    return f"model.layers.{int(parts[1])}.{leaf}.{parts[3]}" if leaf else None


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleave: per head, rows (0, 2, 4, ..., 1, 3, 5, ...) back to halves.

    Same as transformers' `LlamaTensorProcessor._reverse_permute_weights`: (H, D/2, 2, ...) -> (H, 2, D/2, ...).
    """
    half = w.shape[0] // num_heads // 2
    return np.ascontiguousarray(w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def llama3_scaling_from_freqs(freqs: np.ndarray, theta: float) -> dict | None:
    """Llama 3's rope_scaling recovered from llama.cpp's per-frequency factors; None if it does not reproduce them.

    llama.cpp (convert_hf_to_gguf.py, LlamaModel) writes factor 1 for short wavelengths, `factor` for long
    ones and a smooth blend in between; Meta's checkpoints all use low/high 1/4 and an 8192 original context.
    """
    scaling = {
        "rope_type": "llama3",
        "factor": float(freqs.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    dim = 2 * freqs.shape[0]
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    wavelen = 2 * math.pi / inv_freq.astype(np.float64)
    old, low, high, factor = 8192, 1.0, 4.0, scaling["factor"]
    smooth = (old / wavelen - low) / (high - low)
    expected = np.where(
        wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, 1 / ((1 - smooth) / factor + smooth))
    )
    return scaling if np.allclose(freqs, expected, rtol=1e-5, atol=1e-6) else None
