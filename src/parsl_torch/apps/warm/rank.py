"""The ranks of a warm group (``pt.workflow(warm=True)``, see ``apps.warm``): started once,
like any stage's ranks (supervisor, shim, ``stage_main``, ``setup_torch``), they run one stage
call after another without starting again.

Rank 0 waits for the next job file in the group's directory and broadcasts it; every rank runs
the call exactly as ``stage_main`` would (the same payload, environment and result files, in
the stage's directory, its output in the stage's stdout/stderr), then the ranks meet (through the
group's store, see ``_Meeting``) and rank 0 writes the job's done file. Between calls each rank is
put back as it started (``baseline``: working directory, environment, torch's settings and flags,
signal handlers, RNG seeds, ...), the process groups the call made are destroyed and the accelerator's
cached memory is freed.
Module state the call changed is its own; a user module whose file changed since the group imported
it (``imports``) ends the group before the next call, which fresh ranks take. A call that leaves a
thread running (it cannot be undone) is answered, then its group stops: the next call gets fresh
ranks. A call that raises ends its rank (as in ``stage_main``): the supervisor ends the group, and
the workflow starts fresh ranks for the next call.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from ...common import settings, stagedir
from ...common.files import write_atomic
from ...common.observe import begin_call, observed_any, reads_of
from ...common.raised import write_raised
from ..stage_main import write_result
from .baseline import Baseline
from .census import Census
from .imports import ImportWatch

#: how often rank 0 looks for the next job
POLL_S = 0.002
#: an idle group's ranks meet this often (their broadcast would otherwise reach the collective timeout)
TICK_S = 5.0
#: the job files in a group's directory: jobs/<n>.json, written by the workflow; started and done markers
JOBS = "jobs"
STOP = "stop"


#: the warm group's keys in its process group's store
STORE_PREFIX = "parsl_torch/warm/"
#: the longest pause between a finished rank's looks at the meeting's keys
MEET_POLL_S = 0.05


def job_path(group_dir: str | os.PathLike, n: int, kind: str = "json") -> Path:
    return Path(group_dir, JOBS, f"{n}.{kind}")


class _Meeting:
    """The end of a call, met through the process group's store, not a collective: a collective the call
    left unmatched (``if rank == 0: dist.all_reduce(t)``) would pair with a meeting collective and hang the
    group until the collective timeout, where a cold stage fails in seconds (the other ranks' exits break
    the blocked one's connections). So each rank adds the collectives it issues on the default group in
    the call to a store counter as they happen (a thread: a rank blocked in a collective cannot say it
    itself); a rank that finished after ``c`` of them and sees more than ``world * c`` in all knows that a
    rank issued one it never will: it ends, and the blocked rank fails as it would cold."""

    def __init__(self, rank: int, world: int) -> None:
        from torch.distributed import distributed_c10d

        self.store, self.group = distributed_c10d._get_default_store(), distributed_c10d._get_default_group()
        self.rank, self.world = rank, world
        self._lock = threading.Lock()
        self._call: list[int] | None = None  # [call, sequence number at its start, collectives counted]
        #: rank 0: the user modules earlier calls were seen to import that their code does not name
        self.found: set[str] = set()
        threading.Thread(target=self._count_while_called, name="parsl-torch-warm-meeting", daemon=True).start()

    def _key(self, n: int, what: str) -> str:
        return f"{STORE_PREFIX}{n}/{what}"

    def _sequence(self) -> int:
        try:
            return int(self.group._get_sequence_number_for_group())
        except (AttributeError, RuntimeError):  # a backend without sequence numbers: nothing is told
            return 0

    def begin(self, n: int) -> None:
        if self.rank == 0 and n:  # every rank is past call n-1's meeting (they took call n's broadcast)
            for what in ("issued", "done", "unclean"):
                with contextlib.suppress(Exception):
                    self.store.delete_key(self._key(n - 1, what))
        with self._lock:
            self._call = [n, self._sequence(), 0]

    def _count(self) -> int:
        with self._lock:
            if self._call is None:
                return 0
            n, start, counted = self._call
            issued = self._sequence() - start
            if issued > counted:
                self.store.add(self._key(n, "issued"), issued - counted)
                self._call[2] = issued
            return issued

    def _count_while_called(self) -> None:
        while True:
            time.sleep(0.2)
            with contextlib.suppress(Exception):  # a store gone with its group: the rank is ending
                self._count()

    def share_reads(self, n: int) -> None:
        """This rank's reads in call ``n`` (``common.observe``) into the group's store: no collective, which
        could pair with one a rank left unmatched in the call."""
        folder = settings.READS_DIR.get()
        if folder is not None and observed_any(folder):
            self.store.set(self._key(n, f"reads/{self.rank}"), json.dumps(sorted(reads_of(folder))))

    def record_reads(self, n: int, job: stagedir.WarmJob) -> None:
        """Rank 0, once every rank finished call ``n``: their reads, merged, in the stage's directory (one
        file per stage, as a cold stage's supervisor writes it); a rank not observed leaves it incomplete.
        A module an earlier call imported by a name found at run time (``import_module(ARCH)``) is among
        them: this call may run it without opening its file again (a needless rerun at worst)."""
        merged: set[str] = set()
        told = 0
        for rank in range(self.world):
            key = self._key(n, f"reads/{rank}")
            if self.store.check([key]):
                merged.update(json.loads(self.store.get(key)))
                self.store.delete_key(key)
                told += 1
        if told or settings.READS_DIR.get() is not None:
            found = {f"f {path}" for path in self.found}
            stagedir.write(job.file(stagedir.READS), stagedir.ReadsRecord(told, self.world, sorted(merged | found)))
        known = {os.path.realpath(p) for p in job.modules}
        self.found |= {line[2:] for line in merged if line.startswith("f ") and line.endswith(".py")
                       and os.path.realpath(line[2:]) not in known}

    def end(self, n: int, clean: bool) -> bool:
        """Wait for every rank to finish call ``n``; whether none of them left a thread running. A rank
        that can never finish (it waits in a collective this rank did not call) ends this rank."""
        issued = self._count()
        with self._lock:
            self._call = None
        if not clean:
            self.store.add(self._key(n, "unclean"), 1)
        self.store.add(self._key(n, "done"), 1)
        pause = 0.001
        while True:
            done = self.store.add(self._key(n, "done"), 0)
            total = self.store.add(self._key(n, "issued"), 0)  # (read after done: final once all are done)
            if total > self.world * issued or (done == self.world and total != self.world * issued):
                print(f"parsl-torch: rank {self.rank} finished the call after {issued} collective(s) on the default "
                      f"process group, but the group's {self.world} ranks issued {total} in all: a rank called a "
                      f"collective that the others never did (a collective under `if rank == 0:`?). It would wait "
                      f"for it until the collective timeout: this rank ends, and the waiting rank's traceback names "
                      f"the collective.", file=sys.stderr, flush=True)
                os._exit(1)
            if done == self.world:
                return self.store.add(self._key(n, "unclean"), 0) == 0
            time.sleep(pause)
            pause = min(2 * pause, MEET_POLL_S)


def _process_groups() -> set:
    """The process groups alive now (torch keeps them in its world's map)."""
    from torch.distributed import distributed_c10d

    return set(getattr(getattr(distributed_c10d, "_world", None), "pg_map", {}) or ())


def _keep_the_default_group() -> None:
    """A call's ``pt.cleanup()`` / ``destroy_process_group()`` leaves the group's own process group up,
    and its ``init_process_group`` finds it there (as ``setup_torch`` does)."""
    import torch.distributed as dist

    destroy, init = dist.destroy_process_group, dist.init_process_group

    def destroy_process_group(group=None):
        if group is not None and group is not dist.group.WORLD:
            destroy(group)

    def init_process_group(*args, **kwargs):
        if not dist.is_initialized():
            init(*args, **kwargs)

    dist.destroy_process_group, dist.init_process_group = destroy_process_group, init_process_group


@contextlib.contextmanager
def _output_to(stdout: str, stderr: str):
    """The rank's fds 1 and 2 write to the stage's files (appending: several ranks share them)."""
    for stream in (sys.stdout, sys.stderr):  # what the rank printed before is not the stage's
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        for fd, path in ((1, stdout), (2, stderr)):
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(target, fd)
            os.close(target)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, old in ((1, saved[0]), (2, saved[1])):
            os.dup2(old, fd)
            os.close(old)


def _run(job: stagedir.WarmJob, baseline: Baseline, census: Census, rank: int) -> bool:
    """One call, as ``stage_main`` runs it; a failure ends this rank (exit 1, or 124 past its walltime)."""
    import dill

    with open(job.file(stagedir.ENV)) as f:
        env = json.load(f)
    groups = _process_groups()
    with _output_to(job.file(stagedir.STDOUT), job.file(stagedir.STDERR)):
        os.chdir(job.stage_dir)
        os.environ.update(env)
        sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        timer = threading.Timer(job.walltime, os._exit, (124,)) if job.walltime else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        if (folder := settings.READS_DIR.get()) is not None:
            begin_call(folder)  # (what this call reads is its own: ``common.observe``)
        try:
            with open(job.file(stagedir.PAYLOAD), "rb") as f:
                shipped, args, kwargs = dill.load(f)
            value = shipped.load()(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - as stage_main: report any failure, then end this rank
            traceback.print_exc()
            write_raised(exc, settings.RAISED.get())
            sys.stderr.flush()
            os._exit(1)
        if timer is not None:
            timer.cancel()
        if rank == 0:
            write_result(value, job.file(stagedir.RESULT))
    import torch.distributed as dist

    for group in _process_groups() - groups:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)
    del value
    census.run_exit_callbacks()
    baseline.restore(job.stage_dir)
    gc.collect()
    left = baseline.threads_left()
    if left:
        print(f"parsl-torch: the call left thread(s) running ({', '.join(left)}): its warm ranks stop after it, and "
              f"the next call starts fresh ones", file=sys.stderr, flush=True)
    changed = census.restore()
    if changed:
        print(f"parsl-torch: the call changed process-wide settings that cannot be put back ({', '.join(changed)}): "
              f"its warm ranks stop after it, and the next call starts fresh ones", file=sys.stderr, flush=True)
    return not left and not changed


def _next_job(group_dir: str, n: int, imports: ImportWatch) -> stagedir.WarmJob | str | None:
    """Rank 0: job ``n`` when it is there, "stop" when asked (or the block is about to end), None after TICK_S;
    "stop" too, leaving the job untaken for fresh ranks, when a user module changed since it was imported."""
    waited = time.monotonic() + TICK_S
    path, stop = job_path(group_dir, n), Path(group_dir, STOP)
    while time.monotonic() < waited:
        if path.exists():
            if (changed := imports.changed()) is not None:
                print(f"parsl-torch: {changed} changed since these warm ranks imported it: they stop, and fresh "
                      f"ranks take the next call", file=sys.stderr, flush=True)
                return "stop"
            job = stagedir.read(path, stagedir.WarmJob)
            write_atomic(job_path(group_dir, n, "started"), "")
            return job
        deadline = settings.DEADLINE.get()
        if stop.exists() or (deadline is not None and time.time() >= deadline):
            return "stop"
        time.sleep(POLL_S)
    return None


def serve(group_dir: str) -> str:
    """The group's stage function: run calls until told to stop."""
    import torch.distributed as dist

    rank = dist.get_rank()
    meeting = _Meeting(rank, dist.get_world_size())  # (its thread is part of the baseline)
    baseline = Baseline()
    census = Census()  # (after the baseline: what it puts back, the census finds as it was)
    _keep_the_default_group()
    imports = ImportWatch()
    n = 0
    while True:
        box = [_next_job(group_dir, n, imports) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        job = box[0]
        if job is None:
            continue
        if job == "stop":
            return "stopped"
        meeting.begin(n)
        finished = _run(job, baseline, census, rank)
        meeting.share_reads(n)
        clean = meeting.end(n, finished)  # every rank finished: only then is the call done
        if rank == 0:
            meeting.record_reads(n, job)
            write_atomic(job_path(group_dir, n, "done"), "")
        if not clean:
            return "stopped"  # a thread of a call still runs: later calls get fresh ranks
        n += 1
