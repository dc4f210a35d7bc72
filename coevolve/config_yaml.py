"""The config's type checker: plain mappings (parsed YAML, dotted ``--set`` overrides) in and
out of the config dataclasses of ``coevolve.config``.

    build(RunConfig, {"train": {"steps": 4}}, "")   # a RunConfig, every value type-checked
    dump(cfg)                                       # back to a mapping of YAML keys

Keys are the dataclass fields' names; a value must match its field's type hint (``int``, ``float`` (an int is
accepted), ``str``, ``bool``, ``list[...]``, unions, nested config dataclasses). An unknown
key, a wrong type, a non-finite float, an integer beyond 64 bits or a value outside its field's
range (``Range``, in the field's metadata) raises ``ConfigError`` naming the dotted path of the field.
An error never quotes a line of the file it came from (``yaml_error``): a file that is not a config
(a credentials file given as one by mistake or on purpose) is named, its content is not.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A configuration problem, with the field path in the message."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: ``ge`` <= v (or ``gt`` < v) and v <= ``le``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def __contains__(self, value: float) -> bool:
        # written so that NaN is outside every range
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
        )

    def __str__(self) -> str:
        low = f">= {self.ge:g}" if self.ge is not None else f"> {self.gt:g}" if self.gt is not None else ""
        high = f"<= {self.le:g}" if self.le is not None else ""
        return " and ".join(p for p in (low, high) if p)


def yaml_error(exc: Exception) -> str:
    """A YAML parse error in one line, with its position but without the text around it
    (PyYAML's message quotes the offending line: a secret in a file must not reach a log)."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or "not valid YAML"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def parse_override(key: str, text: str) -> Any:
    """The value of ``--set key=text``, read as a YAML scalar or flow collection; one line naming
    ``key`` when ``text`` is not valid YAML (``--set train.steps=[1``)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{key}: the value is not valid YAML ({yaml_error(exc)}); quote it or fix it") from None


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
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {_short(value)}")
        if tp is float and not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        if tp is int and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{where}: {_short(value)} does not fit in 64 bits")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {_short(value)}")
        return [check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return check_type(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {_short(value)} does not match {tp}")
    return value


def _short(value: Any) -> str:
    """A value for an error message: numbers as they are; text and collections only by their
    type and size (the value may be a line of a file that is no config, e.g. a credential)."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
        return text if len(text) <= 40 else f"a {len(text)}-digit number"
    if isinstance(value, str):
        return f"(text of {len(value)} characters)"
    return f"(a {type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'} items)"


def check_range(value: Any, f: dataclasses.Field, where: str) -> None:
    """``ConfigError`` at ``where`` if the field ``f`` has a range (``Range`` in its metadata)
    and the number ``value`` lies outside it; the message says the range."""
    bounds = f.metadata.get("range")
    if bounds is not None and isinstance(value, (int, float)) and value not in bounds:
        raise ConfigError(f"{where} = {_short(value)} is out of range: it must be {bounds}")


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
        name = sorted(map(str, unknown))[0]
        known = ", ".join(sorted(by_key))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", name):  # not quoted: it may be a foreign file's line
            raise ConfigError(f"{where or 'config'}: a key that is no config field (known: {known})")
        raise ConfigError(f"{where + '.' if where else ''}{name}: unknown key (known: {known})")
    kwargs = {}
    for key, value in data.items():
        f = by_key[key]
        path = f"{where}.{key}" if where else key
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = build(tp, value or {}, path)
        else:
            kwargs[f.name] = check_type(value, tp, path)
            check_range(kwargs[f.name], f, path)
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
