"""The reference backend: the living definition of every op, forward and backward.

Each function is written against an array namespace (`xp`): given NumPy arrays it runs on the CPU, given CuPy
arrays it runs unchanged on the GPU, where it is the oracle of the CUDA kernels. Every public name here has a
twin of the same name and signature in `barerl.ops.cuda`; each module holds one family of ops, and the family's
kernel is `ops/cuda/csrc/<family>.cu`, its launcher `ops/cuda/<family>.py`, its test `tests/ops/test_<family>.py`.

Conventions, shared with the kernels:
- Activations are (tokens, features), packed: sequences are concatenated and `cu_seqlens` (int32, (S+1,))
  marks their boundaries; `positions` (int32, (T,)) gives each token's position in its sequence.
- Arithmetic is fp32 whatever the storage dtype (bf16/fp16/fp32); outputs are cast back to the activation
  dtype, except statistics (rstd, lse, log-probs), which stay fp32.
- Weight gradients are accumulated: `*_backward` adds into the `dw`/`db` arrays it is given (the caller zeroes
  them once per optimizer step), and returns the gradient of its input.
- Linear weights are stored as Hugging Face does: (out_features, in_features), so y = x @ w.T.
- `batch_invariant` (products and decode attention): the CUDA twins then compute a row's numbers the same way
  whatever else is in the batch. The reference takes the keyword and ignores it: it has no algorithm to choose.
"""

from barerl.ops.common import xp_of  # noqa: F401
from barerl.ops.ref.adamw import *
from barerl.ops.ref.advance_decode import *
from barerl.ops.ref.attention import *
from barerl.ops.ref.dropout import *
from barerl.ops.ref.embedding import *
from barerl.ops.ref.kv_cache import *
from barerl.ops.ref.linear import *
from barerl.ops.ref.lm_head import *
from barerl.ops.ref.paged_attention import *
from barerl.ops.ref.qk_norm_rope import *
from barerl.ops.ref.rmsnorm import *
from barerl.ops.ref.sampling import *
from barerl.ops.ref.swiglu import *
