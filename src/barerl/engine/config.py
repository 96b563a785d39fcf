"""The engine's configuration (vLLM's engine arguments, the subset barerl implements) and the KV cache's size.

`EngineConfig` holds every engine option with its default; `kv_cache_size` turns it into the cache's geometry
(blocks, and the longest sequence that fits) for a given model, from the memory budget: on the GPU,
`gpu_memory_utilization` of the device less what is in use when the engine starts (weights, optimizer state),
on the CPU `cpu_kv_cache_gib`. GRPO sizes its rollouts' cache with the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from barerl.model.model import Model

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.9  # share of GPU memory to fill; the KV cache takes what is left
    cpu_kv_cache_gib: float = 1.0  # KV cache budget on the CPU
    max_num_seqs: int = 256
    max_model_len: int | None = None  # prompt + output tokens; default: the model's, capped by the cache
    max_num_batched_tokens: int | None = None  # tokens per step; default 8192 (>= max_model_len unchunked)
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    num_kv_blocks: int | None = None  # default: as many as the memory budget holds
    enforce_eager: bool = False  # on the GPU: no CUDA graphs for decode steps
    num_scheduler_steps: int = 8  # decode steps per schedule and runner call when all can take them (lookahead)
    async_scheduling: bool = True  # start a lookahead step's continuation before recording its tokens
    # the model's batch-invariant kernels (see Model): None keeps a given model's own choice (off for a model
    # loaded from a path); True / False runs the engine on a view of the model's weights with that choice,
    # leaving the caller's model (a trainer's, say) as it is
    batch_invariant: bool | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "block_size", "max_model_len", "max_num_batched_tokens", "num_kv_blocks",
                    "num_scheduler_steps")
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"LLM: {name} must be a positive integer, got {value!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "async_scheduling"):
            _require_bool(name, getattr(self, name))
        if self.batch_invariant is not None:
            _require_bool("batch_invariant", self.batch_invariant)
        if not 0 < self.gpu_memory_utilization <= 1:
            got = self.gpu_memory_utilization
            raise ValueError(f"LLM: gpu_memory_utilization must be in (0, 1], got {got!r}")
        if not self.cpu_kv_cache_gib > 0:
            raise ValueError(f"LLM: cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")


def _require_bool(name: str, value) -> None:
    if not isinstance(value, bool):  # a string "false" would be true (ValueError: as all config errors)
        raise ValueError(f"LLM: {name} must be True or False, got {value!r}")  # noqa: TRY004


def kv_cache_size(model: Model, cfg: EngineConfig) -> tuple[int, int]:
    """(max_model_len, num_blocks): the longest sequence the engine takes and the KV blocks it allocates."""
    bs = cfg.block_size
    positions = model.cfg.max_position_embeddings
    if cfg.max_model_len is not None and cfg.max_model_len > positions:  # as vLLM: those were never trained
        raise ValueError(f"LLM: max_model_len={cfg.max_model_len} is more than the model's {positions} positions "
                         "(max_position_embeddings)")
    max_model_len = cfg.max_model_len or positions
    if cfg.num_kv_blocks is not None:
        num_blocks = cfg.num_kv_blocks
    else:
        num_blocks = kv_blocks_in_budget(model, cfg)
        if cfg.max_model_len is None:  # the model's own limit, as far as the cache can hold it
            max_model_len = min(max_model_len, num_blocks * bs)
        usable = cfg.max_num_seqs * -(-block_table_positions(cfg, max_model_len) // bs)
        num_blocks = min(num_blocks, usable)
    if num_blocks * bs < max_model_len:
        raise ValueError(
            f"LLM: the KV cache holds {num_blocks} blocks x {bs} tokens, fewer than max_model_len="
            f"{max_model_len}: lower max_model_len or give the cache more memory"
        )
    return max_model_len, num_blocks


def block_table_positions(cfg: EngineConfig, max_model_len: int) -> int:
    """Positions a sequence's block table may hold: max_model_len, and the 2K - 1 past it that lookahead steps
    (K = num_scheduler_steps, and a continuation's K more) write after the sequence's last token, so that a
    lookahead never falls back to single steps for want of positions near max_model_len."""
    return max_model_len + (2 * cfg.num_scheduler_steps - 1 if cfg.num_scheduler_steps > 1 else 0)


def max_batched_tokens(cfg: EngineConfig, max_model_len: int) -> int:
    """Tokens one step may compute: the option, or its default (which admits any prompt whole when prefill is
    not chunked)."""
    if cfg.max_num_batched_tokens is None:
        n = DEFAULT_MAX_NUM_BATCHED_TOKENS
        return n if cfg.enable_chunked_prefill else max(n, max_model_len)
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"LLM: max_num_batched_tokens={cfg.max_num_batched_tokens} < max_model_len={max_model_len} needs "
            "enable_chunked_prefill=True (a long prompt could never be scheduled)"
        )
    return cfg.max_num_batched_tokens


def kv_blocks_in_budget(model: Model, cfg: EngineConfig) -> int:
    """KV blocks the memory budget holds: gpu_memory_utilization of the GPU less what is in use, or
    cpu_kv_cache_gib on the CPU."""
    if model.device == "cuda":
        budget = _gpu_kv_budget(cfg.gpu_memory_utilization)
    else:
        budget = int(cfg.cpu_kv_cache_gib * 2**30)
    return budget // (model.kv_cache_bytes_per_token() * cfg.block_size)


def _gpu_kv_budget(utilization: float) -> int:
    """Bytes the KV cache may take: utilization x total GPU memory, less what is in use."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    in_use = total - free - cupy.get_default_memory_pool().free_bytes()
    return max(0, int(total * utilization) - in_use)
