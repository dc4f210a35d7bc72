"""The full ``coevolve`` CLI: the library's commands (``coevolve.cli``) and the commands that
drive Prefect flows, which live here in the orchestration layer.

    coevolve run --config configs/tiny.yaml          # the console script is this module's main
    python -m flows run --config configs/tiny.yaml   # the same
    python -m coevolve.cli sql ...                   # the library's commands only

``run`` (``flows/cli/run.py``), ``ablate`` (``flows/cli/ablate.py``) and ``bench fanout``
(``flows/cli/bench_fanout.py``) register themselves on the library's Typer app when imported;
Prefect is imported only when one of them runs, so the other commands start as fast as before.
"""

from __future__ import annotations

from typing import Any

from coevolve.cli import app
from coevolve.cli.app import bench_app

# Each module adds its commands to `app` (or `bench_app`) when imported.
from flows.cli import run as _run  # noqa: F401,E402
from flows.cli import ablate as _ablate  # noqa: F401,E402
from flows.cli import bench_fanout as _bench_fanout  # noqa: F401,E402


def _place(typer_app: Any, name: str, after: str | None) -> None:
    """Move command ``name`` right after ``after`` (first when None), so that ``--help`` lists
    the commands where it always did."""
    commands = typer_app.registered_commands
    names = [c.name or c.callback.__name__.replace("_", "-") for c in commands]
    if name not in names or (after is not None and after not in names):
        return
    command = commands.pop(names.index(name))
    names.remove(name)
    commands.insert(0 if after is None else names.index(after) + 1, command)


_place(app, "run", None)
_place(app, "ablate", "train")
_place(bench_app, "fanout", "reliability")


def main() -> None:
    app()
