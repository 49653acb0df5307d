"""Layer 4, the workflow process: Parsl apps that launch distributed torch tasks, grouped by concept.

``session/`` (``pt.workflow``: request, placement, run directory, signals, watchdog, status, report),
``stage/`` (one stage call: its app, record and options, the cold route, the rank's entry, its future,
continuations, settling), ``identity/`` (reruns: a call's identity, the one skip gate, new computation or
continuation), ``sweeps/``, ``warm/`` and ``remote/`` (the warm and Globus Compute routes). Each package's
docstring states what it owns, its one decision and its adapter to Parsl. Imports ``sites``, ``launch``,
``history``, ``core``, ``common``.

(Named ``apps``, not ``workflow``: a subpackage ``parsl_torch.workflow``
would shadow the public function ``pt.workflow`` once imported.)
"""
