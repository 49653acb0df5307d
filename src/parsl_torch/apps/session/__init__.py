"""The workflow session (layer 4, the workflow process): ``pt.workflow`` from its start to its end.

Owns: the request (``request``: sites, run directory, flags of ``parsl-torch run``) and where each stage
runs (``placement``), the run directory and its lock (``rundir``), Parsl loaded for the session and ended
with it (``workflow``), the signals that end it cleanly (``signals``), the watchdog that ends what it
started if its process dies (``watchdog``), and what a user reads of it (``status``, ``report``). Its one
decision: where a stage call runs (``Placement``). Its adapter to Parsl: ``workflow`` loads the sites'
``parsl.Config`` with the stage memoizer (``identity.memo``) and cleans Parsl up however the script ends.
"""
