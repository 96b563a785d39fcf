"""What every workload script shares (sizes and floors: shapes.py): the machine's ceilings, process-start time,
device memory sampled the same way for every system, and one JSON record per run (or per failure).

Design decisions:
- Each script runs one system in its own process, so its warm-up, its peak memory and its cold start are its
  own; the driver (`gpu_run.sh`) runs them back to back on one GPU, which is what "the same run" means here.
- Peak memory is read the same way for barerl and every peer: a thread samples the device's used memory
  (NVML, else the CUDA runtime's free/total) every 10 ms, and the peak is the largest sample minus the one
  taken before the script touched the GPU. It counts everything the process holds (CUDA context, allocator
  caches, KV cache, graph pools, cuBLAS workspaces); each system's own figure is recorded beside it.
- Cold start is measured from the moment the OS started the process (/proc/self/stat), so interpreter start
  and imports count.
- No torch, CuPy or barerl import at module level: a script imports what its system needs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import zlib
from datetime import date
from pathlib import Path

from shapes import (
    GENERATION,
    QUICK_NEW_TOKENS,
    SHAPES,
    Generation,
    Training,
    decode_floor_seconds,
    model_config,
    utilisation_words,
    workload,
)

SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "tie_word_embeddings")  # what makes a shape


def generation_parser(doc: str, timed: int) -> argparse.ArgumentParser:
    """The command line every generation script shares; each adds its own options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--workload", "--workloads", dest="workloads", nargs="+", default=["G1", "G2"],
                        choices=list(GENERATION), help="run in order in this process, all of one model shape")
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="run the workloads' sizes on this model shape (default: each workload's own)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_NEW_TOKENS} new tokens of a tiny model (a smoke test; barerl, transformers: the CPU)")
    parser.add_argument("--timed", type=int, default=timed, help="timed calls per workload (the best is reported)")
    parser.add_argument("--out", default=None, help="folder for the JSON records")
    return parser


def generation_workloads(parser: argparse.ArgumentParser, args) -> dict[str, Generation]:
    """The workloads asked for, by the name their records go under; one model shape, or a clear error."""
    works = dict(workload(GENERATION, name, args.shape, args.quick) for name in args.workloads)
    shapes = sorted({w.shape for w in works.values()})
    if len(shapes) > 1:
        parser.error(f"--workload {' '.join(args.workloads)}: one process runs one model shape, these need "
                     f"{', '.join(shapes)}; run them one shape at a time (or give --shape)")
    return works


def gib(value: float | None) -> str:
    """A GiB figure in a printed line ("-" where none was read: no GPU)."""
    return "-" if value is None else f"{value:.1f}"


def report_generation_floor(key: str, work: Generation, metrics: dict, copy_tbs: float, system: str) -> None:
    """Add the HBM floor (seconds of the timed call's work) and the fraction of it reached to `metrics`, and print
    both with the peak memory."""
    floor = decode_floor_seconds(model_config(work.shape), work, copy_tbs * 1e12)
    metrics.update(floor_s=floor, of_hbm_bound=floor * metrics["new_tok_s"] / metrics["new_tokens"])
    print(f"{key} floor ({work.shape}, {work.sequences} x {work.new_tokens} new tokens after {work.prompt_len}-token "
          f"prompts): {work.sequences * work.new_tokens / floor:,.0f} new tok/s ({1e3 * floor / work.new_tokens:.2f} "
          f"ms a decode step at {copy_tbs:.2f} TB/s); {system} {metrics['new_tok_s']:,.0f} new tok/s, "
          f"{metrics['of_hbm_bound']:.1%} of it; peak {gib(metrics.get('peak_gib'))} GiB", flush=True)


def print_training_floor(key: str, t: Training, m: dict, row: str) -> None:
    """A training row's floor line: the sizes, the floor at the measured matrix rate (the fraction of it reached
    is the MFU), MFU over the spec too, the peak memory and the plan's where `m` has it."""
    floor = f"floor {m['floor_s']:.2f} s at {m['matmul_tflops']:.0f} TFLOP/s" if m["floor_s"] else "no floor (no GPU)"
    planned = f" (planned {m['planned_gib']:.1f})" if "planned_gib" in m else ""
    print(f"{key} {row} ({t.shape}, {t.sequences} x {t.seqlen} tokens, {t.loss_tokens or 'all'} with a loss each, "
          f"micro-batches of {t.micro_batch}; {m['useful_flop']:.3g} FLOP): {floor}; {m['step_s']:.2f} s, "
          f"{utilisation_words(m)}; peak {gib(m.get('peak_gib'))} GiB{planned}", flush=True)


def check_model_folder(folder: str, shape: dict) -> None:
    """Stop with a clear message if make_model.py's `folder` holds another shape than the workload runs (read as
    barerl reads a folder's config, with its defaults)."""
    from barerl.config import ModelConfig
    from barerl.formats.paths import load_config

    found, wanted = load_config(folder), ModelConfig.from_dict(shape)
    differing = [f"{k} {getattr(found, k)} (the workload's: {getattr(wanted, k)})" for k in SIZE_KEYS
                 if getattr(found, k) != getattr(wanted, k)]
    if differing:
        raise SystemExit(f"{folder} is not the workload's model shape: {'; '.join(differing)}; write one with "
                         "`python bench/make_model.py DIR --shape SHAPE`")


def process_start_time() -> float:
    """Wall-clock time (time.time()) at which the OS started this process."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime: clock ticks after boot
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):  # not Linux: the earliest time we can see
        return _IMPORTED


_IMPORTED = time.time()


def since_process_start() -> float:
    return time.time() - process_start_time()


def caches_at_start() -> dict:
    """How warm the compile caches are (a cold start on a fresh machine has none): files in CuPy's kernel cache,
    vLLM's torch.compile cache, torch inductor's cache."""
    home = Path.home()
    folders = {"cupy_kernel_cache_files": Path(os.environ.get("CUPY_CACHE_DIR", home / ".cupy" / "kernel_cache")),
               "vllm_compile_cache_files": Path(os.environ.get("VLLM_CACHE_ROOT", home / ".cache" / "vllm")),
               "inductor_cache_files": Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", f"/tmp/torchinductor_{_user()}"))}
    return {key: sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
            for key, folder in folders.items()}


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (ImportError, KeyError, OSError):
        return "root"


def numbered_tokenizer(vocab_size: int):
    """Token i is the word "t<i>" (0 and 1: pad and eos): any token id of a random model decodes, and prompts
    encode exactly; special tokens are no prefix of a word (a tokenizer matches them inside words)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    from barerl.tokenizer import Tokenizer

    vocab = {"<pad>": 0, "</s>": 1} | {f"t{i}": i for i in range(2, vocab_size)}
    backend = Backend(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return Tokenizer(backend, special_tokens={"eos_token": "</s>", "pad_token": "<pad>"}, source="bench",
                     add_bos_token=False, add_eos_token=False)


def prompt_rows(vocab_size: int, count: int, length: int, seed: int = 0) -> list[dict]:
    """`count` prompts of `length` random words of the numbered tokenizer (one token each)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"prompt": " ".join(f"t{i}" for i in rng.integers(2, vocab_size, length))} for _ in range(count)]


def cheap_reward(prompts, completions, **_) -> list[float]:
    """A deterministic reward that varies across samples (so advantages are not all zero)."""
    return [zlib.crc32(c.encode()) % 100 / 100 for c in completions]


def timed_runs(make_prompts, generate, count: int, label: str) -> list[float]:
    """New tokens/s of `count` timed generations: prompts = make_prompts(i) (untimed), generate(prompts) -> the
    number of new tokens."""
    rates = []
    for trial in range(count):
        prompts = make_prompts(trial)
        begin = time.perf_counter()
        tokens = generate(prompts)
        seconds = time.perf_counter() - begin
        rates.append(tokens / seconds)
        print(f"{label}, timed run {trial + 1}: {rates[-1]:.0f} new tok/s ({seconds:.3f} s)", flush=True)
    return rates


class DeviceMemory:
    """Peak device memory of this process by a sampling thread (see the module docstring); None without a GPU."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self._read = _used_memory_reader()
        self.baseline = self._read() if self._read else None
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> DeviceMemory:
        if self._read:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._read())

    def reset_peak(self) -> None:
        """Start a new high-water mark from the current reading (the baseline stays the process's)."""
        if self._read:
            self.peak = self._read()

    def peak_gib(self) -> float | None:
        if self.baseline is None:
            return None
        self.peak = max(self.peak, self._read())
        return (self.peak - self.baseline) / 2**30


def _used_memory_reader():
    """A function returning the device's used bytes: NVML (no CUDA context needed), else libcudart."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]))
        return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except Exception:  # noqa: BLE001 (no NVML, no GPU, no driver: no reading)
        return None


def ceilings(library: str) -> dict:
    """The machine's two ceilings, measured through `library` ("torch" or "cupy", the one the system under test
    already holds, so no second CUDA context is made): bf16 TFLOP/s of an 8192^3 product and the TB/s of a
    1 GiB device-to-device copy (bytes read + written), each the median of 10 after 3 warm-ups; {} on a CPU."""
    ops = _torch_ops() if library == "torch" else _cupy_ops()
    if ops is None:
        return {}
    random_bf16, filled, copy_into, elapsed = ops
    a, b = random_bf16(8192), random_bf16(8192)
    src, dst = filled(1 << 29), filled(1 << 29)  # 512 MiB each: 1 GiB moved per copy
    matmul = _median(lambda: elapsed(lambda: a @ b))
    copy = _median(lambda: elapsed(lambda: copy_into(dst, src)))
    return {"matmul_tflops": 2 * 8192**3 / matmul / 1e12, "copy_tbs": 2 * src.nbytes / copy / 1e12}


def _median(run) -> float:
    times = sorted(run() for _ in range(13))[3:]
    return times[len(times) // 2]


def _torch_ops():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def elapsed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return (lambda n: torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
            lambda nbytes: torch.ones(nbytes, device="cuda", dtype=torch.uint8), lambda d, s: d.copy_(s), elapsed)


def _cupy_ops():
    try:
        import cupy as cp
        import ml_dtypes
        import numpy as np

        cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 (no CuPy or no GPU)
        return None
    rng = np.random.default_rng(0)

    def elapsed(fn) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    def copy_into(dst, src):
        dst[...] = src
    return (lambda n: cp.asarray(rng.standard_normal((n, n), np.float32).astype(ml_dtypes.bfloat16)),
            lambda nbytes: cp.ones(nbytes, cp.uint8), copy_into, elapsed)


def host_link_gbs(size_gib: int = 2) -> float | None:
    """GB/s each way of pinned host <-> GPU copies running both ways at once (what the streamed optimizer step
    does), the median of 5 after one; None without CuPy and a GPU."""
    if _cupy_ops() is None:
        return None
    import cupy as cp
    import cupyx
    import numpy as np

    n, rt = size_gib << 30, cp.cuda.runtime
    host_up, host_down = cupyx.empty_pinned(n, np.uint8), cupyx.empty_pinned(n, np.uint8)
    device_up, device_down = cp.empty(n, np.uint8), cp.zeros(n, np.uint8)
    up, down, times = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True), []
    for _ in range(6):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        rt.memcpyAsync(device_up.data.ptr, host_up.ctypes.data, n, rt.memcpyHostToDevice, up.ptr)
        rt.memcpyAsync(host_down.ctypes.data, device_down.data.ptr, n, rt.memcpyDeviceToHost, down.ptr)
        up.synchronize()
        down.synchronize()
        times.append(time.perf_counter() - start)
    return n / sorted(times[1:])[2] / 1e9


def versions(*names: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def command_line() -> str:
    """How this script was started, its path from the repository root (the same line on every machine)."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parent.parent
    shown = script.relative_to(root) if script.is_relative_to(root) else script
    return " ".join(["python", str(shown), *sys.argv[1:]])


def write_record(out: str | None, name: str, workload: str, system: str, label: str, settings: dict, metrics: dict,
                 packages: tuple[str, ...] = ()) -> dict:
    """One JSON record of one system's run, `<out>/<workload>-<name>.json` (what `run_all.py` reads); also
    printed as one `RECORD {...}` line, so a log alone keeps the figures. `label`: the setting in a few words."""
    record = {"workload": workload, "name": name, "system": system, "label": label, "settings": settings,
              "metrics": metrics,
              "date": date.today().isoformat(), "command": command_line(),
              "versions": versions("numpy", "cupy-cuda13x", "cupy-cuda12x", *packages)}
    print("RECORD " + json.dumps(record), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{workload}-{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def write_failure(out: str | None, name: str, workload: str, system: str, label: str, settings: dict,
                  error: BaseException, started: bool, metrics: dict, packages: tuple[str, ...] = ()) -> dict:
    """A run that did not fit or did not finish, recorded as such: `status` ("did not fit" for an out-of-memory
    error or a refused memory plan; else "could not start", or "failed" once `started`), the error's message
    and what was measured up to there. The stage goes on, and the report shows why a figure is missing."""
    kinds = {c.__name__ for c in type(error).__mro__}
    message = f"{type(error).__name__}: {error}"
    out_of_memory = any("OutOfMemory" in k for k in kinds) or "MemoryPlanError" in kinds or any(
        words in message.lower() for words in ("out of memory", "no available memory", "available kv cache memory"))
    status = "did not fit" if out_of_memory else "failed" if started else "could not start"
    print(f"{workload} {system}, {label}: {status}: {message.splitlines()[0][:300]}", flush=True)
    return write_record(out, name, workload, system, label, settings,
                        {"status": status, "error": message[:2000], **metrics}, packages)
