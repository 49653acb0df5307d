"""``python -m parsl_torch.cli``: the same as the ``parsl-torch`` command."""

import sys

from .commands import main

sys.exit(main())
