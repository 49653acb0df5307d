"""A Globus Compute endpoint's own engine, run here without the web service.

The endpoint config a site renders (``sites.endpoint``) is read by the endpoint's
own loader (``globus_compute_endpoint``'s ``load_config_yaml``), its engine
(``GlobusMPIEngine`` over the site's provider) is started for real, and tasks go
in and come out as the SDK and the endpoint exchange them: the function and its
arguments serialized with the SDK's ``ComputeSerializer`` and packed in a
``Task`` message, the answer a ``Result`` message unpacked as the SDK does (an
error result raises the SDK's ``TaskExecutionFailed``). Only the service's hop
(AMQP queues, the web API) is replaced: by a Unix socket to the engine's process.

The engine runs in a process of its own, as on an endpoint (``python -m
parsl_torch.sites.engine``): detached from the process that starts it, whose
workflows end everything they start (a block started from a workflow's process
would end with that workflow), without a workflow's token, and it shuts its
engine down when its starter closes the connection or dies.

``parsl-torch endpoint test SITE`` and the tests run stages through it;
``executor()`` stands in for ``globus_compute_sdk.Executor`` inside Parsl's
``GlobusComputeExecutor``. Needs ``pip install globus-compute-endpoint`` (it
requires a newer Parsl than parsl-torch does).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from ..common import settings
from ..common.procs import proc_stat
from ..errors import ConfigError

#: how long the engine's process may take to start its engine (its interchange, its first block's submission)
START_TIMEOUT_S = 120.0


def _load(config_yaml: str) -> Any:
    from globus_compute_endpoint.endpoint.config.utils import load_config_yaml

    loaded = load_config_yaml(config_yaml)
    if getattr(loaded, "engine", None) is None:
        raise ConfigError("the endpoint config has no engine: render it with parsl-torch sites endpoint-config")
    return loaded.engine


class LocalEndpoint:
    """The engine of an endpoint config (a mapping, as ``sites.endpoint.endpoint_config`` gives it), run in
    its own process with ``run_dir`` as the endpoint's run directory; a context manager that ends it."""

    def __init__(self, config: Mapping[str, Any], run_dir: str | os.PathLike) -> None:
        try:
            import globus_compute_endpoint  # noqa: F401
        except ImportError:
            raise ConfigError("the endpoint's engine is not installed here: pip install globus-compute-endpoint "
                              "(the version your endpoint runs)") from None
        import yaml

        self.config_yaml = yaml.safe_dump(dict(config))
        engine = _load(self.config_yaml)  # a bad config fails here, in this process
        provider = getattr(engine.executor, "provider", None)  # (a ThreadPoolEngine has none)
        self.description = type(engine).__name__ if provider is None else \
            f"{type(engine).__name__} over {type(provider).__name__} (mpi_launcher {engine.executor.mpi_launcher})"
        self.endpoint_id = str(uuid.uuid4())
        self.run_dir = Path(run_dir).absolute()
        self._conn: Connection | None = None
        self._pid: int | None = None
        self._pending: dict[str, Future] = {}
        self._send_lock = threading.Lock()

    def start(self) -> LocalEndpoint:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        address, authkey = str(self.run_dir / "engine.sock"), secrets.token_bytes(32)
        env = {k: v for k, v in os.environ.items() if k not in (settings.WORKFLOW.name, settings.KEEP_ENVIRON.name)}
        starter = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, env=env,
                                   stdout=subprocess.DEVNULL, stderr=open(self.run_dir / "engine.stderr", "ab"))
        starter.communicate(json.dumps({"address": address, "authkey": authkey.hex(), "config": self.config_yaml,
                                        "endpoint_id": self.endpoint_id, "run_dir": str(self.run_dir)}).encode())
        if starter.returncode:
            raise ConfigError(f"the engine's process did not start: see {self.run_dir / 'engine.stderr'}")
        self._conn = _connect(address, authkey)
        if not self._conn.poll(START_TIMEOUT_S):
            self._conn.close()
            raise ConfigError(f"the engine did not start within {START_TIMEOUT_S:g} s: see {self.run_dir}")
        kind, detail = self._conn.recv()
        if kind != "ready":
            self._conn.close()
            raise ConfigError(f"the engine did not start:\n{detail}")
        self._pid = detail
        threading.Thread(target=self._receive, name="local-endpoint-results", daemon=True).start()
        return self

    def shutdown(self) -> None:
        """Ends the engine (its blocks, interchange) and waits for its process to exit."""
        if self._conn is None:
            return
        with self._send_lock, contextlib.suppress(OSError):
            self._conn.send(("stop",))  # (a close alone is not seen while our reader still waits on it)
        self._conn = None
        deadline = time.monotonic() + 60
        while self._pid is not None and time.monotonic() < deadline:
            stat = proc_stat(self._pid)
            if stat is None or stat.state == "Z":  # gone (a zombie where nobody reaps orphans)
                return
            time.sleep(0.1)

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
        from globus_compute_sdk.serialize import ComputeSerializer

        if self._conn is None:
            raise ConfigError("the local endpoint is not started: use it as a context manager")
        serde = ComputeSerializer()
        task_id = uuid.uuid4()
        body = serde.pack_buffers([serde.serialize(fn), serde.serialize(args), serde.serialize(kwargs)])
        packed = messagepack.pack(messagepack.message_types.Task(task_id=task_id, task_buffer=body))
        outer: Future = Future()
        self._pending[str(task_id)] = outer
        with self._send_lock:
            self._conn.send(("task", str(task_id), packed, dict(resource_specification or {})))
        return outer

    def _receive(self) -> None:
        """The engine's packed Results, unpacked as the SDK does; when the engine's process is gone,
        every task still waiting fails."""
        conn = self._conn
        with contextlib.suppress(EOFError, OSError):
            while conn is not None:
                task_id, packed, failed = conn.recv()
                if (outer := self._pending.pop(task_id, None)) is None:
                    continue
                if failed is not None:
                    outer.set_exception(ConfigError(f"the local endpoint's engine failed the task: {failed}"))
                else:
                    _deliver(packed, outer)
        if conn is not None:
            conn.close()
        for outer in self._pending.values():
            outer.set_exception(ConfigError(f"the local endpoint's engine ended (see {self.run_dir})"))
        self._pending.clear()


def _connect(address: str, authkey: bytes) -> Connection:
    deadline = time.monotonic() + 30
    while True:
        try:
            return Client(address, family="AF_UNIX", authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise ConfigError(f"the engine's process never listened on {address}") from None
            time.sleep(0.05)


def _deliver(packed: bytes, outer: Future) -> None:
    from globus_compute_common import messagepack
    from globus_compute_sdk.errors import TaskExecutionFailed
    from globus_compute_sdk.serialize import ComputeSerializer

    try:
        result = messagepack.unpack(packed)
        if result.is_error:
            outer.set_exception(TaskExecutionFailed(result.data))
        else:
            outer.set_result(ComputeSerializer().deserialize(result.data))
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


def _serve(order: Mapping[str, str]) -> None:
    """The engine's process: start the engine, run the tasks that arrive, send back their results; end the
    engine when the starter's connection closes."""
    from globus_compute_endpoint.engines.base import GCFuture

    listener = Listener(order["address"], family="AF_UNIX", authkey=bytes.fromhex(order["authkey"]))
    accepted = threading.Event()

    def nobody_came() -> None:  # the starter died before it connected: nothing is left waiting for it
        if not accepted.wait(START_TIMEOUT_S):
            os._exit(1)

    threading.Thread(target=nobody_came, daemon=True).start()
    conn = listener.accept()
    accepted.set()
    listener.close()
    send_lock = threading.Lock()
    try:
        engine = _load(order["config"])
        engine.start(endpoint_id=order["endpoint_id"], run_dir=order["run_dir"])
    except Exception:  # noqa: BLE001 - the starter reports it
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))

    def answer(future: GCFuture) -> None:
        failed = future.exception()  # the engine's own failure (a task's error is a packed Result)
        with send_lock, contextlib.suppress(OSError):
            conn.send((str(future.gc_task_id), None if failed else future.result(), failed and repr(failed)))

    try:
        with contextlib.suppress(EOFError, OSError):
            while (order := conn.recv())[0] == "task":
                _, task_id, packed, spec = order
                future = GCFuture(task_id)
                future.add_done_callback(answer)
                engine.submit(future, packed, resource_specification=spec)
    finally:
        engine.shutdown(block=True)
        conn.close()  # the starter's reader sees the end


def main() -> int:
    """Started by ``LocalEndpoint.start`` (its order on stdin): detaches, then serves."""
    order = json.loads(sys.stdin.read())
    if os.fork():
        return 0  # the starter's child exits at once: the engine is nobody's descendant
    os.setsid()
    _serve(order)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
