"""Programmatic dependent launch (kernels/pdl.py).

CPU: the driver structures have cuda.h's layout, arguments are packed as their C types, the switch.
GPU: a decode layer whose rmsnorm, qk_norm_rope_store, paged attention and swiglu are PDL launches between
cuBLASLt GEMMs gives the plain launches' bits, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from kernel_harness import BF16, assert_same_bits, poison
from test_paged_attention import BLOCK_SIZE, make_batch
from test_qk_norm_rope import _tables

from barerl.kernels import pdl


def test_launch_structures_have_the_cuda_h_layout():
    """CUlaunchConfig and CUlaunchAttribute as cuda.h (CUDA 13.0) lays them out on x86-64 (gcc's offsetof)."""
    config, attribute = pdl._LaunchConfig, pdl._LaunchAttribute
    assert ctypes.sizeof(config) == 56 and config.shared_mem_bytes.offset == 24
    assert config.stream.offset == 32 and config.attrs.offset == 40 and config.num_attrs.offset == 48
    assert ctypes.sizeof(attribute) == 72 and attribute.value.offset == 8
    assert ctypes.sizeof(pdl._AttributeValue) == 64


def test_launch_config_pads_dimensions_and_asks_for_programmatic_serialization():
    config = pdl.launch_config((3, 2), (128,), 512, 0xABC0)
    assert list(config.grid) == [3, 2, 1] and list(config.block) == [128, 1, 1]
    assert config.shared_mem_bytes == 512 and config.stream == 0xABC0 and config.num_attrs == 1
    attribute = config.attrs[0]  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, allowed
    assert attribute.id == 6 and attribute.value.programmatic_stream_serialization_allowed == 1


def test_arguments_are_packed_as_their_c_types():
    """A CuPy array (anything with .data.ptr) is its pointer; numpy scalars keep their width."""
    array = SimpleNamespace(data=SimpleNamespace(ptr=0x7F00_1234_5600))
    args = (array, np.int32(-3), np.float32(0.5), np.int64(-(2**40)), np.uint64(0), np.uint64(2**63))
    kinds = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64)
    values, params = pdl.pack_arguments(args)
    assert [type(v) for v in values] == list(kinds) and len(params) == len(args)
    read = [ctypes.cast(params[i], ctypes.POINTER(kind)).contents.value for i, kind in enumerate(kinds)]
    assert read == [0x7F00_1234_5600, -3, 0.5, -(2**40), 0, 2**63]


@pytest.mark.parametrize("arg", [3, 0.5, True, None, np.float64(1.0), np.zeros(2)], ids=repr)
def test_other_arguments_are_refused(arg):
    """Python numbers have no width, and a host array has no device pointer: refused, not guessed."""
    with pytest.raises(TypeError, match="cannot pass"):
        pdl.pack_arguments((arg,))


def test_switched_off_it_is_the_kernels_own_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(pdl, "ENABLED", False)
    pdl.launch(lambda *args, **kwargs: calls.append((args, kwargs)), (4,), (32,), (np.int32(1),), shared_mem=64)
    assert calls == [(((4,), (32,), (np.int32(1),)), {"shared_mem": 64})]


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("0", False)])
def test_barerl_pdl_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("BARERL_PDL", raising=False)
    else:
        monkeypatch.setenv("BARERL_PDL", value)
    assert pdl._read_switch() is enabled


def test_barerl_pdl_takes_only_0_or_1(monkeypatch):
    monkeypatch.setenv("BARERL_PDL", "false")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        pdl._read_switch()


# ---------------------------------------------------------------------------------------------------------
# GPU: one decode layer (model/forward.py's layer_forward with the engine's rotate-and-store and paged
# attention). Each PDL kernel reads what the launch before it wrote: a GEMM, or (paged attention) another PDL
# kernel that let it start early.

EPS, HIDDEN, INTER, HEADS, HEAD_DIM = 1e-6, 1024, 1536, 8, 128


def _layer_inputs(draw, num_seqs: int, num_kv_heads: int):
    """Weights of one layer, and a decode batch: caches over shuffled blocks with ragged contexts of up to 600
    tokens, each sequence's new token at its last position."""
    import cupy

    _, k_cache, v_cache, tables, lens, cu = make_batch(draw, BF16, num_seqs, HEADS, num_kv_heads, HEAD_DIM, 600,
                                                       False)
    positions = cupy.asnumpy(lens) - 1
    table_rows = cupy.asnumpy(tables)[np.arange(num_seqs), positions // BLOCK_SIZE]
    slots = (table_rows * BLOCK_SIZE + positions % BLOCK_SIZE).astype(np.int32)
    cos, sin = _tables(600, HEAD_DIM)
    batch = {"k_cache": k_cache, "v_cache": v_cache, "tables": tables, "lens": lens, "cu": cu, "cos": cos,
             "sin": sin, "positions": cupy.asarray(positions.astype(np.int32)), "slots": cupy.asarray(slots)}
    qkv_rows = (HEADS + 2 * num_kv_heads) * HEAD_DIM
    shapes = {"input_norm": (HIDDEN,), "qkv": (qkv_rows, HIDDEN), "q_norm": (HEAD_DIM,), "k_norm": (HEAD_DIM,),
              "o_proj": (HIDDEN, HEADS * HEAD_DIM), "post_norm": (HIDDEN,), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER)}
    weights = {name: draw.normal(shape, BF16, shape[-1] ** -0.5 if len(shape) == 2 else 1.0)
               for name, shape in shapes.items()}
    return weights, batch


def _decode_layer(w, b, x) -> dict:
    """Every output of the layer's launches, by name (the caches included)."""
    from barerl.backend import cuda as ops

    T, K = x.shape[0], b["k_cache"].shape[2]
    h1, rstd1 = ops.rmsnorm(x, w["input_norm"], EPS)
    qkv = ops.linear(h1, w["qkv"])
    rot, q_rstd, k_rstd = ops.qk_norm_rope_store(qkv, b["positions"], b["cos"], b["sin"], HEADS, K, w["q_norm"],
                                                 w["k_norm"], EPS, b["k_cache"], b["v_cache"], b["slots"])
    q = rot[:, : HEADS * HEAD_DIM].reshape(T, HEADS, HEAD_DIM)
    o = ops.paged_attention(q, b["k_cache"], b["v_cache"], b["tables"], b["lens"], b["cu"], HEAD_DIM**-0.5)
    x_mid = ops.linear(o.reshape(T, -1), w["o_proj"], residual=x)
    h2, rstd2 = ops.rmsnorm(x_mid, w["post_norm"], EPS)
    gate_up = ops.linear(h2, w["gate_up"])
    act = ops.swiglu(gate_up)
    out = ops.linear(act, w["down"], residual=x_mid)
    return {"h1": h1, "rstd1": rstd1, "qkv": qkv, "rot": rot, "q_rstd": q_rstd, "k_rstd": k_rstd, "o": o,
            "x_mid": x_mid, "h2": h2, "rstd2": rstd2, "gate_up": gate_up, "act": act, "out": out,
            "k_cache": b["k_cache"], "v_cache": b["v_cache"]}


def _replayed(step, prepare) -> dict:
    """step()'s outputs from one replay of its CUDA graph, captured as CudaGraphRunner captures (a warm-up run,
    then capture on a non-blocking stream from a private pool); prepare(outputs) runs before the replay."""
    import cupy

    pool, stream = cupy.cuda.MemoryPool(), cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        step()
        stream.synchronize()
        stream.begin_capture()
        outputs = step()
        graph = stream.end_capture()
        prepare(outputs)
        graph.launch(stream)
        stream.synchronize()
    return outputs


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("num_seqs,num_kv_heads", [(4, 2), (70, 8)], ids=["split-kv", "whole"])
def test_decode_layer_with_pdl_gives_the_plain_launches_bits(draw, monkeypatch, graph, num_seqs, num_kv_heads):
    """4 sequences x 2 kv heads split their keys (split + combine); 70 x 8 run whole. The PDL run follows one on
    other hidden states whose buffers it reuses (eager), or is a replay whose every output was NaN-poisoned
    first (graph): a kernel that read its input before the launch ahead of it wrote it would differ."""
    import cupy

    if not pdl.supported():
        pytest.skip("PDL needs sm_90 and a CUDA 12.3 driver")
    w, b = _layer_inputs(draw, num_seqs, num_kv_heads)
    x_warm, x_test = (draw.normal((num_seqs, HIDDEN), BF16) for _ in range(2))
    caches = b["k_cache"].copy(), b["v_cache"].copy()
    x = cupy.empty_like(x_test)  # the static input of the graph

    def step():
        b["k_cache"][...], b["v_cache"][...] = caches  # every run stores its new tokens into the same caches
        return _decode_layer(w, b, x)

    monkeypatch.setattr(pdl, "ENABLED", False)
    x[...] = x_test
    want = {name: array.copy() for name, array in step().items()}
    monkeypatch.setattr(pdl, "ENABLED", True)
    x[...] = x_warm
    if graph:
        def prepare(outputs):
            x[...] = x_test
            for array in outputs.values():
                poison(array)

        got = _replayed(step, prepare)
    else:
        step()
        x[...] = x_test
        got = step()
    for name, array in want.items():
        assert_same_bits(name, got[name], array)
