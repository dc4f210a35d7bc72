"""Helpers shared by the CLI commands: console, errors, opening the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from coevolve.store import Store, StoreError

console = Console()
err_console = Console(stderr=True)


def print_table(table: Any) -> None:
    """Print a rich table at its natural width when the output is not a terminal (a log file or a
    pipe would otherwise get Rich's 80 columns and cells cut to "smoll…"); fitted to a terminal."""
    (console if console.is_terminal else Console(width=240)).print(table)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/bold red] {message}")
    raise typer.Exit(code)


def parse_sets(pairs: list[str], prefix: str = "") -> dict[str, Any]:
    """``--set KEY=VALUE`` options as dotted overrides (values parsed as YAML scalars); a value
    that is not valid YAML exits with one line naming its key."""
    from coevolve.config_yaml import ConfigError, parse_override

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--set expects KEY=VALUE (e.g. {prefix or 'train.'}steps=4), got {pair!r}")
        try:
            out[f"{prefix}{key}"] = parse_override(f"{prefix}{key}", value)
        except ConfigError as exc:
            fail(f"--set {exc}")
    return out


def load_config_or_fail(config: str | None, overrides: dict[str, Any]):
    """``load_config`` that exits with the offending field named instead of a traceback."""
    from coevolve.config import ConfigError, load_config

    try:
        return load_config(config, overrides)
    except ConfigError as exc:
        fail(str(exc))


def local_store_problem(uri: str) -> str | None:
    """Why the local store ``uri`` cannot be a directory (it, or a folder above it, is a file);
    None when it can. S3 stores are checked by ``Store.check_reachable``."""
    if uri.startswith("s3://"):
        return None
    path = Path(uri).expanduser()
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                what = "is a file" if p == path else f"lies under {p}, which is a file"
                return f"store {uri} {what}: give a directory (new or existing) for --store"
            return None
    return None


def preflight(config: str | None, overrides: dict[str, Any]):
    """Load and check everything that can be checked before anything is written or started:
    the config (types, ranges, trusted plug-ins), the plug-in names it uses, that a local
    store is a directory, and that the store is reachable (S3 within the configured ``s3.*``
    timeouts and attempts)."""
    from coevolve.config import ConfigError
    from coevolve.registry import check_plugins
    from coevolve.store_open import open_run_store

    cfg = load_config_or_fail(config, overrides)
    problem = local_store_problem(cfg.store)
    if problem:
        fail(problem)
    try:
        check_plugins(cfg)
        open_run_store(cfg)
    except (ConfigError, StoreError) as exc:
        fail(str(exc))
    return cfg


def open_store_or_fail(uri: str, s3: Any = None, must_exist: bool = True) -> Store:
    """Open the store at ``uri`` with the S3 settings ``s3`` (a config's ``S3Config``; None: the
    defaults, see ``coevolve.store_open``); exit with a clear message if it is unusable (or, for
    readers, if a local store does not exist yet)."""
    from coevolve.store_open import store_at

    try:
        store = store_at(uri, s3)
        store.check_reachable()
        if must_exist and not store.is_s3 and not Path(store.root).is_dir():
            raise StoreError(f"no store at {store.root} (run `coevolve run --store {uri}` first)")
    except StoreError as exc:
        fail(str(exc))
    return store
