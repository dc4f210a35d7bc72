"""Plug-ins by name: environments, explorers, abstractors, trainers, policy backends.

    @register("environment", "bfcl-v3")
    class BfclEnvironment: ...

    env_cls = resolve("environment", "bfcl-v3")      # or a dotted path "pkg.mod:Class"

Built-in plug-ins register themselves when their module is imported; ``resolve`` imports
the module that provides a built-in name on first use, so callers never need to.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

_REGISTRY: dict[str, dict[str, Any]] = {}

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


def resolve(kind: str, name: str) -> Any:
    """Return the plug-in registered as ``name``, or import ``module:attr`` if it is a path."""
    if ":" in name:
        module, attr = name.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    if name not in _REGISTRY.get(kind, {}) and kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.get(kind, {}))) or "none"
        raise KeyError(f"unknown {kind} {name!r}; known: {known} (or give a 'module:attr' path)") from None


def check_plugins(cfg: Any) -> None:
    """Resolve every plug-in a run config names (environment, trainer, explorer, abstractor);
    an unknown one raises ``ConfigError`` naming it, before anything runs."""
    from coevolve.config import ConfigError

    for kind, name in (
        ("environment", cfg.env.name),
        ("trainer", cfg.train.backend),
        ("explorer", cfg.explore.explorer),
        ("abstractor", cfg.abstract.abstractor),
    ):
        try:
            resolve(kind, name)
        except KeyError as exc:
            raise ConfigError(f"{kind} {name!r}: {exc.args[0]}") from None
