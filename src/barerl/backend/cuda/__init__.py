"""The CUDA backend: the reference ops' names and signatures, run by our kernels and cuBLAS on CuPy arrays.

Every op of `backend.ref` is importable from here; ops without a kernel yet run the reference code itself on
CuPy arrays (it is xp-generic), and each line below replaces one op family with its launchers. Kernels
compile on first use, so importing this module needs CuPy but no compiler work.
"""

from barerl.backend.ref import *
from barerl.kernels.linear import linear, linear_backward, lm_head_logits  # noqa: F401
