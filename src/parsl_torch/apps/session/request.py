"""What a workflow was asked for, checked once before anything is made: ``pt.workflow``'s
keywords, with the flags of ``parsl-torch run`` over the script's own."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ... import sites
from ...common import settings
from ...errors import ConfigError
from ...launch.schedulers import get_scheduler
from ..stage.continuation import check_max_continuations

#: what pt.workflow does with the stages that run when the workflow script raises
ON_ERROR = ("wait", "cancel")
#: pt.workflow's keywords that change the site, as for sites.load
SITE_OVERRIDES = ("account", "queue", "walltime", "nodes")
#: parsl.Config settings the workflow owns: the stages' guarantees rest on them
OWNED_SETTINGS = {"executors": "the site's executors run the stages", "run_dir": "it is <run_dir>/parsl",
                  "memoizer": "stage reruns are decided by parsl-torch's memoizer"}


@dataclass(frozen=True)
class RunFlags:
    """``parsl-torch run --site S --run-dir D --fresh``: every workflow of the script takes them;
    ``progress``: show the stages as they go (``run`` always does)."""

    site: str | None = None
    run_dir: str | None = None
    fresh: bool = False
    progress: bool = False


#: the flags of the ``parsl-torch run`` this code runs under (a context variable: the CLI
#: runs the user's script, whose pt.workflow calls cannot be handed an argument)
_cli_flags: contextvars.ContextVar[RunFlags] = contextvars.ContextVar("parsl_torch_run_flags", default=RunFlags())


@contextlib.contextmanager
def run_flags(flags: RunFlags) -> Iterator[None]:
    """Within the block, every ``pt.workflow`` takes ``flags`` over what its script passes."""
    token = _cli_flags.set(flags)
    try:
        yield
    finally:
        _cli_flags.reset(token)


@dataclass(frozen=True)
class WorkflowRequest:
    """``pt.workflow``'s arguments, validated, with ``parsl-torch run``'s flags applied
    (``given`` keeps what the script asked for, for the log)."""

    site: str
    run_dir: str
    fresh: bool
    retries: int
    max_continuations: int
    on_error: str
    gc_executor: Any
    progress: bool
    retry_handler: Any = None
    site_overrides: dict[str, Any] = field(default_factory=dict)
    config_settings: dict[str, Any] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    #: the workflow's other sites (``sites=[default, *others]``), for stages called with ``site=``
    other_sites: tuple[str, ...] = ()
    warm: bool = False  # function stages run in ranks already up (apps.warm)

    @classmethod
    def of(cls, site: str, run_dir: str | os.PathLike, fresh: bool, retries: int, max_continuations: int,
           on_error: str, gc_executor: Any, keywords: dict[str, Any]) -> WorkflowRequest:
        flags = _cli_flags.get()
        site, others = _sites(site, keywords.pop("sites", None))
        warm = keywords.pop("warm", False)
        if not isinstance(warm, bool):
            raise ConfigError(f"pt.workflow(warm={warm!r}): use True (function stages run in ranks already up) "
                              f"or False")
        site_overrides, config_settings = split_settings(keywords)
        check_max_continuations(max_continuations)
        if on_error not in ON_ERROR:
            raise ConfigError(f"pt.workflow(on_error={on_error!r}): use one of {', '.join(map(repr, ON_ERROR))}")
        given = {"site": site, "run_dir": os.fspath(run_dir)}
        retry_handler = config_settings.pop("retry_handler", None)  # the workflow's own handler calls it
        return cls(site=flags.site or site, run_dir=flags.run_dir or os.fspath(run_dir),
                   fresh=bool(fresh or flags.fresh), retries=retries, max_continuations=max_continuations,
                   on_error=on_error, gc_executor=gc_executor, progress=flags.progress or settings.PROGRESS.get(),
                   retry_handler=retry_handler, site_overrides=site_overrides, config_settings=config_settings,
                   given={k: v for k, v in given.items() if getattr(flags, k) not in (None, v)},
                   other_sites=tuple(o for o in others if o != (flags.site or site)), warm=warm)


def _sites(site: str, sites: Any) -> tuple[str, tuple[str, ...]]:
    """(the default site, the others) from ``site=`` or ``sites=[default, *others]``."""
    if sites is None:
        return site, ()
    if isinstance(sites, str) or not isinstance(sites, (list, tuple)) or not sites or \
            not all(isinstance(s, str) and s for s in sites) or len(set(sites)) != len(sites):
        raise ConfigError(f"pt.workflow(sites={sites!r}): give a list of distinct site names, the default first")
    if site != "auto":
        raise ConfigError(f"pt.workflow(site={site!r}, sites={list(sites)!r}): give one of them (sites=: its "
                          f"first is the default site)")
    return sites[0], tuple(sites[1:])


def split_settings(keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(site overrides, parsl.Config settings); anything else is an error, before anything is made."""
    if not keywords:
        return {}, {}
    import inspect

    from parsl.config import Config

    config_params = set(inspect.signature(Config).parameters)
    site, config, unknown = {}, {}, []
    for key, value in keywords.items():
        if key in SITE_OVERRIDES:
            site[key] = value
        elif key in OWNED_SETTINGS:
            raise ConfigError(f"pt.workflow({key}=...): the workflow sets this parsl.Config setting itself "
                              f"({OWNED_SETTINGS[key]}); leave it out")
        elif key in config_params:
            config[key] = value
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(f"pt.workflow: unknown keyword(s) {', '.join(sorted(unknown))}: use a site override "
                          f"({', '.join(SITE_OVERRIDES)}) or a parsl.Config setting (e.g. monitoring, "
                          f"retry_handler, max_idletime)")
    return site, config


@dataclass(frozen=True)
class BuiltinCall:
    """One call of a built-in stage (train, evaluate): its config (checked), its inputs and outputs, and
    where it runs. ``files``: what its config names (its data), part of its identity."""

    builtin: str
    config: Any  # its config record (TrainConfig, EvalConfig), checked: it travels to the ranks as itself
    inputs: tuple = ()
    outputs: tuple = ()
    files: tuple[str, ...] = ()
    stage: str | None = None
    num_nodes: int | None = None
    ranks_per_node: int | None = None
    walltime: float | None = None
    site: str | None = None  # another of the workflow's sites
    min_nodes: int | None = None  # the fewest nodes it may go on with after a node loss
    env: dict[str, str] | None = None  # its ranks' environment variables, over the site's

    @classmethod
    def of(cls, builtin: str, config: Any, inputs: tuple, outputs: tuple, files: tuple[str, ...],
           options: dict[str, Any]) -> BuiltinCall:
        """A call with the stage options asked for; one it does not take is named, with those it takes."""
        takes = [f.name for f in dataclasses.fields(cls)][5:]
        if unknown := [name for name in options if name not in takes]:
            raise ConfigError(f"stage {options.get('stage') or builtin!r}: {', '.join(map(repr, unknown))}: not an "
                              f"option of the built-in {builtin} stage (it takes {', '.join(takes)})")
        return cls(builtin, config, inputs, outputs, files, **options)

    @property
    def name(self) -> str:
        """The name asked for: ``stage=``, else the built-in's."""
        return self.stage or self.builtin


def sites_checked(request: WorkflowRequest) -> tuple[Any, list, bool]:
    """The default site, the others, and whether the stages run in your own Parsl config (already loaded),
    each site checked for it (or its blocks, for their stages) before anything is made."""
    loaded = sites.load(request.site, **request.site_overrides)
    others = [sites.load(name) for name in request.other_sites]  # (the overrides are the default site's)
    users_dfk = loaded_dfk()
    for each in (loaded, *others):
        if users_dfk is not None:  # stages run on the site's executors in the user's own config
            check_users_dfk(users_dfk, each, request)
        elif not get_scheduler(each.spec.scheduler).remote:  # blocks too short to take a stage: submitted forever
            sites.build.check_blocks_take_stages(each.spec)
    return loaded, others, users_dfk is not None


def loaded_dfk() -> Any:
    """The DataFlowKernel the user loaded (``parsl.load``), or None."""
    from parsl.dataflow.dflow import DataFlowKernelLoader
    from parsl.errors import NoDataFlowKernelError

    try:
        return DataFlowKernelLoader.dfk()
    except NoDataFlowKernelError:
        return None


def check_users_dfk(dfk: Any, site: sites.Site, request: WorkflowRequest) -> None:
    """Under a DataFlowKernel the user loaded: it must hold the site's executors, and the settings
    of Parsl's own config are theirs. Checked before anything is made."""
    if request.warm:
        raise ConfigError("pt.workflow(warm=True) needs the Parsl config pt.workflow loads itself (its warm "
                          "ranks' executor): leave out your parsl.load, or warm=True")
    given = [k for k, v in {"retries": request.retries, "gc_executor": request.gc_executor,
                            "retry_handler": request.retry_handler, **request.config_settings}.items() if v]
    if given:
        raise ConfigError(f"Parsl is already loaded (parsl.load): set {', '.join(given)} in your own "
                          f"parsl.Config, not in pt.workflow")
    if site.mpi_label not in dfk.executors:
        raise ConfigError(f"Parsl is already loaded without site {site.name!r}'s executors: add "
                          f"pt.sites.load({site.name!r}).executors() to your parsl.Config (labels "
                          f"{site.mpi_label!r}, ...), or let pt.workflow load Parsl (no parsl.load around it)")
