"""Layer 4, the workflow process: Parsl apps that launch distributed torch
tasks (``distributed_app``, ``script_app``), ``pt.workflow`` (a site's
``parsl.Config`` with memoization under a run directory), what a rank of an
app runs (``stage_main``), Globus Compute submission (``remote``) and run
reports. Imports ``sites``, ``launch``, ``history``, ``core``, ``common``.

(Named ``apps``, not ``workflow``: a subpackage ``parsl_torch.workflow``
would shadow the public function ``pt.workflow`` once imported.)
"""
