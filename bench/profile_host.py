"""The engine's host time per decode step as completions grow (no GPU): scheduling, block tables, step inputs,
token bookkeeping, with a model that computes nothing and a sampler that draws token 1.

What a decode step costs the host must stay flat in the context length, or 16K-token completions (workload L1)
would be host-bound where 1K ones are not. Prints microseconds per step for each (sequences, new tokens) and,
with --profile, the largest cumulative entries of cProfile for the last case.

    PYTHONPATH=src python bench/profile_host.py [--cases 16x2048 16x16384 64x4096] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from types import SimpleNamespace

import numpy as np

from barerl.ops import ref


class NullModel:
    """Stands in for `Model`: the engine's whole host path runs, the device work is a zeros array."""

    def __init__(self, vocab_size: int, max_positions: int):
        self.cfg = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=max_positions, eos_token_ids=[])
        self.ops = SimpleNamespace(sample=self._sample, advance_decode=ref.advance_decode,
                                   defer_decode_tuning=ref.defer_decode_tuning)
        self.xp, self.dtype, self.device = np, np.dtype(np.float32), "cpu"
        self.batch_invariant, self.lora = False, None

    def kv_cache_bytes_per_token(self) -> int:
        return 8

    def set_batch_invariant(self, on: bool) -> None:
        pass

    def allocate_kv_cache(self, num_blocks: int, block_size: int):
        return np.zeros((2, 1, num_blocks, block_size, 1, 1), np.float32)

    def forward_paged(self, input_ids, positions, cu_seqlens_q, context_lens, *args, **kwargs):
        return np.zeros((len(context_lens), self.cfg.vocab_size), np.float32)

    @staticmethod
    def _sample(logits, *args):
        return np.ones(logits.shape[0], np.int32), np.zeros(logits.shape[0], np.float32)


def host_seconds(num_seqs: int, new_tokens: int, samples: int = 4, prompt_len: int = 256) -> float:
    from barerl import LLM, SamplingParams

    model = NullModel(32, prompt_len + new_tokens)
    blocks = num_seqs * -(-(prompt_len + new_tokens) // 16) + 64
    llm = LLM(model, None, max_num_seqs=num_seqs, max_model_len=prompt_len + new_tokens, num_kv_blocks=blocks)
    prompts = [[1 + (i + j) % 30 for j in range(prompt_len)] for i in range(num_seqs // samples)]
    params = SamplingParams(n=samples, max_tokens=new_tokens, ignore_eos=True, seed=0)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["16x2048", "16x8192", "16x16384", "64x1024", "64x4096"],
                        help="SEQUENCESxNEW_TOKENS")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for case in args.cases:
        seqs, new = (int(x) for x in case.split("x"))
        profiler = cProfile.Profile() if args.profile and case == args.cases[-1] else None
        if profiler:
            profiler.enable()
        seconds = host_seconds(seqs, new)
        if profiler:
            profiler.disable()
        print(f"{seqs} sequences x {new} new tokens: {seconds:.2f} s, {seconds / new * 1e6:.0f} us of host time per "
              "decode step")
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
