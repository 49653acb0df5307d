"""FAKE Globus Compute executor, for tests only: the Globus web service cannot
be reached from here. It does what an endpoint's MPI engine does to a task
that matters for our code: the function and its arguments are serialized with
globus-compute's own ComputeSerializer, run in a fresh Python process (so a
function that cannot be imported there fails here too, as it would on the
endpoint), with $PARSL_MPI_PREFIX set from the resource specification (the
venv's mpiexec), and the result comes back through the same serializer."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import sys
from globus_compute_sdk.serialize import ComputeSerializer
s = ComputeSerializer()
fn, args, kwargs = (s.deserialize(b) for b in s.unpack_buffers(sys.stdin.read()))
sys.stdout.write("\\x00RESULT\\x00" + s.serialize(fn(*args, **kwargs)))
"""


from globus_compute_sdk import Executor


class FakeGlobusExecutor(Executor):
    """Passes Parsl's type check for a globus_compute_sdk.Executor; never talks to the service."""

    # plain attributes here shadow the real Executor's properties
    resource_specification = None
    user_endpoint_config = None
    endpoint_id = "6f3a8b52-0000-4000-8000-000000000000"
    label = "fake-globus-executor"

    def __init__(self, mpiexec: str | None = None) -> None:  # noqa: D107 - the real __init__ is not called
        self.resource_specification: dict | None = None
        self.user_endpoint_config: dict | None = None
        self.submitted: list[dict] = []
        self._mpiexec = mpiexec or str(Path(sys.executable).parent / "mpiexec")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)

    def submit(self, fn, /, *args, **kwargs):
        from globus_compute_sdk.serialize import ComputeSerializer

        s = ComputeSerializer()
        payload = s.pack_buffers([s.serialize(fn), s.serialize(args), s.serialize(kwargs)])
        spec = dict(self.resource_specification or {})
        self.submitted.append({"resource_specification": spec, "user_endpoint_config": self.user_endpoint_config})
        env = dict(os.environ)
        if spec:
            env["PARSL_MPI_PREFIX"] = f"{self._mpiexec} -n {spec.get('num_ranks', 1)}"
        return self._pool.submit(self._run, payload, env)

    @staticmethod
    def _run(payload: str, env: dict):
        from globus_compute_sdk.serialize import ComputeSerializer

        out = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True, text=True,
                             env=env, timeout=600)
        if out.returncode or "\x00RESULT\x00" not in out.stdout:
            raise RuntimeError(f"fake endpoint task failed:\n{out.stderr[-3000:]}")
        return ComputeSerializer().deserialize(out.stdout.split("\x00RESULT\x00", 1)[1])

    def __repr__(self) -> str:
        return f"FakeGlobusExecutor(endpoint_id={self.endpoint_id})"

    def __del__(self) -> None:
        pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _get_result_watcher(self):  # Parsl's GlobusComputeExecutor stops it at shutdown
        return self
