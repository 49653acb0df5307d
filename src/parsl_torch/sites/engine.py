"""A Globus Compute endpoint's own engine, started here without the web service.

The endpoint config a site renders (``sites.endpoint``) is read by the endpoint's
own loader (``globus_compute_endpoint``'s ``load_config_yaml``), its engine
(``GlobusMPIEngine`` over the site's provider) is started for real, and tasks go
in and come out as the SDK and the endpoint exchange them: the function and its
arguments serialized with the SDK's ``ComputeSerializer`` and packed in a
``Task`` message, the answer a ``Result`` message unpacked as the SDK does (an
error result raises the SDK's ``TaskExecutionFailed``). Only the service's hop
(AMQP queues, the web API) is left out. ``parsl-torch endpoint test SITE`` and
the tests run stages through it; ``executor()`` stands in for
``globus_compute_sdk.Executor`` inside Parsl's ``GlobusComputeExecutor``.

Needs ``pip install globus-compute-endpoint`` (it requires a newer Parsl than
parsl-torch does).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def _require_endpoint() -> None:
    try:
        import globus_compute_endpoint  # noqa: F401
    except ImportError:
        raise ConfigError("the endpoint's engine is not installed here: pip install globus-compute-endpoint "
                          "(the version your endpoint runs)") from None


class LocalEndpoint:
    """The engine of an endpoint config (a mapping, as ``sites.endpoint.endpoint_config`` gives it),
    started in ``run_dir``; a context manager that shuts it down."""

    def __init__(self, config: Mapping[str, Any], run_dir: str | os.PathLike) -> None:
        _require_endpoint()
        import yaml
        from globus_compute_endpoint.endpoint.config.utils import load_config_yaml

        loaded = load_config_yaml(yaml.safe_dump(dict(config)))
        if getattr(loaded, "engine", None) is None:
            raise ConfigError("the endpoint config has no engine: render it with parsl-torch sites endpoint-config")
        self.engine = loaded.engine
        self.endpoint_id = str(uuid.uuid4())
        self.run_dir = Path(run_dir)
        self._started = False

    def start(self) -> LocalEndpoint:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.engine.start(endpoint_id=self.endpoint_id, run_dir=str(self.run_dir))
        self._started = True
        return self

    def shutdown(self) -> None:
        if self._started:
            self._started = False
            self.engine.shutdown(block=True)

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def executor(self) -> Any:
        """A ``globus_compute_sdk.Executor`` for Parsl's GlobusComputeExecutor whose tasks go to this engine."""
        return _engine_executor_class()(self)

    def submit(self, fn: Any, *args: Any, resource_specification: Mapping[str, Any] | None = None,
               **kwargs: Any) -> Future:
        """``fn(*args, **kwargs)`` on the engine; a future of its result (``TaskExecutionFailed`` on error)."""
        from globus_compute_common import messagepack
        from globus_compute_endpoint.engines.base import GCFuture
        from globus_compute_sdk.serialize import ComputeSerializer

        serde = ComputeSerializer()
        task_id = uuid.uuid4()
        body = serde.pack_buffers([serde.serialize(fn), serde.serialize(args), serde.serialize(kwargs)])
        packed = messagepack.pack(messagepack.message_types.Task(task_id=task_id, task_buffer=body))
        engine_future = GCFuture(task_id)
        outer: Future = Future()
        engine_future.add_done_callback(lambda f: _deliver(f, outer, serde))
        self.engine.submit(engine_future, packed, resource_specification=dict(resource_specification or {}))
        return outer


def _deliver(engine_future: Future, outer: Future, serde: Any) -> None:
    """The engine's packed Result, unpacked as the SDK does."""
    from globus_compute_common import messagepack
    from globus_compute_sdk.errors import TaskExecutionFailed

    try:
        result = messagepack.unpack(engine_future.result())
        if result.is_error:
            outer.set_exception(TaskExecutionFailed(result.data))
        else:
            outer.set_result(serde.deserialize(result.data))
    except BaseException as exc:  # noqa: BLE001 - whatever failed belongs to the task's future
        outer.set_exception(exc)


def _engine_executor_class() -> type:
    from globus_compute_sdk import Executor

    class EngineExecutor(Executor):
        """Parsl's GlobusComputeExecutor checks for a ``globus_compute_sdk.Executor`` and sets
        ``resource_specification`` / ``user_endpoint_config`` before each ``submit``; the SDK's
        own would send the task to the web service, this one hands it to the local engine."""

        resource_specification = None  # plain attributes shadow the SDK Executor's properties
        user_endpoint_config = None
        endpoint_id = None

        def __init__(self, endpoint: LocalEndpoint) -> None:  # noqa: D107 - the SDK's __init__ would log in
            self._endpoint = endpoint
            self.endpoint_id = endpoint.endpoint_id
            self.resource_specification: dict | None = None
            self.user_endpoint_config: dict | None = None
            self.label = f"local-engine-{endpoint.endpoint_id[:8]}"

        def submit(self, fn, /, *args, **kwargs):
            return self._endpoint.submit(fn, *args, resource_specification=self.resource_specification, **kwargs)

        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            pass  # the engine is the LocalEndpoint's to stop

        def _get_result_watcher(self):  # Parsl stops it at shutdown: nothing to stop here
            return self

        def __del__(self) -> None:
            pass

        def __repr__(self) -> str:
            return f"EngineExecutor(endpoint_id={self.endpoint_id})"

    return EngineExecutor
