"""Files a stage's config files name: ``train(cfg="exp.yaml")`` where ``exp.yaml`` says
``data: /lus/proj/tokens.bin``.

The config file is an input (a string argument that names a file), so editing it reruns the
stage; the data file it names is read by the stage too, and regenerating it must rerun the stage
as well. So each input that is a YAML, JSON or TOML file (by its suffix, at most MAX_BYTES) is
parsed, and every string in it that names an existing file (``scriptargs.PathNames``: relative to
the working directory, or else to the config's own folder) is an input too; a config named there
is followed in turn, to FOLLOW levels. A folder named in a config is a place, not an input (as one
a module names); a config naming more than MAX_FILES files is a manifest, which stands for them. A
file that does not parse adds nothing: its own content is compared anyway. Nothing is cached: a
config's strings may be secrets, and nothing of it is written anywhere.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from collections.abc import Iterable, Iterator
from typing import Any

import yaml

from ..scriptargs import PathNames, is_pattern
from . import hydra

SUFFIXES = (".yaml", ".yml", ".json", ".toml")
#: a larger "config" is data (a dataset's index): not parsed
MAX_BYTES = 1 << 20
#: the most strings of one config looked up
MAX_TEXTS = 10_000
#: a config that names more files than this is a manifest (a dataset's file list): it stands for them,
#: as the docs advise, and they are not hashed one by one
MAX_FILES = 64
#: the most values of one config walked
MAX_NODES = 100_000
#: configs named by configs are followed this deep (a config that includes another; Hydra's config groups)
FOLLOW = 3


def is_config(path: str) -> bool:
    return path.lower().endswith(SUFFIXES)


def files_named_by_configs(inputs: Iterable[str]) -> set[str]:
    """The existing files (absolute paths) that the config files among ``inputs`` name."""
    here, found = PathNames(), set()
    todo = [path for path in inputs if is_config(path)]
    seen = set(todo)
    for _ in range(FOLLOW):
        follow = []
        for config in todo:
            named = _named(config, here) - seen
            seen |= named
            found |= named
            follow += sorted(path for path in named if is_config(path))
        todo = follow
    return found


def _named(config: str, here: PathNames) -> set[str]:
    """The files one config names; none if it names more than MAX_FILES (a manifest: it stands for them)."""
    near = PathNames(os.path.dirname(os.path.abspath(config)))
    data = _load(config)
    named = set(hydra.defaults_files(config, data))  # (``defaults: [model: gpt]``: conf/model/gpt.yaml)
    for text in itertools.islice(_strings(data), MAX_TEXTS):
        path = here.named(text) or near.named(text)
        if path is not None and (os.path.isfile(path) or is_pattern(path)):
            named.add(path)
            if len(named) > MAX_FILES:
                return set()
    return named


def _load(path: str) -> Any:
    """The parsed config, or None (too large, unreadable, or not valid YAML, JSON or TOML)."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
        if path.lower().endswith(".json"):
            return json.loads(data)
        if path.lower().endswith(".toml"):
            return tomllib.loads(data.decode())
        return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError):  # (TOMLDecodeError is a ValueError)
        return None


def _strings(value: Any) -> Iterator[str]:
    """Every string value in a parsed config (a dict's values, not its keys), depth first; at most
    MAX_NODES values looked at (YAML's aliases can make a list that holds itself)."""
    stack = [value]
    for _ in range(MAX_NODES):
        if not stack:
            return
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
