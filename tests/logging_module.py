"""A module that gives its logger a handler as it is imported: module state, which a warm call leaves in
place for the next call (test_warm)."""

import logging

logging.getLogger("leaks.module").addHandler(logging.NullHandler())
