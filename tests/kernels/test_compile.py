"""CPU CI check: every kernel source compiles with nvcc for sm_80 and sm_90, for each storage dtype.

Runs without a GPU (nvcc only), so a syntax error in a .cu file cannot land. Skipped where nvcc is absent.
sm_90 builds every storage dtype; sm_80 builds bf16 only (enough to catch Hopper-only code), compiles run
in parallel to keep CI short. A source limited to some dtypes says so in a line `// Dtypes: <names>`; one
whose code changes with another macro names the values to build too in `// Also built with: NAME=VALUE ...`
(each with the first dtype, on both archs).
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
    builds = [{"DTYPE": dtype} for dtype in (dtypes if arch == 90 else dtypes[:1])]
    extra = re.search(r"^// Also built with: (.+)$", (CSRC / cu_file).read_text(), re.MULTILINE)
    for define in extra.group(1).split() if extra else []:
        name, value = define.split("=")
        builds.append({"DTYPE": dtypes[0], name: value})
    with ThreadPoolExecutor(len(builds)) as pool:
        list(pool.map(lambda defines: nvcc_compile_check(cu_file, arch, defines), builds))
