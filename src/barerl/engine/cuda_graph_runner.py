"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket (and number of lookahead steps);
every other step runs eagerly.

A decode step (one new token and one sample per sequence, no banned tokens) is ~30 small launches per layer:
launched from Python they cost more than the GPU work. `CudaGraphRunner` captures `forward_paged` + `sample`
per bucket (1, 2, 4, 8, then multiples of 16 up to max_num_seqs) when a step first needs it, and replays the
graph of the smallest bucket that holds the batch. A lookahead batch of K steps replays a graph of K
forward + sample + `advance_decode` rounds: one launch and one host sync per K tokens. Design decisions:
- Static inputs: one set of device buffers sized for the largest bucket; a bucket's graph reads their first
  rows. Each step copies its host arrays into them (four copies from pinned memory, the block table as a 2D
  copy of only the columns in use) and pads the rows past the batch: slot -1 (nothing is written to the
  cache), context length 1 (attends to block 0's first row, whatever it holds), greedy sampling.
- The block table keeps table_positions / block_size columns (max_model_len and the positions lookahead
  steps write past it), so `paged_attention` picks its split count from shapes alone and one graph serves
  every context length.
- Capture allocates from a private memory pool: the temporaries a graph reuses on every replay can never be
  handed to arrays outside the graphs. Graphs of different buckets share that pool (never run together).
  Graphs are captured lazily, when a step first needs them.
- Rope tables are built for table_positions before capture (`forward_paged(max_position=...)` then never syncs
  or reallocates them). The weights are read in place: optimizer updates reach the next replay, LoRA
  adapters' too (their buffer keeps its address); adapters attached to the model after a capture make the
  graphs stale, and they are captured again.
- The KV cache lives at a fixed virtual address (engine/device_memory.py): sleep hands its memory back to the
  driver, wake maps new memory there (zeroed), and the graphs stay valid, so a GRPO round captures nothing.
  Where the driver cannot reserve addresses, sleep drops the graphs and their pool instead and the first
  decode step after wake captures again.
- Everything runs on one non-blocking stream. A replay's tokens and log-probs are copied to fresh pinned
  host arrays behind it and an event marks their arrival: the host waits only when it asks for the result,
  so a continuation (`continue_steps`: the block tables' new columns, `advance_decode` of the last tokens
  and the same graph again) is queued while the previous replay still runs. The host rewrites the pinned
  input mirrors only for a fresh step, when nothing is in flight; a continuation's block tables are copied
  from pageable memory, which the driver stages at once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from barerl.engine.device_memory import RemappableBuffer
from barerl.engine.model_runner import (
    ModelRunner,
    PendingSteps,
    StepInputs,
    block_copies,
    block_tables,
)
from barerl.engine.scheduler import ScheduledBatch

_INT_FIELDS = ("input_ids", "positions", "context_lens", "slot_mapping", "top_k")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p")
_PAD = {"input_ids": 0, "positions": 0, "context_lens": 1, "slot_mapping": -1, "top_k": 0,
        "temperature": 0.0, "top_p": 1.0, "min_p": 0.0}


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Graph batch sizes: 1, 2, 4, 8, 16, 32, 48, ... and max_num_seqs itself."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class _Replayed(NamedTuple):
    """PendingSteps.state of a lookahead replay: its graph's (batch, steps), which a continuation replays."""

    key: tuple[int, int]


class _StaticInputs:
    """Device buffers the graphs read, their pinned host mirrors, and the copy of one step into them."""

    def __init__(self, max_batch: int, max_blocks: int):
        import cupy
        import cupyx

        self.max_batch, self.max_blocks = max_batch, max_blocks
        self.host_int = cupyx.zeros_pinned((len(_INT_FIELDS), max_batch), np.int32)
        self.host_float = cupyx.zeros_pinned((len(_FLOAT_FIELDS), max_batch), np.float32)
        self.host_rng = cupyx.zeros_pinned((2, max_batch), np.uint64)  # seeds, counters (as int64 bits)
        self.ints = cupy.zeros((len(_INT_FIELDS), max_batch), np.int32)
        self.floats = cupy.zeros((len(_FLOAT_FIELDS), max_batch), np.float32)
        self.rng = cupy.zeros((2, max_batch), np.uint64)
        self.block_tables = cupy.zeros((max_batch, max_blocks), np.int32)
        self.cu_seqlens_q = cupy.arange(max_batch + 1, dtype=np.int32)
        self.reset()

    def reset(self) -> None:
        """Every row padding (writes nothing to the cache): what a warm-up or capture may run on."""
        for i, name in enumerate(_INT_FIELDS):
            self.host_int[i] = _PAD[name]
        for i, name in enumerate(_FLOAT_FIELDS):
            self.host_float[i] = _PAD[name]
        self.block_tables.fill(0)
        self.upload(None)

    def views(self, batch: int) -> dict:
        """The arguments of forward_paged / sample for a graph of `batch` rows (views of the buffers)."""
        v = {name: self.ints[i, :batch] for i, name in enumerate(_INT_FIELDS)}
        v.update({name: self.floats[i, :batch] for i, name in enumerate(_FLOAT_FIELDS)})
        v.update(seeds=self.rng[0, :batch], counters=self.rng[1, :batch].view(np.int64),
                 block_tables=self.block_tables[:batch], cu_seqlens_q=self.cu_seqlens_q[:batch + 1])
        return v

    def fill(self, inputs: StepInputs, batch: int) -> None:
        """Copy a step of n <= batch sequences into the buffers; rows n..batch get the padding values."""
        n = len(inputs.input_ids)
        for i, name in enumerate(_INT_FIELDS):
            self.host_int[i, :n] = getattr(inputs, name)
            self.host_int[i, n:batch] = _PAD[name]
        for i, name in enumerate(_FLOAT_FIELDS):
            self.host_float[i, :n] = getattr(inputs, name)
            self.host_float[i, n:batch] = _PAD[name]
        self.host_rng[0, :n] = inputs.seeds
        self.host_rng[1, :n] = inputs.counters.view(np.uint64)
        self.upload(inputs.block_tables)

    def upload(self, tables: np.ndarray | None) -> None:
        import cupy

        stream = cupy.cuda.get_current_stream()
        for device, host in ((self.ints, self.host_int), (self.floats, self.host_float),
                             (self.rng, self.host_rng)):
            device.set(host, stream=stream)
        if tables is not None:
            self.upload_block_tables(tables)

    def upload_block_tables(self, tables: np.ndarray) -> None:
        """The first rows' block tables (-1 padding read as block 0), only the columns in use: the graphs
        never read past a context."""
        import cupy

        rows, cols = tables.shape
        if rows and cols:
            tables = np.ascontiguousarray(np.maximum(tables, 0), dtype=np.int32)
            cupy.cuda.runtime.memcpy2DAsync(
                self.block_tables.data.ptr, self.max_blocks * 4, tables.ctypes.data, cols * 4, cols * 4, rows,
                cupy.cuda.runtime.memcpyHostToDevice, cupy.cuda.get_current_stream().ptr)


class CudaGraphRunner(ModelRunner):
    """ModelRunner whose decode-only steps replay CUDA graphs (module docstring). Same interface."""

    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int, table_positions: int):
        import cupy

        # before the base class allocates the cache: its fixed address (None: a plain allocation)
        cache_bytes = int(np.prod(model.kv_cache_shape(num_blocks, block_size))) * model.dtype.itemsize
        self._kv_memory = RemappableBuffer.create(cache_bytes)
        super().__init__(model, num_blocks, block_size)
        self.buckets = batch_buckets(max_num_seqs)
        self.table_positions = table_positions
        self.static = _StaticInputs(self.buckets[-1], -(-table_positions // block_size))
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graphs: dict[tuple[int, int], tuple] = {}  # (batch, steps) -> (graph, tokens, logprobs)
        self._pool = None
        self._captured_with = None  # (KV cache address, LoRA adapters) the graphs were captured with
        model._ensure_rope(table_positions)  # before capture, with the default allocator: graphs read these

    def allocate_kv_cache(self) -> None:
        if self._kv_memory is None or self.kv_cache is not None:
            return super().allocate_kv_cache()
        self.release_cached_blocks()
        self._kv_memory.map()
        self.kv_cache = self._kv_memory.array(self.model.kv_cache_shape(self.num_blocks, self.block_size),
                                              self.model.dtype)
        self.kv_cache.fill(0)  # as a plain allocation's: padding rows of a graph read block 0

    def free_kv_cache(self) -> None:
        if self._kv_memory is None:
            self._drop_graphs()
            return super().free_kv_cache()
        self.kv_cache = None
        self._kv_memory.release()

    def bytes_outside_default_pool(self) -> int:
        """The mapped fixed-address KV cache and the graphs' private pool."""
        mapped = self._kv_memory.nbytes if self._kv_memory is not None and self._kv_memory.mapped else 0
        return mapped + (self._pool.total_bytes() if self._pool is not None else 0)

    def _drop_graphs(self) -> None:
        self.graphs, self._captured_with = {}, None
        if self._pool is not None:
            self._pool.free_all_blocks()
            self._pool = None

    def execute(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
        return self._replay(inputs, 1).result() if self._graphable(inputs) else super().execute(inputs)

    def execute_steps(self, inputs: StepInputs, num_steps: int) -> PendingSteps:
        if not self._graphable(inputs):
            return super().execute_steps(inputs, num_steps)
        return self._replay(inputs, num_steps)

    def continue_steps(self, batch: ScheduledBatch, previous: PendingSteps) -> PendingSteps:
        if not isinstance(previous.state, _Replayed):  # an eager call continues eagerly
            return super().continue_steps(batch, previous)
        key = previous.state.key
        graph, tokens, _ = self.graphs[key]
        with self.stream:
            self.static.upload_block_tables(block_tables(batch))
            self.copy_blocks(*block_copies(batch))
            self.advance(tokens[-1], self.static.views(key[0]))
            graph.launch(self.stream)
            return self._fetch_later(key, len(batch.seqs))

    def _graphable(self, inputs: StepInputs) -> bool:
        return (inputs.is_decode_only and not len(inputs.banned_rows) and len(inputs.input_ids) <= self.buckets[-1]
                and self.kv_cache is not None)

    def _replay(self, inputs: StepInputs, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and log-probs (n,) of one step, or (num_steps, n) of several, from the bucket's graph."""
        captured_with = (self.kv_cache.data.ptr, self.model.lora)
        if self._captured_with != captured_with:  # a cache elsewhere, or adapters attached since: graphs are stale
            self._drop_graphs()
            self._captured_with = captured_with
        n = len(inputs.input_ids)
        batch = next(b for b in self.buckets if b >= n)
        if (batch, num_steps) not in self.graphs:
            self.capture(batch, num_steps)
        graph = self.graphs[batch, num_steps][0]
        with self.stream:
            self.static.fill(inputs, batch)
            self.copy_blocks(inputs.copy_src, inputs.copy_dst)
            graph.launch(self.stream)
            return self._fetch_later((batch, num_steps), n)

    def _fetch_later(self, key: tuple[int, int], n: int) -> PendingSteps:
        """Copy the graph's tokens and log-probs to the host behind its replay; wait only in result()."""
        import cupy
        import cupyx

        _, tokens, logprobs = self.graphs[key]
        host = []
        for device in (tokens, logprobs):
            host.append(cupyx.empty_pinned(device.shape, device.dtype))
            cupy.cuda.runtime.memcpyAsync(host[-1].ctypes.data, device.data.ptr, device.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)
        arrived = self.stream.record()

        def fetch():
            arrived.synchronize()
            return host[0][..., :n].copy(), host[1][..., :n].copy()

        return PendingSteps(fetch, _Replayed(key) if key[1] > 1 else None)

    def capture(self, batch: int, num_steps: int) -> None:
        """Capture the graph of `num_steps` decode steps of `batch` rows, when a step first needs it."""
        import cupy

        if self._pool is None:
            self._pool = cupy.cuda.MemoryPool()
        cupy.cuda.Device().synchronize()  # the eager path's work (legacy stream) is done before ours starts
        with self.stream, cupy.cuda.using_allocator(self._pool.malloc):
            self.static.reset()
            self._decode(batch, num_steps)  # warm-up: compiles kernels, fills the pool on this stream
            self.stream.synchronize()
            self.stream.begin_capture()
            tokens, logprobs = self._decode(batch, num_steps)
            self.graphs[batch, num_steps] = (self.stream.end_capture(), tokens, logprobs)

    def _decode(self, batch: int, num_steps: int):
        """decode_steps on the static buffers' first `batch` rows (what the graphs hold). Returns tokens and
        log-probs (batch,) for one step, (num_steps, batch) for several."""
        v = self.static.views(batch)

        def sample(logits, counters):
            return self.model.ops.sample(logits, v["temperature"], v["top_k"], v["top_p"], v["min_p"],
                                             v["seeds"], counters)

        tokens, logprobs = self.decode_steps(v, num_steps, sample, max_position=self.table_positions - 1)
        return (tokens[0], logprobs[0]) if num_steps == 1 else (tokens, logprobs)
