"""The CUDA backend: the reference ops' names and signatures, run by our kernels and cuBLAS on CuPy arrays.

Every op of `backend.ref` is importable from here; ops without a kernel yet run the reference code itself on
CuPy arrays (it is xp-generic), and each line below replaces one op family with its launchers. Kernels
compile on first use, so importing this module needs CuPy but no compiler work.
"""

from barerl.backend.ref import *
from barerl.kernels.adamw import adamw_step, grad_norm  # noqa: F401
from barerl.kernels.advance_decode import advance_decode  # noqa: F401
from barerl.kernels.cublaslt import set_batch_invariant  # noqa: F401
from barerl.kernels.dropout import dropout, dropout_backward  # noqa: F401
from barerl.kernels.embedding import embedding, embedding_backward  # noqa: F401
from barerl.kernels.flash_attention import (  # noqa: F401
    attention,
    attention_backward,
    paged_attention_invariant,
)
from barerl.kernels.kv_cache import store_kv  # noqa: F401
from barerl.kernels.linear import linear, linear_backward, lm_head_logits  # noqa: F401
from barerl.kernels.lm_head import lm_head_backward, lm_head_forward_backward, lm_head_logprobs  # noqa: F401
from barerl.kernels.paged_attention import paged_attention  # noqa: F401
from barerl.kernels.qk_norm_rope import (  # noqa: F401
    qk_norm_rope,
    qk_norm_rope_backward,
    qk_norm_rope_store,
)
from barerl.kernels.rmsnorm import rmsnorm, rmsnorm_backward  # noqa: F401
from barerl.kernels.sampling import sample  # noqa: F401
from barerl.kernels.swiglu import swiglu, swiglu_backward  # noqa: F401
