"""What the worker pool's forkserver imports before it forks the pool's manager and workers
(``launch.pool``): Parsl's worker pool module, imported lean (``launch.leanparsl``)."""

from .leanparsl import import_lean
from .pool import POOL_MODULE

import_lean(POOL_MODULE)
