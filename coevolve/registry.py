"""Plug-ins by name: environments, explorers, abstractors, trainers, policy backends.

    @register("environment", "bfcl-v3")
    class BfclEnvironment: ...

    env_cls = resolve("environment", "bfcl-v3")      # or an allowed dotted path "pkg.mod:Class"

Built-in plug-ins register themselves when their module is imported; ``resolve`` imports
the module that provides a built-in name on first use, so callers never need to. Installed
packages add plug-ins as entry points (group ``coevolve.<kind>``, e.g. ``coevolve.environment``).

A ``module:attr`` path is code named by a string, and strings reach a run from a Prefect form:
``resolve`` imports one only when it is trusted: listed in a config file's ``trust.plugins``
(``config.check_trust`` passes those to ``trust`` whenever a config is checked) or in
``$COEVOLVE_PLUGINS`` on the worker. Any other path is refused without importing anything.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Iterable

_REGISTRY: dict[str, dict[str, Any]] = {}
_TRUSTED: set[str] = set()  # module:attr paths a checked config allowed (config.check_trust)
PLUGINS_ENV = "COEVOLVE_PLUGINS"  # comma-separated module:attr paths the worker's operator allows

# Where built-in plug-ins live, so that resolving one imports its module lazily.
_BUILTIN_MODULES: dict[str, str] = {
    "environment": "coevolve.envs",
    "explorer": "coevolve.explorers",
    "abstractor": "coevolve.abstractors",
    "trainer": "coevolve.train",
    "policy": "coevolve.policy",
}


def register(kind: str, name: str) -> Callable[[Any], Any]:
    def deco(obj: Any) -> Any:
        _REGISTRY.setdefault(kind, {})[name] = obj
        return obj

    return deco


def names(kind: str) -> list[str]:
    if kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    return sorted(_REGISTRY.get(kind, {}))


def trust(paths: Iterable[str]) -> None:
    """Allow ``resolve`` to import these ``module:attr`` paths (from a config file's ``trust.plugins``)."""
    _TRUSTED.update(paths)


def trusted(name: str) -> bool:
    """Whether the ``module:attr`` path ``name`` may be imported."""
    from_env = {p.strip() for p in os.environ.get(PLUGINS_ENV, "").split(",") if p.strip()}
    return name in _TRUSTED or name in from_env


def entry_point(kind: str, name: str) -> EntryPoint | None:
    """The installed entry point ``name`` of group ``coevolve.<kind>`` (by name or by its value)."""
    for ep in entry_points(group=f"coevolve.{kind}"):
        if name in (ep.name, ep.value):
            return ep
    return None


def resolve(kind: str, name: str) -> Any:
    """Return the plug-in registered as ``name`` (built in, or an installed entry point), or
    import ``module:attr`` if it is a trusted path; an untrusted path raises ``KeyError``
    before anything is imported."""
    if ":" in name:
        ep = entry_point(kind, name)
        if ep is not None:
            return ep.load()
        if not trusted(name):
            raise KeyError(
                f"{kind} {name!r}: a 'module:attr' path is imported only when trusted: list it under "
                f"trust.plugins in the config file or in ${PLUGINS_ENV} on the worker"
            )
        module, attr = name.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    if name not in _REGISTRY.get(kind, {}) and kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        ep = entry_point(kind, name)
        if ep is not None:
            return ep.load()
        known = ", ".join(sorted(_REGISTRY.get(kind, {}))) or "none"
        raise KeyError(f"unknown {kind} {name!r}; known: {known} (or a trusted 'module:attr' path)") from None


def plugin_fields(cfg: Any) -> list[tuple[str, str, str]]:
    """``(field, registry kind, name)`` of every plug-in a run config names."""
    return [
        ("env.name", "environment", cfg.env.name),
        ("train.backend", "trainer", cfg.train.backend),
        ("explore.explorer", "explorer", cfg.explore.explorer),
        ("synth.explorer", "explorer", cfg.synth.explorer),
        ("abstract.abstractor", "abstractor", cfg.abstract.abstractor),
        ("validate.solver", "solver", cfg.validate.solver),
    ]


def check_plugins(cfg: Any) -> None:
    """Resolve every plug-in a run config names (``plugin_fields``: environment, trainer,
    explorers, abstractor, solver); an unknown or untrusted one raises ``ConfigError`` naming
    its field, before anything runs."""
    from coevolve.config_yaml import ConfigError

    for where, kind, name in plugin_fields(cfg):
        if kind == "solver" and name in ("policy", "explorer", "none"):
            continue  # the validation stage's own names (coevolve.validate), not registry entries
        try:
            resolve(kind, name)
        except KeyError as exc:
            raise ConfigError(f"{where} {name!r}: {exc.args[0]}") from None
