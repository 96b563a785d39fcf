"""CPU CI check: every kernel source compiles with nvcc for sm_80 and sm_90, for each storage dtype.

Runs without a GPU (nvcc only), so a syntax error in a .cu file cannot land. Skipped where nvcc is absent.
"""

from __future__ import annotations

import shutil

import pytest

from barerl.kernels.build import CSRC, nvcc_compile_check

SOURCES = sorted(p.name for p in CSRC.glob("*.cu"))
DTYPES = ["__nv_bfloat16", "__half", "float"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("cu_file", SOURCES)
def test_compiles(cu_file: str, arch: int) -> None:
    for dtype in DTYPES:
        nvcc_compile_check(cu_file, arch, {"DTYPE": dtype})
