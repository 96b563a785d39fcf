"""The CUDA backend: the reference ops' names and signatures, run by our kernels and cuBLASLt on CuPy arrays.

Every op of `ops.ref` is importable from here; ops without a kernel run the reference code itself on CuPy
arrays (it is xp-generic: the LM head under a truncating sampling filter, the sampler's log-prob twin), and
each line below replaces one op family with its launchers. Kernels compile on first use, so importing this
module needs CuPy but no compiler work.
"""

from barerl.ops.ref import *  # the ops without a kernel; the lines below replace the rest

# isort: split
from barerl.ops.cuda.adamw import adamw_step, grad_norm  # noqa: F401
from barerl.ops.cuda.advance_decode import advance_decode  # noqa: F401
from barerl.ops.cuda.attention import attention, attention_backward  # noqa: F401
from barerl.ops.cuda.dropout import dropout, dropout_backward  # noqa: F401
from barerl.ops.cuda.embedding import embedding, embedding_backward  # noqa: F401
from barerl.ops.cuda.kv_cache import store_kv  # noqa: F401
from barerl.ops.cuda.linear import defer_decode_tuning, linear, linear_backward  # noqa: F401
from barerl.ops.cuda.lm_head import (  # noqa: F401
    lm_head_backward,
    lm_head_forward_backward,
    lm_head_logits,
    lm_head_logprobs,
)
from barerl.ops.cuda.paged_attention import paged_attention  # noqa: F401
from barerl.ops.cuda.qk_norm_rope import qk_norm_rope, qk_norm_rope_backward, qk_norm_rope_store  # noqa: F401
from barerl.ops.cuda.rmsnorm import rmsnorm, rmsnorm_backward  # noqa: F401
from barerl.ops.cuda.sampling import sample  # noqa: F401
from barerl.ops.cuda.swiglu import swiglu, swiglu_backward  # noqa: F401
