"""`python -m barerl`: the `barerl` command (e.g. `mpirun -n 4 python -m barerl grpo ...`)."""

import sys

from barerl.cli import main

sys.exit(main())
