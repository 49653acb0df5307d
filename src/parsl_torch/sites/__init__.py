"""Layer 3, the workflow process or a login node. Sites: one YAML file per machine in
``site_configs/``, turned into a ``parsl.Config`` on demand.

Search path: the directories in ``PARSL_TORCH_SITE_PATH`` (``:``-separated),
then the files shipped with the package; the first file named ``<site>.yaml``
wins, so a user file overrides a shipped one. Selection (``load("auto")``):
``PARSL_TORCH_SITE``, then the files' ``env_markers`` and ``hostnames``
patterns, then ``local``. The site files are also where the launch layer
learns which machine this host is (``detect_job``).
Overrides of account, queue, walltime and nodes: arguments, then
``PARSL_TORCH_ACCOUNT`` / ``_QUEUE`` / ``_WALLTIME`` / ``_NODES``, then the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import settings, yamlfile
from ..errors import SiteError
from ..launch.machines import get_machine
from ..launch.schedulers import Detection, detect_scheduler, get_scheduler
from . import build
from .capacity import node_accelerators
from .schema import SiteSpec, checked, parse_site

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "site_configs"
_OVERRIDES = {"account": settings.ACCOUNT, "queue": settings.QUEUE, "walltime": settings.WALLTIME,
              "nodes": settings.NODES}


def search_path(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    user = [Path(p).expanduser() for p in (settings.SITE_PATH.get(env) or "").split(os.pathsep) if p]
    return [*user, BUILTIN_DIR]


def available(env: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Site name -> file, first on the search path wins."""
    found: dict[str, Path] = {}
    for directory in search_path(env):
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else ():
            found.setdefault(path.stem, path)
    return found


def read_spec(path: Path) -> SiteSpec:
    import yaml

    try:
        data = yamlfile.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SiteError(f"{path}:{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise SiteError(f"{path}: cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SiteError(f"{path}: is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    spec = parse_site(data, str(path))
    if spec.name != path.stem:
        raise SiteError(f"{path}: name: {spec.name!r} differs from the file name; use name: {path.stem}")
    return spec


@dataclass(frozen=True)
class SiteChoice:
    name: str
    reason: str


def detect(hostname: str | None = None, env: Mapping[str, str] | None = None) -> SiteChoice:
    """Which site ``load("auto")`` picks here, and why."""
    env = os.environ if env is None else env
    forced = settings.SITE.get(env)
    if forced:
        return SiteChoice(forced, f"PARSL_TORCH_SITE={forced}")
    hostname = hostname or socket.gethostname()  # getfqdn can block on DNS
    for name, path in available(env).items():
        spec = read_spec(path)
        if spec.env_markers and all(env.get(k) == v for k, v in spec.env_markers.items()):
            marks = ", ".join(f"{k}={v}" for k, v in spec.env_markers.items())
            return SiteChoice(name, f"{marks} (env_markers in {path})")
        for pattern in spec.hostnames:
            if re.search(pattern, hostname):
                return SiteChoice(name, f"hostname {hostname} matches {pattern!r} in {path}")
    return SiteChoice("local", f"hostname {hostname} matches no site's hostnames")


def detect_job(env: Mapping[str, str] | None = None, hostname: str | None = None) -> Detection:
    """The scheduler and machine of this process: the job's variables, and
    the machine of the site the files pick for this host (launch defaults)."""
    env = os.environ if env is None else env
    choice = detect(hostname, env)
    path = available(env).get(choice.name)
    if path is None:  # PARSL_TORCH_SITE names a site that load() will report as unknown
        return detect_scheduler(env, why=choice.reason)
    spec = read_spec(path)
    return detect_scheduler(env, machine=spec.machine, machine_scheduler=spec.scheduler,
                            why=f"site {choice.name}: {choice.reason}")


def rank_environment(env: Mapping[str, str] | None = None, hostname: str | None = None) -> dict[str, str]:
    """The ``environment`` of the site file this host matches, for ``parsl-torch launch``
    to export to the ranks (the stages get it through the workers); values already in ``env`` win."""
    env = os.environ if env is None else env
    path = available(env).get(detect(hostname, env).name)
    if path is None:
        return {}
    return {k: v for k, v in read_spec(path).environment.items() if k not in env}


@dataclass(frozen=True)
class Site:
    """A loaded site: its settings (``spec``), the file they came from, and
    where overridden settings came from (dotted field -> "argument" or "environment VAR")."""

    spec: SiteSpec
    path: Path
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def provenance(self) -> dict[str, str]:
        """Every setting (dotted path) -> where its value comes from: an override,
        this site file, or the schema's default."""
        raw = yamlfile.safe_load(self.path.read_text()) or {}

        def in_file(path: str) -> bool:
            node: Any = raw
            for part in path.split("."):
                if not isinstance(node, Mapping) or part not in node:
                    return False
                node = node[part]
            return True

        return {path: self.overrides.get(path) or (f"file {self.path.name}" if in_file(path) else "default")
                for path in _leaves(self.settings())}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ranks_per_node(self) -> int:
        """A stage's default ranks per node: ``launch.ranks_per_node``, else one per accelerator of a node
        (the machine record's count, or those this host sees on the local site), else
        ``launch.cpu_ranks_per_node``."""
        launch = self.spec.launch
        return launch.ranks_per_node or len(node_accelerators(self.spec)[0]) or launch.cpu_ranks_per_node

    @property
    def accelerated(self) -> bool:
        """Its nodes have accelerators (as ``ranks_per_node`` counts them)."""
        return bool(node_accelerators(self.spec)[0])

    @property
    def cpus_only(self) -> bool:
        """Its nodes are known to have no accelerator: its node is this host, which sees none (elsewhere a
        site that names none may still have them)."""
        return not self.accelerated and get_scheduler(self.spec.scheduler).one_machine

    def launcher_args(self, ranks_per_node: int) -> tuple[str, ...]:
        """Flags after ``$PARSL_MPI_PREFIX``: ``launch.extra_args``, else the machine's binding."""
        extra, machine = self.spec.launch.extra_args, get_machine(self.spec.machine)
        return tuple(extra if extra is not None else machine.binding_args(ranks_per_node) if machine else ())

    def rank_env(self) -> dict[str, str]:
        """What the machine needs in every rank's environment (the site's ``environment`` reaches the
        ranks through the workers' environment)."""
        machine = get_machine(self.spec.machine)
        return machine.rank_env() if machine else {}

    def parsl_config(self, run_dir: str | os.PathLike = "runinfo", gc_executor: Any = None,
                     **config_kwargs: Any):
        """A new ``parsl.Config`` (built now, not at load); extra keywords go to Config.

        ``gc_executor``: for a Globus Compute site, the executor to use instead
        of one built from the site's endpoint (tests inject one here)."""
        return build.workflow_config([self.spec], run_dir, gc_executor, **config_kwargs)

    def executors(self) -> list[Any]:
        """The site's executors for a parsl.Config of your own, labelled ``<site>.mpi`` and
        ``<site>.htex``: stages called inside ``pt.workflow(site=...)`` under your
        ``parsl.load(config)`` run on them."""
        build.require_account(self.spec, "submit jobs")
        return build.site_executors(self.spec, self.name)

    @property
    def mpi_label(self) -> str:
        """The label of this site's MPI executor in a parsl.Config of your own."""
        return build.executor_label(build.MPI_LABEL, self.name)

    def render(self, executor: str = "mpi") -> str:
        """The batch script Parsl would submit for one block; nothing is submitted."""
        return build.render(self.spec, executor)

    def settings(self) -> dict[str, Any]:
        return dataclasses.asdict(self.spec)


def load(name: str = "auto", *, account: str | None = None, queue: str | None = None,
         walltime: str | None = None, nodes: int | None = None,
         env: Mapping[str, str] | None = None) -> Site:
    """The site called ``name`` ("auto": see ``detect``), with overrides applied."""
    env = os.environ if env is None else env
    if name == "auto":
        name = detect(env=env).name
    files = available(env)
    if name not in files:
        raise SiteError(f"unknown site {name!r}: known sites are {', '.join(sorted(files))} "
                        f"(add yours as <name>.yaml in a directory on PARSL_TORCH_SITE_PATH)")
    spec = read_spec(files[name])
    given = {"account": account, "queue": queue, "walltime": walltime, "nodes": nodes}
    changes: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, setting in _OVERRIDES.items():
        value = given[key] if given[key] is not None else setting.get(env)
        if value is None or value == "":
            continue
        field_name = "nodes_per_block" if key == "nodes" else key
        origins[f"provider.{field_name}"] = "argument" if given[key] is not None else f"environment {setting.name}"
        if key == "nodes":
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise SiteError(f"nodes: {value!r} (from {setting.name} or nodes=) is not a whole number") from None
            if value < 1:
                raise SiteError(f"nodes: must be at least 1, got {value}")
        changes[field_name] = value if key == "nodes" else str(value)
    if changes:
        provider = dataclasses.replace(spec.provider, **changes)
        spec = checked(dataclasses.replace(spec, provider=provider), f"{files[name]} (with overrides)")
    return Site(spec, files[name], origins)


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the settings that hold values (a mapping with entries is a section)."""
    paths = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value and key not in ("environment", "env_markers"):
            paths += _leaves(value, f"{prefix}{key}.")
        elif isinstance(value, Mapping) and value:
            paths += [f"{prefix}{key}.{k}" for k in value]
        else:
            paths.append(f"{prefix}{key}")
    return paths
