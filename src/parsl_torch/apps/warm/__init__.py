"""The warm route: ``pt.workflow(warm=True)`` runs function stages in ranks that are already up.

``groups`` (in the workflow process): a warm stage's Parsl app hands its ``StageCall`` to a
group of ranks of its shape, started as a cold stage's are; ``rank`` (each rank of a group): a
prepared parent that runs every call in a fresh fork of itself. Kept light: the ranks import this package.
"""
