"""Several processes, one per GPU, started by an MPI launcher (`mpirun -n N barerl grpo ...`, `srun barerl
grpo ...`): data-parallel SFT and GRPO whose steps equal one process's on the same global batch.

- `group.py`: the job's processes (rank, size, local rank from MPI; one process alone without a launcher),
  host-side collectives, and the watch that ends the job when a rank is dead or hung.
- `communicator.py`: one exchange primitive, over MPI (NumPy arrays) or NCCL (CuPy arrays).
- `layout.py`, `collectives.py`, `norm.py`: shards, buckets and the fixed summation tree; bucketed
  reduce-scatter and all-gather; the gradient norm whose bits do not depend on the sharding.
- `data_parallel.py`: what the training loops call (their share of a step, the gradient sum, the sharded
  optimizer step, checkpoints); `rollouts.py`: GRPO's generation shared by the ranks.
"""

from barerl.distributed.data_parallel import DataParallel
from barerl.distributed.group import ProcessGroup, process_group

__all__ = ["DataParallel", "ProcessGroup", "process_group"]
