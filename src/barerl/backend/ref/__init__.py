"""The reference backend: NumPy on the CPU, the same code on CuPy arrays as the GPU oracle.

Every name exported here has a twin with the same signature in `barerl.backend.cuda`. Each module holds
one family of ops; add a module's line below when it gains public ops.
"""

from barerl.backend.ref.dropout import *
from barerl.backend.ref.nn import *
from barerl.backend.ref.optim import *
from barerl.backend.ref.sampling import *
