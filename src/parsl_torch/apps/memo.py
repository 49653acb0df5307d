"""Teach Parsl's memoizer to hash the package's types (it refuses unknown
ones): Files by URL, shipped functions by name, stage options by value."""

from __future__ import annotations

import functools
import pickle

from .payload import ShippedFunction, StageOptions


@functools.lru_cache(maxsize=1)
def register_memo_ids() -> None:
    """Register once per process (Parsl's ``id_for_memo`` is a singledispatch)."""
    from parsl.data_provider.files import File
    from parsl.dataflow.memoization import id_for_memo

    @id_for_memo.register(File)
    def _file(obj: File, output_ref: bool = False) -> bytes:
        return pickle.dumps(("File", obj.url))

    @id_for_memo.register(ShippedFunction)
    def _fn(obj: ShippedFunction, output_ref: bool = False) -> bytes:
        return pickle.dumps(("ShippedFunction", obj.name))  # like Parsl: by name, not by code

    @id_for_memo.register(StageOptions)
    def _opts(obj: StageOptions, output_ref: bool = False) -> bytes:
        return pickle.dumps(("StageOptions", obj.stage_dir, obj.num_nodes, obj.ranks_per_node, obj.env,
                             obj.launcher_args))
