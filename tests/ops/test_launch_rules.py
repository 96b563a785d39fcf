"""Launch decisions made on the host from shapes alone, and the driver structures passed through ctypes (no
GPU needed: these run in CI)."""

import ctypes

from kernel_harness import launcher

from barerl.engine.device_memory import _AccessDesc, _AllocationProp
from barerl.ops.cuda.cublaslt import HeuristicResult, _tuning_key, alignment


def test_driver_structures_have_the_cuda_h_layout():
    """CUmemAllocationProp and CUmemAccessDesc as cuda.h lays them out on x86-64 (the driver reads raw bytes)."""
    assert ctypes.sizeof(_AllocationProp) == 32
    assert _AllocationProp.location.offset == 8 and _AllocationProp.allocFlags.offset == 24
    assert ctypes.sizeof(_AccessDesc) == 12


def test_cublaslt_heuristic_result_has_the_header_layout():
    """cublasLtMatmulHeuristicResult_t: a 64-byte algo, workspace size, state, waves count, 4 reserved ints."""
    assert ctypes.sizeof(HeuristicResult) == 96
    assert HeuristicResult.workspace_size.offset == 64 and HeuristicResult.waves_count.offset == 76


def test_pointer_alignment_is_capped_at_256_bytes():
    assert [alignment(a) for a in (0, 1024, 256 + 2, 512 + 16, 3)] == [256, 256, 2, 16, 1]


def test_gemm_tuning_classes_round_token_counts_up_to_powers_of_two():
    """Ragged micro-batches share one tuned algorithm per power-of-two class of each dimension."""
    def key(tokens, n=4096, k=1024):  # a linear forward: x (tokens, k) @ w (n, k).T, as cublaslt lays it out
        return _tuning_key(True, False, ((n, k, k), (tokens, k, k), (tokens, n, n, n)), ("bf16", "bf16"), False,
                           (256,) * 4)

    assert key(17_000) == key(18_432) == key(32_768) != key(32_769)
    assert key(18_432) != key(18_432, n=1024) and key(64) != key(64, k=3072)
    assert "m<=32768 n<=4096 k<=1024" in key(18_432)


def test_decode_attention_splits_only_when_few_ctas(monkeypatch):
    """132 SMs (H200): G1 (64 seqs x 8 kv heads) and G2 stay whole; a few long sequences split up to the
    target of 4 CTAs per SM, never into parts under 128 keys."""
    paged_attention = launcher("paged_attention")
    monkeypatch.setattr(paged_attention, "multiprocessors", lambda: 132)
    assert paged_attention.num_splits(64, 8, 2048) == paged_attention.num_splits(256, 8, 2048) == 1
    assert paged_attention.num_splits(1, 8, 32768) == 66 and paged_attention.num_splits(16, 8, 4096) == 5
    assert paged_attention.num_splits(1, 8, 512) == 4  # capped by the context: 4 parts of 128 keys
