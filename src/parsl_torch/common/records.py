"""Plain data (parsed YAML) into frozen dataclasses, strictly.

Shared by site files and stage configs: unknown keys get a did-you-mean,
types are checked without coercion between types (a quoted "2" is not an
int), and every error names the dotted field it is about. A record may check
itself in ``__post_init__`` (raising the same error, starting with its field
name); the error then gains the path to that record.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

#: a name that becomes an environment variable (and a shell word)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _convert(value: Any, tp: Any, where: str, error: type[Exception]) -> Any:
    """``value`` as type ``tp`` (no coercion between types), or ``error``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _convert(value, option, where, error)
            except error as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise error(f"{where}: expected a mapping of settings, got {type(value).__name__}")
        return build_dataclass(tp, value, where, error)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise error(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        item = typing.get_args(tp)[0]
        return tuple(_convert(v, item, f"{where}[{i}]", error) for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            raise error(f"{where}: expected a mapping, got {type(value).__name__}")
        item = typing.get_args(tp)[1] if typing.get_args(tp) else None
        if dataclasses.is_dataclass(item):  # named records (a site's queues)
            return {str(k): _convert(v, item, f"{where}.{k}", error) for k, v in value.items()}
        if typing.get_args(tp)[1:] == (typing.Any,):  # free-form settings, passed on as they are
            if bad := [k for k in value if not isinstance(k, str)]:
                raise error(f"{where}: keys must be strings, got {bad[0]!r}")
            return dict(value)
        if bad := [k for k, v in value.items() if not isinstance(k, str) or not isinstance(v, (str, int, float))]:
            raise error(f"{where}.{bad[0]}: values must be strings or numbers")
        return {k: str(v) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is typing.Any or (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        return value
    hint = " (quote it)" if tp is str and value is not None else ""
    if tp in (int, float) and isinstance(value, str) and _is_number(value):
        # YAML 1.1 reads 1e5 and 1.0e308 as text: an exponent needs a dot and a sign
        hint = f" (YAML reads it as text: write {_yaml_number(value)})"
    raise error(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}{hint}")


def build_dataclass(cls: type, data: Mapping[str, Any], where: str, error: type[Exception]) -> Any:
    """``cls(**data)`` after checking every key and type; errors name the dotted field."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if retired := getattr(cls, "RETIRED", {}).get(key):
            raise error(f"{path}: no longer a setting: {retired}")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(names)}"
            raise error(f"{path}: unknown setting{hint}")
        values[key] = _convert(value, hints[key], path, error)
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               and f.name not in values]
    if missing:
        raise error(f"{where + '.' if where else ''}{missing[0]}: required setting is missing")
    try:
        return cls(**values)
    except error as exc:  # a record's own check (__post_init__) names its field; add where it sits
        raise error(f"{where}.{exc}" if where else str(exc)) from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _yaml_number(text: str) -> str:
    """``text`` as a number YAML reads as one: 1e5 -> 1.0e+5, 1.0e308 -> 1.0e+308."""
    mantissa, e, exponent = text.lower().partition("e")
    if not e:
        return text
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent if exponent[:1] in '+-' else '+' + exponent}"
