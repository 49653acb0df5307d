"""The YAML files users write (stage configs, a sweep's base, site files), read as PyYAML's safe loader
reads them, but a key given twice in one mapping is refused with both lines: PyYAML keeps the last one
silently, so a ``steps: 50`` pasted below ``steps: 200`` trained 50 steps, and an edit of the first
changed nothing. (YAML's merge key ``<<`` still lets a mapping override what it merges.)"""

from __future__ import annotations

import functools
from typing import Any


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``; a key given twice raises ``DuplicateKey`` (a ``yaml.YAMLError``)."""
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass


@functools.lru_cache(maxsize=1)
def _loader() -> type:
    """PyYAML's SafeLoader, checking each mapping's keys before it builds the mapping (made once: yaml is
    imported only where a file is read)."""
    import yaml

    class DuplicateKey(yaml.YAMLError):
        """A key given twice in one mapping: the message names it and both lines."""

    def construct_mapping(self: yaml.SafeLoader, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue  # (a merge may be overridden; a key that is a mapping or a list is refused anyway)
                key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                if key in lines:
                    raise DuplicateKey(f"line {line}: the key {key!r} is given a second time (first on line "
                                       f"{lines[key]}), and only the last would count: keep one")
                lines[key] = line
        return yaml.SafeLoader.construct_mapping(self, node, deep=deep)

    return type("UniqueKeyLoader", (yaml.SafeLoader,), {"construct_mapping": construct_mapping})
