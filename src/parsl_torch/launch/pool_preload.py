"""What the worker pool's forkserver imports before it forks the pool's manager and workers
(``launch.pool``), lean (``launch.leanparsl``): Parsl whole (as ``import parsl`` leaves a process,
the optional packages aside), its worker pool module, and the module of the bash app's remote side,
which each worker unpickles with a stage's task: imported here once, not once per worker."""

from .leanparsl import import_lean
from .pool import POOL_MODULE

#: what a worker unpickles with each stage (Parsl's bash app runs it)
BASH_APP_MODULE = "parsl.app.bash"

import_lean("parsl", POOL_MODULE, BASH_APP_MODULE, hollow=False)
