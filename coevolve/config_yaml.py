"""The config's type checker: plain mappings (parsed YAML, dotted ``--set`` overrides) in and
out of the config dataclasses of ``coevolve.config``.

    build(RunConfig, {"train": {"steps": 4}}, "")   # a RunConfig, every value type-checked
    dump(cfg)                                       # back to a mapping of YAML keys

Keys are the dataclass fields' names; a value must match its field's type hint (``int``, ``float`` (an int is
accepted), ``str``, ``bool``, ``list[...]``, unions, nested config dataclasses). An unknown
key or a wrong type raises ``ConfigError`` naming the dotted path of the field.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A configuration problem, with the field path in the message."""


def dump(obj: Any) -> Any:
    """A config dataclass as nested dicts of YAML keys (anything else as it is)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def check_type(value: Any, tp: Any, where: str) -> Any:
    """``value`` if it matches the type hint ``tp`` (an int where a float is expected becomes a
    float), else ``ConfigError`` at the dotted path ``where``."""
    origin = typing.get_origin(tp)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 (PyYAML) reads "3e-3" as a string; YAML 1.2 and a user read a float
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return check_type(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} does not match {tp}")
    return value


def build(cls: type, data: dict[str, Any], where: str) -> Any:
    """An instance of the config dataclass ``cls`` from the mapping ``data`` (found at the dotted
    path ``where``, "" for the top): every key known, every value type-checked, sections built
    recursively; fields not in ``data`` keep their defaults. Sections' ``validate`` is not called."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    by_key = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(by_key)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"{where + '.' if where else ''}{name}: unknown key (known: {', '.join(sorted(by_key))})")
    kwargs = {}
    for key, value in data.items():
        f = by_key[key]
        path = f"{where}.{key}" if where else key
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = build(tp, value or {}, path)
        else:
            kwargs[f.name] = check_type(value, tp, path)
    return cls(**kwargs)


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted`` = "a.b.c", making missing sections."""
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    node[leaf] = value


def merge(base: dict[str, Any], section: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``section`` merged over it, mapping by mapping (neither is changed)."""
    out = dict(base)
    for key, value in section.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
