"""``coevolve`` CLI entry point: importing the command modules registers their commands."""

from __future__ import annotations

from coevolve.cli.app import app

# Each module adds its commands to `app` (or `bench_app`) when imported.
from coevolve.cli import run as _run  # noqa: F401,E402
from coevolve.cli import sql as _sql  # noqa: F401,E402
from coevolve.cli import signals as _signals  # noqa: F401,E402
from coevolve.cli import eval as _eval  # noqa: F401,E402
from coevolve.cli import bench as _bench  # noqa: F401,E402
from coevolve.cli import policy as _policy  # noqa: F401,E402
from coevolve.cli import train as _train  # noqa: F401,E402
from coevolve.cli import ablate as _ablate  # noqa: F401,E402
from coevolve.cli import report as _report  # noqa: F401,E402
from coevolve.cli import bench_fanout as _bench_fanout  # noqa: F401,E402


def main() -> None:
    app()
