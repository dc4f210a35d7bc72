"""The library's commands: importing the command modules registers them on ``app``.

    python -m coevolve.cli sql --store /tmp/cv "select * from rounds"

The commands that drive Prefect flows (``coevolve run``, ``coevolve ablate``, ``coevolve bench
fanout``) belong to the orchestration layer: ``flows/cli`` registers them on this same ``app``,
and the ``coevolve`` console script (``python -m flows``) is that full CLI. The library never
imports Prefect or ``flows``.
"""

from __future__ import annotations

from coevolve.cli.app import app

# Each module adds its commands to `app` (or `bench_app`) when imported.
from coevolve.cli import sql as _sql  # noqa: F401,E402
from coevolve.cli import signals as _signals  # noqa: F401,E402
from coevolve.cli import eval as _eval  # noqa: F401,E402
from coevolve.cli import bench as _bench  # noqa: F401,E402
from coevolve.cli import policy as _policy  # noqa: F401,E402
from coevolve.cli import train as _train  # noqa: F401,E402
from coevolve.cli import report as _report  # noqa: F401,E402


def main() -> None:
    app()
