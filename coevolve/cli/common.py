"""Helpers shared by the CLI commands: console, errors, opening the store."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from coevolve.store import Store, StoreError

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/bold red] {message}")
    raise typer.Exit(code)


def open_store_or_fail(uri: str, endpoint_url: str = "", region: str = "", must_exist: bool = True) -> Store:
    """Open the store at ``uri``; exit with a clear message if it is unusable (or, for
    readers, if a local store does not exist yet)."""
    try:
        store = Store(uri, endpoint_url=endpoint_url, region=region)
        store.check_reachable()
        if must_exist and not store.is_s3 and not Path(store.root).is_dir():
            raise StoreError(f"no store at {store.root} (run `coevolve run --store {uri}` first)")
    except StoreError as exc:
        fail(str(exc))
    return store
