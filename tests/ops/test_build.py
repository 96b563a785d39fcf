"""CPU CI check: every kernel source compiles with nvcc for sm_80 and sm_90, for each storage dtype.

Runs without a GPU (nvcc only), so a syntax error in a .cu file cannot land. Skipped where nvcc is absent.
sm_90 builds every storage dtype; sm_80 builds bf16 only (enough to catch Hopper-only code), compiles run
in parallel to keep CI short. A source limited to some dtypes says so in a line `// Dtypes: <names>`.
paged_attention.cu also builds in every pipeline shape (UNROLL, STAGES) a GPU A/B may set, and refuses one
whose shared-memory ring does not fit, by its own message; and its decode kernel does not spill registers at
any query-head group of 1-8 (ptxas's report).
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_paged_attention import PIPELINES

from barerl.ops.cuda.build import CSRC, KernelBuildError, nvcc_compile_check

SOURCES = sorted(p.name for p in CSRC.glob("*.cu"))
DTYPES = ["__nv_bfloat16", "__half", "float"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("cu_file", SOURCES)
def test_compiles(cu_file: str, arch: int) -> None:
    declared = re.search(r"^// Dtypes: (.+)$", (CSRC / cu_file).read_text(), re.MULTILINE)
    dtypes = declared.group(1).split() if declared else DTYPES
    dtypes = dtypes if arch == 90 else dtypes[:1]
    with ThreadPoolExecutor(len(dtypes)) as pool:
        list(pool.map(lambda dtype: nvcc_compile_check(cu_file, arch, {"DTYPE": dtype}), dtypes))


@needs_nvcc
@pytest.mark.parametrize("unroll,stages", PIPELINES)
def test_paged_attention_pipelines_compile(unroll: int, stages: int) -> None:
    """G1's bf16 head_dim 128, and fp32 head_dim 16 with 4 query heads per kv head (test_paged_attention's
    smallest heads: 32 token groups, larger merge buffers)."""
    shapes = [{"DTYPE": "__nv_bfloat16"}, {"DTYPE": "float", "HEAD_DIM": 16, "GROUP": 4}]
    with ThreadPoolExecutor(len(shapes)) as pool:
        list(pool.map(lambda shape: nvcc_compile_check("paged_attention.cu", 90,
                                                       {**shape, "UNROLL": unroll, "STAGES": stages}), shapes))


def spill_bytes(report: str, kernel: str) -> int:
    """Bytes of spill stores ptxas reports for `kernel` (its -v lines: 'Compiling entry function', then stack and
    spills)."""
    after = report.split(f"Compiling entry function '{kernel}'")[1]
    return int(re.search(r"(\d+) bytes spill stores", after).group(1))


@needs_nvcc
def test_paged_attention_does_not_spill_at_the_models_query_groups() -> None:
    """The launch bounds leave a thread registers for its q and P @ V rows (bf16, the most registers) at 2, 4
    and 8 query heads per kv head (Qwen3-0.6B / 1.7B, -4B / -8B, the largest group served without spills).
    G1's tuned GROUP 2 spills 4 bytes, as measured when it was tuned."""
    groups = (2, 4, 8)

    def spills(group: int) -> int:
        defines = {"DTYPE": "__nv_bfloat16", "GROUP": group}
        return spill_bytes(nvcc_compile_check("paged_attention.cu", 90, defines, ptxas_report=True),
                           "paged_attention_split")

    with ThreadPoolExecutor(len(groups)) as pool:
        found = dict(zip(groups, pool.map(spills, groups)))
    assert all(found[g] <= 8 for g in found), found


@needs_nvcc
def test_paged_attention_ring_past_static_shared_memory_is_refused() -> None:
    with pytest.raises(KernelBuildError, match="exceed 48 KB of static shared memory"):
        nvcc_compile_check("paged_attention.cu", 90, {"DTYPE": "__nv_bfloat16", "UNROLL": 4, "STAGES": 3})
