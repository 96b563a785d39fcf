"""CPU CI check: every kernel source compiles with nvcc for sm_80 and sm_90, for each storage dtype.

Runs without a GPU (nvcc only), so a syntax error in a .cu file cannot land. Skipped where nvcc is absent.
sm_90 builds every storage dtype; sm_80 builds bf16 only (enough to catch Hopper-only code), compiles run
in parallel to keep CI short. A source limited to some dtypes says so in a line `// Dtypes: <names>`.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from barerl.kernels.build import CSRC, nvcc_compile_check

SOURCES = sorted(p.name for p in CSRC.glob("*.cu"))
DTYPES = ["__nv_bfloat16", "__half", "float"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("cu_file", SOURCES)
def test_compiles(cu_file: str, arch: int) -> None:
    declared = re.search(r"^// Dtypes: (.+)$", (CSRC / cu_file).read_text(), re.MULTILINE)
    dtypes = declared.group(1).split() if declared else DTYPES
    dtypes = dtypes if arch == 90 else dtypes[:1]
    with ThreadPoolExecutor(len(dtypes)) as pool:
        list(pool.map(lambda dtype: nvcc_compile_check(cu_file, arch, {"DTYPE": dtype}), dtypes))
