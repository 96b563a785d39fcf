"""cuBLASLt matrix products through ctypes: out = alpha op(a) op(b) + beta c (+ bias), with c and out distinct.

Why next to cublas.py's GemmEx: a linear layer's residual comes in as `c` and its bias as an epilogue, so one
kernel writes the layer's output (GemmEx needs `out` prefilled with bias + residual: one more pass over the
output), and cuBLASLt proposes several algorithms per shape.

Algorithm choice: the heuristic's first pick is often not its fastest candidate (measured on the H200 at T1
shapes: up to 27% slower, docs/LOG.md). The first product of a shape class (rows rounded up to a power
of two, so ragged batches do not each tune) outside CUDA-graph capture times every candidate on scratch
output, replaying a CUDA graph of a few launches (timed one by one from the host, a short product measures
the launch overhead, not the kernel), and keeps the fastest, if it beats the first pick by `_TUNE_MARGIN`.
Decode-sized products (at most `_TUNE_MIN_ROWS` rows) are timed cold: repeated on one weight, their weight
stays in L2, which a decode step's KV-cache stream evicts between two uses, so hot timing favours the wrong
algorithm (the split-K versions chosen that way slowed G1 and G2 on the H200). Their replay cycles through
copies of b (cuBLASLt's A: the weight of a linear layer) that together span `_COLD_BYTES`, several times the
L2, so each launch streams its weight from HBM as in a decode step; the copies are freed right after.
`_TUNE_DECODE = False` keeps the heuristic's first pick for them instead (and ignores their recorded
choices). The heuristic sizes its proposals for many rows, so a decode product's fastest candidate is then the
start of a search (`_SEARCH_DECODE`): one attribute at a time (tile with stages, split-K parts with reduction
scheme, cluster shape, CTA swizzle), every value cuBLASLt accepts (cublasLtMatmulAlgoCheck) is timed cold the
same way and the fastest is kept, two rounds over the attributes. Every timed algorithm's output must match the
first pick's (a wrong configuration is never kept). An in-place accumulation (c is out, beta != 0) of decode
size always takes the first pick: split-K algorithms summed wrongly in place there (weight gradients, H200).
Choices persist in a JSON file per GPU and library version (CACHE_DIR), so a rerun on the machine picks the
same algorithms: the same numbers. A product captured before its class is tuned takes the heuristic's first
pick, and so does an untuned decode-sized product inside `defer_decode_tuning()` (the engine's prefill and
mixed steps), leaving the class to be tuned by a decode step: the cold search takes seconds a class, which pays
off over a decode shape's many replays, not in a step of a few hundred rows that a conversation's next turn or a
served request makes once (the likely cause of a 3.26 s stall in a multi-turn rollout on the H200, docs/LOG.md).

Batch invariance (`matmul(..., batch_invariant=True)`): a row of a product then has the same bits whatever the
number of rows around it, so the engine's decode products (a few rows) and the trainer's (thousands) agree.
Measured on the H200 (bench/batch_invariance.py): every algorithm without split-K gives the same bits, whatever
its tile, cluster or the row count, while split-K ones differ; cuBLASLt proposes only split-K algorithms for some
decode shapes (down_proj at 16-64 rows). In this mode a plan keeps the split-free candidates, or makes them from
the proposed ones (split-K parts set to 1, checked with cublasLtMatmulAlgoCheck); tuning then picks among them.

Layout: as in cublas.py, row-major out (M, N) = op(a) @ op(b) is computed as the column-major
out^T = op(b)^T op(a)^T, which reads the same memory with no copies. A plan (descriptors, layouts, the
heuristic's candidates) is built once per shape, dtypes and pointer alignment; building one calls no CUDA
work, so a plan can be made during CUDA-graph capture.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from barerl.ops.cuda.build import CACHE_DIR
from barerl.ops.cuda.cublas import (
    _CUDA_DTYPE,
    WORKSPACE_BYTES,
    CublasError,
    LibraryHandle,
    check,
    load_library,
    matrix_layout,
    on_current_device,
    product_layouts,
)

_COMPUTE_32F, _SCALE_32F = 68, 0
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_EPILOGUE_DEFAULT, _EPILOGUE_BIAS = 1, 4
# cublasLtMatmulAlgoConfigAttributes_t: name -> (attribute, bytes)
_ALGO_CONFIG = {"id": (0, 4), "tile": (1, 4), "splitk": (2, 4), "reduction": (3, 4), "swizzle": (4, 4),
                "custom": (5, 4), "stages": (6, 4), "inner_shape": (7, 2), "cluster_shape": (8, 2)}
_PREF_MAX_WORKSPACE, _PREF_MIN_ALIGNMENT = 1, (5, 6, 7, 8)  # alignment of A, B, C, D in bytes
_CAPS = (6, 13, 0, 1, 2)  # cublasLtMatmulAlgoCapAttributes_t: tile ids, stages ids, split-K, reductions, swizzle
CANDIDATES = 16  # algorithms asked of the heuristic per plan
_TUNE_MIN_ROWS = 256  # products of at most this many rows (decode) are timed cold (see the module docstring)
_TUNE_DECODE = True  # False: decode-sized products keep the heuristic's first pick (A/B)
_DECODE_CANDIDATES = CANDIDATES  # the heuristic's first this many are timed for a decode-sized product
_COLD_BYTES = 256 << 20  # bytes of b one cold replay cycles through: five times the H200's 50 MB L2
_COLD_MAX_COPIES = 128  # at most this many copies of b (a small b's product is short anyway)
_decode_tuning_deferred = False  # inside defer_decode_tuning()
_TUNE_MARGIN = 0.03  # a candidate replaces the first pick only when this much faster: no flip-flop on noise
_SEARCH_DECODE = True  # decode-sized products also time configurations next to their fastest candidate
_SEARCH_ROUNDS = 2  # passes over the attributes
_SPLIT_PARTS = (1, 2, 3, 4, 6, 8, 12, 16)  # split-K parts a search tries (where the algorithm supports split-K)
_CLUSTER_SHAPE_IDS = 21  # cublasLtClusterShape_t ids 0..20 a search tries (AUTO first); AlgoCheck refuses misfits
_AGREE = 1e-2  # a timed algorithm's output may differ from the first pick's by this much of its largest entry
_TUNE_REPEATS = 10  # launches per timed graph replay


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, u64, i64, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    signatures = {
        "cublasLtCreate": [p],
        "cublasLtMatmulDescCreate": [p, i, i],
        "cublasLtMatmulDescSetAttribute": [p, i, p, size],
        "cublasLtMatrixLayoutCreate": [p, i, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [p],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, size],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, p, p],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, size, p],
        "cublasLtMatmulAlgoCheck": [p, p, p, p, p, p, p, p],
        "cublasLtMatmulAlgoConfigGetAttribute": [p, i, p, size, p],
        "cublasLtMatmulAlgoConfigSetAttribute": [p, i, p, size],
        "cublasLtMatmulAlgoCapGetAttribute": [p, i, p, size, p],
        "cublasLtGetVersion": [],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return lib


def _set(setter, obj, attribute: int, value: ctypes._SimpleCData) -> None:
    check(setter(obj, attribute, ctypes.byref(value), ctypes.sizeof(value)), setter.__name__)


@dataclass
class _Plan:
    desc: ctypes.c_void_p
    layouts: tuple  # A, B, C, D of the column-major product
    candidates: list  # HeuristicResult, the heuristic's order
    tuning_key: str  # the shape class: M, N and K rounded up to powers of two
    decode: bool  # at most _TUNE_MIN_ROWS rows: timed cold, or not at all
    invariant: bool  # batch-invariant: split-free algorithms only
    chosen: object = None  # the algorithm in use once tuned (HeuristicResult)


class _Lt(LibraryHandle):
    """One cuBLASLt handle per device, its workspace and its plans."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        import cupy

        super().__init__(lib, "cublasLtCreate")
        self.plans: dict[tuple, _Plan] = {}
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        self.choices_path = CACHE_DIR / f"cublaslt-{name.replace(' ', '_')}-{lib.cublasLtGetVersion()}.json"
        self.choices: dict[str, str] = _read_json(self.choices_path)  # tuning key -> algorithm bytes, hex

    def _layout(self, dtype, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), _CUDA_DTYPE[dtype.name], rows, cols, ld),
               "cublasLtMatrixLayoutCreate")
        return layout

    def plan(self, key: tuple) -> _Plan:
        if key not in self.plans:
            self.plans[key] = self._make_plan(*key)
        return self.plans[key]

    def algorithm(self, plan: _Plan, tune) -> object:
        """The plan's algorithm: its class's recorded choice when it applies to this exact shape, else the
        fastest candidate timed by tune(candidate) -> ms (None while capturing: the first pick, not kept)."""
        if plan.chosen is not None:
            return plan.chosen
        if len(plan.candidates) == 1 or (plan.decode and not _TUNE_DECODE):
            plan.chosen = plan.candidates[0]  # untuned: a recorded choice (with _TUNE_DECODE on) does not apply
            return plan.chosen
        recorded = self.choices.get(plan.tuning_key)
        if recorded is not None:
            plan.chosen = self._checked(plan, bytes.fromhex(recorded))
            return plan.chosen
        if tune is None:
            return plan.candidates[0]
        timed = plan.candidates[:_DECODE_CANDIDATES] if plan.decode else plan.candidates
        times = [tune(candidate) for candidate in timed]
        best = int(np.argmin(times))
        fastest, fastest_time = timed[best], times[best]
        if plan.decode and _SEARCH_DECODE:
            fastest, fastest_time = self._search(plan, tune, fastest, fastest_time)
        plan.chosen = fastest if fastest_time < (1 - _TUNE_MARGIN) * times[0] else timed[0]
        self.choices[plan.tuning_key] = bytes(plan.chosen.algo).hex()
        _write_json(self.choices_path, self.choices)
        return plan.chosen

    def _search(self, plan: _Plan, tune, best, best_time: float) -> tuple[object, float]:
        """The fastest algorithm found by changing one attribute of the best one so far at a time."""
        seen = {bytes(candidate.algo) for candidate in plan.candidates}
        for _ in range(_SEARCH_ROUNDS):
            for axis in ("tile", "split", "cluster_shape", "swizzle"):
                for variant in self._variants(plan, best, axis, seen):
                    time = tune(variant)
                    if time < best_time:
                        best, best_time = variant, time
        return best, best_time

    def _variants(self, plan: _Plan, algorithm, axis: str, seen: set) -> list:
        """`algorithm` with each accepted value of one attribute group, not in `seen` (which grows)."""
        caps = self._caps(algorithm)
        if axis == "tile":
            names, values = ("tile", "stages"), [(t, s) for t in caps["tiles"] for s in caps["stages"]]
        elif axis == "split":
            parts = _SPLIT_PARTS if caps["splitk"] and not plan.invariant else (1,)
            schemes = [bit for bit in (1, 2, 4) if caps["reduction_mask"] & bit]
            names, values = ("splitk", "reduction"), [(1, 0)] + [(p, r) for p in parts[1:] for r in schemes]
        elif axis == "cluster_shape":
            names, values = ("cluster_shape",), [(c,) for c in range(_CLUSTER_SHAPE_IDS)]
        else:
            names, values = ("swizzle",), [(0,), (1,)] if caps["swizzle"] else []
        made = (self._configured(plan.desc, plan.layouts, algorithm, dict(zip(names, value)), seen)
                for value in values)
        return [result for result in made if result is not None]

    def _caps(self, algorithm) -> dict:
        """What the algorithm's kernel family supports: tile and stages ids, split-K, reductions, swizzle."""
        tiles, stages, splitk, reductions, swizzle = (self._cap(algorithm, attribute) for attribute in _CAPS)
        return {"tiles": tiles, "stages": stages, "splitk": splitk[0], "reduction_mask": reductions[0],
                "swizzle": swizzle[0]}

    def _cap(self, algorithm, attribute: int) -> list[int]:
        """A capability of the algorithm as uint32 words (one for a flag or a mask, one per id of a list)."""
        get, size = self.lib.cublasLtMatmulAlgoCapGetAttribute, ctypes.c_size_t()
        check(get(ctypes.byref(algorithm.algo), attribute, None, 0, ctypes.byref(size)), get.__name__)
        words = (ctypes.c_uint32 * max(1, size.value // 4))()
        check(get(ctypes.byref(algorithm.algo), attribute, words, ctypes.sizeof(words), ctypes.byref(size)),
              get.__name__)
        return list(words)

    def _checked(self, plan: _Plan, algo_bytes: bytes) -> object:
        """The recorded algorithm as a HeuristicResult if cuBLASLt accepts it for this exact plan, else the
        heuristic's first pick."""
        result = HeuristicResult()
        ctypes.memmove(result.algo, algo_bytes, min(len(algo_bytes), ctypes.sizeof(result.algo)))
        status = self.lib.cublasLtMatmulAlgoCheck(self.handle, plan.desc, *plan.layouts, ctypes.byref(result.algo),
                                                  ctypes.byref(result))
        accepted = status == 0 and result.workspace_size <= WORKSPACE_BYTES
        return result if accepted else plan.candidates[0]

    def _make_plan(self, trans_a, trans_b, shapes, dtypes, has_bias, alignments, invariant) -> _Plan:
        lib = self.lib
        (rows_a, cols_a, ld_a), (rows_b, cols_b, ld_b), (m, n, ld_c, ld_d) = shapes
        in_type, c_type = dtypes
        desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _SCALE_32F), "cublasLtMatmulDescCreate")
        _set(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_TRANSA, ctypes.c_int32(int(trans_a)))
        _set(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_TRANSB, ctypes.c_int32(int(trans_b)))
        epilogue = _EPILOGUE_BIAS if has_bias else _EPILOGUE_DEFAULT
        _set(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        # a row-major (rows, cols, ld) matrix is the column-major (cols, rows, ld) one
        layouts = (self._layout(in_type, cols_a, rows_a, ld_a), self._layout(in_type, cols_b, rows_b, ld_b),
                   self._layout(c_type, n, m, ld_c), self._layout(c_type, n, m, ld_d))
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, _PREF_MAX_WORKSPACE, ctypes.c_uint64(WORKSPACE_BYTES))
        for attribute, alignment in zip(_PREF_MIN_ALIGNMENT, alignments):
            _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, attribute, ctypes.c_uint32(alignment))
        results = (HeuristicResult * CANDIDATES)()
        found = ctypes.c_int()
        check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, *layouts, pref, CANDIDATES, results,
                                                  ctypes.byref(found)), "cublasLtMatmulAlgoGetHeuristic")
        candidates = [results[i] for i in range(found.value) if results[i].state == 0]
        if invariant:
            candidates = self._split_free(desc, layouts, candidates)
        what = f"trans {int(trans_a)}/{int(trans_b)}, shapes {shapes}, dtypes {dtypes[0]}->{dtypes[1]}"
        if not candidates:
            raise CublasError(f"cuBLASLt has no {'split-free ' if invariant else ''}algorithm for {what}")
        key = _tuning_key(trans_a, trans_b, shapes, dtypes, has_bias, alignments)
        key += " invariant" if invariant else ""
        return _Plan(desc, layouts, candidates, key, decode=m <= _TUNE_MIN_ROWS, invariant=invariant)

    def _split_free(self, desc, layouts, candidates: list) -> list:
        """The candidates without split-K, else the candidates with their split-K parts set to 1 that
        cuBLASLt accepts for this product (batch-invariant mode)."""
        whole = [c for c in candidates if _config_of(self.lib, c)["splitk"] <= 1]
        if whole:
            return whole
        seen: set = set()
        made = (self._configured(desc, layouts, candidate, {"splitk": 1, "reduction": 0}, seen)
                for candidate in candidates)
        return [result for result in made if result is not None]

    def _configured(self, desc, layouts, algorithm, settings: dict, seen: set):
        """`algorithm` with its configuration attributes set as `settings` says, if cuBLASLt accepts that for
        the product and it is not in `seen` (which it then joins), else None."""
        result = HeuristicResult()
        ctypes.memmove(result.algo, algorithm.algo, ctypes.sizeof(result.algo))
        for name, value in settings.items():
            attribute, nbytes = _ALGO_CONFIG[name]
            check(self.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(result.algo), attribute,
                                                                ctypes.byref(ctypes.c_uint32(value)), nbytes),
                  "cublasLtMatmulAlgoConfigSetAttribute")
        status = self.lib.cublasLtMatmulAlgoCheck(self.handle, desc, *layouts, ctypes.byref(result.algo),
                                                  ctypes.byref(result))
        if status != 0 or result.workspace_size > WORKSPACE_BYTES or bytes(result.algo) in seen:
            return None
        seen.add(bytes(result.algo))
        return result


def _size_class(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


def _tuning_key(trans_a, trans_b, shapes, dtypes, has_bias, alignments) -> str:
    """A plan's shape class: M, N, K each rounded up to a power of two (token counts vary batch to batch)."""
    (rows_a, cols_a, _), _, (m, n, _, _) = shapes
    k = cols_a if trans_a else rows_a  # cuBLASLt's A (our b) is (k, n) column-major, or (n, k) transposed
    m_class, n_class, k_class = (_size_class(x) for x in (m, n, k))
    return (f"trans {int(trans_a)}{int(trans_b)} m<={m_class} n<={n_class} k<={k_class} {dtypes[0]}->{dtypes[1]}"
            f" bias {int(has_bias)} align {'/'.join(map(str, alignments))}")


def _read_json(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_json(path, data: dict) -> None:
    """Atomically (temp + rename): processes sharing the cache never read half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only home: choices stay in memory
        pass


_per_device: dict[int, _Lt] = {}


def _lt() -> _Lt:
    return on_current_device(_per_device, lambda: _Lt(_declare(load_library("cublasLt"))))


def alignment(address: int) -> int:
    """The largest power of two up to 256 dividing a device address (cuBLASLt's kernels need to know)."""
    return min(256, address & -address) if address else 256


def candidates(a, b, out, transa=False, transb=False, c=None, bias=None, batch_invariant: bool = False) -> int:
    """How many algorithms the heuristic proposed for this product (for benchmarks timing each)."""
    return len(_plan_for(a, b, out, transa, transb, c, bias, batch_invariant)[0].candidates)


def chosen(a, b, out, transa=False, transb=False, c=None, bias=None, batch_invariant: bool = False) -> int | None:
    """The candidate index of the algorithm this product's plan uses (for benchmarks); None before it is
    chosen, or when it is a recorded choice that the heuristic did not propose for this exact shape."""
    plan = _plan_for(a, b, out, transa, transb, c, bias, batch_invariant)[0]
    algos = [bytes(candidate.algo) for candidate in plan.candidates]
    pick = None if plan.chosen is None else bytes(plan.chosen.algo)
    return algos.index(pick) if pick in algos else None


def algorithm_config(result) -> dict[str, int]:
    """An algorithm's configuration (cuBLASLt's id, tile, split-K parts, reduction scheme, ...) by name."""
    return _config_of(_lt().lib, result)


def _config_of(lib, result) -> dict[str, int]:
    config = {}
    for name, (attribute, nbytes) in _ALGO_CONFIG.items():
        value, written = ctypes.c_uint64(0), ctypes.c_size_t()
        check(lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(result.algo), attribute, ctypes.byref(value),
                                                       nbytes, ctypes.byref(written)),
              "cublasLtMatmulAlgoConfigGetAttribute")
        config[name] = value.value
    return config


def candidate_configs(a, b, out, transa=False, transb=False, c=None, bias=None,
                      batch_invariant: bool = False) -> list[dict[str, int]]:
    """algorithm_config of each of the heuristic's candidates for this product (benchmarks)."""
    plan = _plan_for(a, b, out, transa, transb, c, bias, batch_invariant)[0]
    return [algorithm_config(r) for r in plan.candidates]


def _plan_for(a, b, out, transa, transb, c, bias, batch_invariant: bool):
    c = out if c is None else c
    if c.dtype != out.dtype or c.shape != out.shape:
        raise ValueError(f"matmul: c {c.shape} {c.dtype} must match out {out.shape} {out.dtype}")
    (m, n, k), (ra, ca, lda), (rb, cb, ldb), (_, _, ldd) = product_layouts(a, b, out, transa, transb)
    _, _, ldc = matrix_layout(c, "c")
    if bias is not None and (bias.shape != (n,) or bias.dtype != out.dtype):
        raise ValueError(f"matmul: bias {bias.shape} {bias.dtype} must be ({n},) {out.dtype}")
    # column-major: out^T = op(b)^T op(a)^T, so cuBLASLt's A is our b and its B our a
    pointers = (b.data.ptr, a.data.ptr, c.data.ptr, out.data.ptr)
    key = (transb, transa, ((rb, cb, ldb), (ra, ca, lda), (m, n, ldc, ldd)), (a.dtype, out.dtype),
           bias is not None, tuple(alignment(ptr) for ptr in pointers), bool(batch_invariant))
    return _lt().plan(key), pointers, (m, n, k)


def matmul(a, b, out, transa: bool = False, transb: bool = False, alpha: float = 1.0, beta: float = 0.0, c=None,
           bias=None, algo: int | None = None, batch_invariant: bool = False):
    """out = alpha * op(a) @ op(b) + beta * c + bias, op(x) = x.T when trans; c defaults to out. Returns out.

    op(a) (M, K), op(b) (K, N), c and out (M, N) of one dtype (bf16, fp16 or fp32), bias (N,) in out's dtype.
    Accumulation in fp32, rounded to out's dtype once. `algo` forces the heuristic's candidate of that index
    (benchmarks); by default the shape class's tuned choice (see the module's docstring). `batch_invariant`:
    split-K-free algorithms only, so a row's bits do not depend on the number of rows.
    """
    import cupy

    plan, pointers, (m, n, k) = _plan_for(a, b, out, transa, transb, c, bias, batch_invariant)
    if m == 0 or n == 0:
        return out
    lt = _lt()
    if bias is not None:
        _set(lt.lib.cublasLtMatmulDescSetAttribute, plan.desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias.data.ptr))
    f_alpha, f_beta = ctypes.c_float(alpha), ctypes.c_float(beta)
    stream = cupy.cuda.get_current_stream()

    def launch(choice, c_ptr: int, d_ptr: int, on=stream, b_ptr: int = pointers[0]) -> None:
        la, lb, lc, ld = plan.layouts
        status = lt.lib.cublasLtMatmul(
            lt.handle, plan.desc, ctypes.byref(f_alpha), ctypes.c_void_p(b_ptr), la,
            ctypes.c_void_p(pointers[1]), lb, ctypes.byref(f_beta), ctypes.c_void_p(c_ptr), lc,
            ctypes.c_void_p(d_ptr), ld, ctypes.byref(choice.algo), ctypes.c_void_p(lt.workspace.data.ptr),
            WORKSPACE_BYTES, ctypes.c_void_p(on.ptr),
        )
        check(status, f"cublasLtMatmul(m={m}, n={n}, k={k}, {a.dtype}->{out.dtype})")

    # the tuning's D, and its C when C is out (garbage costs the same time): out stays untouched; and the
    # copies of b a decode-sized product cycles through (b alone for a hot replay)
    scratch = {}

    def time_candidate(choice) -> float:
        if not scratch:
            scratch["d"] = cupy.empty_like(out)
            scratch["b"] = _cold_copies(b, stream) if plan.decode else (None, [pointers[0]])
        d_ptr = scratch["d"].data.ptr
        c_ptr = d_ptr if pointers[2] == pointers[3] else pointers[2]  # a separate c is only read
        b_ptrs = scratch["b"][1]
        try:
            launch(choice, c_ptr, d_ptr)  # outside the graph first: a failing algorithm raises here
        except CublasError:
            return math.inf
        if plan.decode and c_ptr != d_ptr and not _agrees(scratch):
            return math.inf
        side = cupy.cuda.Stream(non_blocking=True)
        side.wait_event(stream.record())
        side.begin_capture()
        for i in range(max(len(b_ptrs), _TUNE_REPEATS)):
            launch(choice, c_ptr, d_ptr, side, b_ptrs[i % len(b_ptrs)])
        graph = side.end_capture()
        graph.launch(side)  # the first replay uploads the graph
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(side)
        graph.launch(side)
        end.record(side)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    if algo is not None:
        choice = plan.candidates[algo]
    elif plan.decode and beta != 0.0 and pointers[2] == pointers[3]:  # in place: never tuned (module docstring)
        choice = plan.candidates[0]
    elif plan.chosen is not None:  # the common case: no capture query, no tuning
        choice = plan.chosen
    else:
        try:
            choice = lt.algorithm(plan, time_candidate if _may_tune(plan, stream) else None)
        except cupy.cuda.memory.OutOfMemoryError:  # no room for the cold copies now: untuned, tried again later
            choice = plan.candidates[0]
        if scratch:  # tuned just now: give the scratch (up to a 0.6 GB LM-head gradient) back to the driver
            scratch.clear()
            cupy.get_default_memory_pool().free_all_blocks()
    launch(choice, pointers[2], pointers[3])
    return out


def _agrees(scratch: dict) -> bool:
    """Whether the product just written to scratch["d"] matches the first timed one's (kept as the reference).
    Decode-sized, out of place only: an in-place product's output depends on what the scratch held."""
    import cupy

    d = scratch["d"].astype(np.float32)
    if "reference" not in scratch:
        scratch["reference"] = d
        return True
    reference = scratch["reference"]
    scale = float(cupy.abs(reference).max())
    return bool(float(cupy.abs(d - reference).max()) <= _AGREE * scale)  # False on a NaN


def _cold_copies(b, stream) -> tuple[object, list[int]]:
    """The addresses of b and of copies of it spanning `_COLD_BYTES` in all (at most `_COLD_MAX_COPIES`), and
    the copies' memory: a replay cycling through them finds each launch's b out of L2, as in a decode step."""
    import cupy

    rows, cols, ld = matrix_layout(b, "b")
    span = ((rows - 1) * ld + cols) * b.itemsize
    count = min(_COLD_MAX_COPIES, -(-_COLD_BYTES // span))
    if count == 1:  # b alone is past the L2 several times (an LM head's weight)
        return None, [b.data.ptr]
    stride = -(-span // 256) * 256  # every copy at least as aligned as the plan asked of b
    # straight from the driver, not through the pool in use: a graph runner's private pool would keep it
    memory = cupy.cuda.Memory((count - 1) * stride)
    copies = [memory.ptr + i * stride for i in range(count - 1)]
    for ptr in copies:
        cupy.cuda.runtime.memcpyAsync(ptr, b.data.ptr, span, cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    return memory, [b.data.ptr, *copies]


@contextmanager
def defer_decode_tuning():
    """Products inside take a decode-sized class's recorded choice, or the heuristic's first pick untimed and
    unkept (see the module's docstring): for engine steps that are not pure decode."""
    global _decode_tuning_deferred
    before, _decode_tuning_deferred = _decode_tuning_deferred, True
    try:
        yield
    finally:
        _decode_tuning_deferred = before


def _may_tune(plan: _Plan, stream) -> bool:
    """Whether a product of an untuned plan may time its candidates now."""
    return not (plan.decode and _decode_tuning_deferred) and not _capturing(stream)


def _capturing(stream) -> bool:
    try:
        return bool(stream.is_capturing())
    except Exception:  # noqa: BLE001 - the legacy stream during another stream's capture: do not time
        return True
