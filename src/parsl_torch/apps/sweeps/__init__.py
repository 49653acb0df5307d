"""Sweeps (layer 4, the workflow process): many trials of one stage, judged at their rungs.

Owns: the rule (``asha``: pure, no files), the space and the sampler (``space``, ``sample``), the journal
that survives the workflow (``journal``: every decision with the call it was made on), the trials' files
here or through an I/O endpoint (``trialfiles``), the watch that judges each trial at its rungs and leaves
the ruling for its rank 0 (``watch``), and what a user sees (``view``). Its one decision: a trial at a rung
goes on or stops (``Asha.judge``), made once per trial and rung and replayed from the journal on a rerun.
Its adapter to Parsl: none of its own; ``stages.sweep`` submits the trials as stage calls.
"""
