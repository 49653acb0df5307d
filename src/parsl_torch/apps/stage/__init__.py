"""The stage call (layer 4; the workflow process, the worker, the ranks): one call of a distributed app.

Owns: the app (``app``: ``distributed_app``, ``script_app``, the checks at the call), the call's record and
options (``call``, ``options``), a script's arguments (``scriptargs``), the cold route (``cold``: the
worker's bash app that makes the directory the attempt's and returns the launch command), the rank's entry
(``main``; ``rankmain``: the workflow script's definitions as the rank's ``__main__``), the future and its
error (``futures``, ``failures``), continuations in the next block (``continuation``), and settling a task
from its supervisor's record when Parsl's answer cannot come (``settle``). Its one decision: which route a
call takes (cold, warm or remote: ``app``). Its adapters to Parsl: a bash app per executor (``cold``), the
retry handler (``continuation``), the executor's ``settle`` (``settle``).
"""
