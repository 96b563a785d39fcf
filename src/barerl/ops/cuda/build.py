"""Compile the CUDA C++ kernels of `csrc/` at run time through NVRTC (CuPy); in-process and disk caches.

Design decisions:
- Kernels compile on first use, never at import: `load_kernel` is called by each launcher when it first runs.
- One `.cu` file holds one op family; its element type comes in as a macro (`-DDTYPE=__nv_bfloat16`, see
  `ctype`), so each dtype is its own compiled module. Other compile-time knobs come in the same way.
- `#include "x.cuh"` lines naming files of `csrc/` are inlined before compiling, so CuPy's disk cache (keyed
  by source text + options) sees header edits too; the `-I` option is still passed for anything else.
- A compile error raises `KernelBuildError` carrying the NVRTC log and the `.cu` path.
- `nvcc_compile_check` compiles the same source with nvcc (the CPU CI test uses it: no GPU needed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

CSRC = Path(__file__).parent / "csrc"
CACHE_DIR = Path(os.environ.get("BARERL_CACHE_DIR", Path.home() / ".cache" / "barerl"))
os.environ.setdefault("CUPY_CACHE_DIR", str(CACHE_DIR / "cupy"))

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
_modules: dict[tuple, object] = {}
_kernels: dict[tuple, object] = {}


class KernelBuildError(RuntimeError):
    """A kernel failed to compile; the message holds the compiler log and the `.cu` path."""


def ctype(dtype) -> str:
    """The CUDA C++ type name of a NumPy/ml_dtypes dtype (the value of the `DTYPE` macro)."""
    name = np.dtype(dtype).name
    names = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
    if name not in names:
        raise TypeError(f"no CUDA kernel dtype for {name}; expected one of {sorted(names)}")
    return names[name]


def _source(path: Path, seen: set[Path] | None = None) -> str:
    """The text of `path` with `#include "..."` of csrc headers inlined (each header once)."""
    seen = set() if seen is None else seen

    def inline(match: re.Match) -> str:
        header = (path.parent / match.group(1)).resolve()
        if not header.exists():
            return match.group(0)
        if header in seen:
            return ""
        seen.add(header)
        return _source(header, seen)

    return _INCLUDE.sub(inline, path.read_text())


def _cu_path(cu_file: str) -> Path:
    path = Path(cu_file) if os.path.isabs(cu_file) else CSRC / cu_file
    if not path.exists():
        raise FileNotFoundError(f"kernel source {path} does not exist")
    return path


def _define_options(defines: dict | None) -> tuple[str, ...]:
    return tuple(f"-D{k}={v}" for k, v in sorted((defines or {}).items()))


def compute_capability() -> str:
    import cupy

    return str(cupy.cuda.Device().compute_capability)


def load_module(cu_file: str, defines: dict | None = None):
    """The compiled `cupy.RawModule` of one `.cu` file with these macro definitions (cached)."""
    import cupy

    cc = compute_capability()
    key = (cu_file, tuple(sorted((defines or {}).items())), cc)
    module = _modules.get(key)
    if module is None:
        path = _cu_path(cu_file)
        options = ("--std=c++17", f"-arch=sm_{cc}", f"-I{CSRC}", *_define_options(defines))
        try:
            module = cupy.RawModule(code=_source(path), options=options)
            module.compile()
        except cupy.cuda.compiler.CompileException as e:
            raise KernelBuildError(f"compiling {path} with {options} failed:\n{e.get_message()}") from None
        _modules[key] = module
    return module


def load_kernel(cu_file: str, kernel_name: str, defines: dict | None = None):
    """The `cupy.RawKernel` named `kernel_name` (an `extern "C"` function) of `csrc/<cu_file>`."""
    import cupy

    key = (cu_file, kernel_name, tuple(sorted((defines or {}).items())))
    kernel = _kernels.get(key)
    if kernel is None:
        module = load_module(cu_file, defines)
        try:
            kernel = module.get_function(kernel_name)
        except cupy.cuda.driver.CUDADriverError as e:
            raise KernelBuildError(f"{_cu_path(cu_file)} has no kernel {kernel_name!r}: {e}") from None
        _kernels[key] = kernel
    return kernel


def nvcc_compile_check(cu_file: str, arch: str | int, defines: dict | None = None, ptxas_report: bool = False) -> str:
    """Compile `cu_file` with nvcc for sm_<arch> (to a cubin that is thrown away); raise on error. Returns the
    compiler's messages: with `ptxas_report`, each kernel's registers, stack and spills (-Xptxas -v)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    path = _cu_path(cu_file)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            nvcc,
            "--std=c++17",
            f"-arch=sm_{arch}",
            f"-I{CSRC}",
            *_define_options(defines),
            *(("-Xptxas", "-v") if ptxas_report else ()),
            "-cubin",
            "-o",
            os.path.join(tmp, "out.cubin"),
            str(path),
        ]
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise KernelBuildError(f"nvcc failed on {path} (sm_{arch}):\n{result.stderr}{result.stdout}")
    return result.stderr + result.stdout
