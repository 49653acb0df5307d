"""The remote route: a stage through Globus Compute, as one task on an endpoint's MPI engine.

``client`` (where the workflow runs): packs a ``StageCall`` into a ``RemoteJob`` and submits it;
``job`` (on the endpoint): completes the call's identity there, skips it or launches its ranks
as a cold stage's worker does, and answers. Kept light: the endpoint imports this package.
"""
