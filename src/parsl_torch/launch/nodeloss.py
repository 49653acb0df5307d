"""A node a launch names lost: how it is named, which node is to blame, and the check that it is lost
before it is quarantined (``supervise`` acts on it; ``preflight`` is the check)."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Sequence

from ..common import settings
from ..common.outcome import Cause, Outcome, write_outcome
from . import quarantine
from .events import NODE_LOST_EXIT, NodeSilent, ranks_text, short
from .listener import LOCAL_NAMES, RankListener
from .plan import LaunchPlan
from .preflight import answering

#: a node's ranks' processes ended without a report, and the node answers (as a SIGKILL)
VANISHED_EXIT = 137
#: seconds a node named lost has to answer a check before it is (without the site's mpi.preflight)
LOSS_CHECK_S = 10.0
#: seconds a vanished node waits for the other nodes' hellos before one that never said it is blamed
GREET_WAIT_S = 2.0


def say(message: str) -> None:
    print(f"parsl-torch: {message}", file=sys.stderr, flush=True)


def ended(stage_dir: str | None, outcome: Outcome, said: str = "") -> int:
    """A launch that ends before its ranks run: ``said`` (default its summary), its outcome recorded for the
    workflow in ``stage_dir``; its exit code."""
    say(said or outcome.summary)
    if stage_dir:
        write_outcome(stage_dir, outcome)
    return outcome.exit_code


def blame(event: NodeSilent, nodes: tuple[str, ...], greeted: set[str]) -> NodeSilent:
    """The node to name for a node-loss event. A node whose ranks never said hello is the one lost when
    another node's processes vanish: a launcher that loses one node's daemon (its link is down) ends
    the ranks on the others, which vanish without a word."""
    names = [short(n) for n in nodes]
    silent = [n for n in names if n not in greeted]
    if event.kind == "vanished" and silent and short(event.host) in names:
        return event.blamed_on(silent[0])
    return event


def greeted(listener: RankListener, nodes: tuple[str, ...], event: NodeSilent) -> set[str]:
    """The nodes whose ranks said hello; for a vanished node, after up to GREET_WAIT_S more for the
    others (a node whose launcher was merely slow greets by then; one whose link is down never does)."""
    deadline = time.monotonic() + (GREET_WAIT_S if event.kind == "vanished" else 0)
    while time.monotonic() < deadline and not {short(n) for n in nodes} <= listener.greeted:
        time.sleep(0.1)
    return set(listener.greeted)


def _is_here(host: str) -> bool:
    here = socket.gethostname()
    return host in (*LOCAL_NAMES, here) or short(host) == short(here)


def checked(plan: LaunchPlan, outcome: Outcome, seconds: float) -> Outcome:
    """``outcome`` (a node loss) if its node does not answer a check within ``seconds``; else the
    application failure it was: a program that kills its own process group or its parent, Slurm's or
    the kernel's out-of-memory killer, end a node's processes as a lost node's end."""
    host = str(outcome.host)
    if _is_here(host):
        answers = "it runs this launch's supervisor"
    else:
        try:  # (the stopped step may still hold the nodes: the check's step overlaps it)
            answered, _ = answering(dataclasses.replace(plan, argv=overlapping(plan.argv)), seconds)
        except ValueError:  # not a parsl-torch launch (no shim to swap for the check): take it as lost
            return outcome
        if short(host) not in answered:
            say(f"node {host} did not answer a check within {seconds:g} s: it is lost")
            return outcome
        answers = "it answered a check"
    summary = (f"the processes of {ranks_text(outcome.ranks)} on {host} ended (or stopped answering) without "
               f"a report, but node {host} was not lost ({answers}): they were killed (by the program itself, e.g. "
               f"os.killpg or a kill of its parent, or by an out-of-memory killer: see the node's dmesg or the job's "
               f"Slurm log); the node stays in service")
    say(summary)
    return Outcome(Cause.RANKS_VANISHED, VANISHED_EXIT, summary, host=host, ranks=outcome.ranks)


def overlapping(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` with srun's ``--overlap``: after a node dies its step holds the step's other nodes until
    Slurm marks the node down (SlurmdTimeout, minutes), and a new step there waits "Requested nodes
    are busy" until then; an overlapping step starts at once. Other launchers: as it is."""
    if argv and os.path.basename(argv[0]) == "srun" and "--overlap" not in argv:
        return (argv[0], "--overlap", *argv[1:])
    return tuple(argv)


#: each launcher's flags that name its ranks, its nodes and how many (Parsl's prefixes: mpi_prefix_composer)
_SHAPE_FLAGS = {"mpiexec": ("-n", "-hosts", None), "srun": ("--ntasks", "--nodelist", "--nodes"),
                "aprun": ("-n", "-node-list", None)}


def on_nodes_left(command: Sequence[str], prefix: Sequence[str], hosts: Sequence[str], lost: str,
                  ranks_per_node: int) -> tuple[list[str], list[str]] | None:
    """The launch command and hosts of the same ranks per node on ``hosts`` less ``lost`` (None: see
    ``relaunched``)."""
    return relaunched(command, prefix, [h for h in hosts if h and h != lost], ranks_per_node)


def on_spare(command: Sequence[str], prefix: Sequence[str], hosts: Sequence[str], lost: str, spare: str,
             ranks_per_node: int) -> tuple[list[str], list[str]] | None:
    """The launch command and hosts of the same ranks on ``hosts`` with ``spare`` in ``lost``'s place: the
    lost node's ranks start there (None: see ``relaunched``)."""
    return relaunched(command, prefix, [spare if h == lost else h for h in hosts if h], ranks_per_node)


def relaunched(command: Sequence[str], prefix: Sequence[str], hosts: Sequence[str],
               ranks_per_node: int) -> tuple[list[str], list[str]] | None:
    """The launch command of the same ranks per node on ``hosts``, and the hosts: ``prefix`` (Parsl's launch
    prefix, which ``command`` starts with) with its ranks and nodes rewritten. None where there is no host, the
    command does not start with the prefix or its launcher is not one of Parsl's."""
    flags = _SHAPE_FLAGS.get(os.path.basename(prefix[0])) if prefix else None
    if not hosts or flags is None or list(command[:len(prefix)]) != list(prefix):
        return None
    values = dict(zip(flags, (str(len(hosts) * ranks_per_node), ",".join(hosts), str(len(hosts)))))
    rewritten = list(prefix)
    for i, word in enumerate(prefix[:-1]):
        if word in values:
            rewritten[i + 1] = values[word]
    return [*rewritten, *command[len(prefix):]], list(hosts)


def refuse_nodes(silent: dict[str, str], stage_dir: str | None, in_place: bool = False) -> int:
    """Nodes that failed the pre-flight check: quarantined. Before a stage's first launch it goes back to the
    block's pool unstarted (its retry is free: ``apps.stage.continuation``), which places it on other nodes;
    before a launch in place (``in_place``: a spare brought in), the stage goes on without them (the
    outcome names the first as lost: ``supervise`` takes another spare, or the nodes left)."""
    path, job = settings.QUARANTINE.get(), quarantine.job_of()
    for host, why in silent.items():
        say(f"pre-flight: node {host} {why}")
        if path and job:
            quarantine.add(path, job, host, f"pre-flight: {why}")
    kept = ("quarantined; the stage goes on in place without it" if in_place else
            "quarantined; the stage was not started and goes to other nodes" if path and job else
            "the stage was not started (no quarantine outside a workflow's batch job)")
    summary = f"pre-flight: node(s) {', '.join(silent)} did not answer: {kept}"
    cause = Cause.NODE_LOST if in_place else Cause.PREFLIGHT_FAILED
    return ended(stage_dir, Outcome(cause, NODE_LOST_EXIT, summary, host=next(iter(silent))))
