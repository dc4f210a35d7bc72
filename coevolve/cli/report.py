"""``coevolve report``: PNG plots and a Markdown report of the runs (or the ablation) in a store.

coevolve report --store /tmp/cv                         # every run, into /tmp/cv/report
coevolve report --store /tmp/abl --out /tmp/abl-report  # an ablation: per condition, seed bands
coevolve report --store /tmp/cv --run tiny --run other  # some runs only
"""

from __future__ import annotations

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail, open_store_or_fail


@app.command()
def report(
    store: str = typer.Option(".coevolve/store", "--store", "-s", help="Local directory or s3://bucket/prefix."),
    run: list[str] = typer.Option([], "--run", "-r", help="Only these run ids (repeatable; default: every run)."),
    out: str = typer.Option(
        None, "--out", "-o", help="Output folder (default: <store>/report, or ./coevolve-report for S3)."
    ),
) -> None:
    """Write PNG plots and report.md: score, signals, pass rate, pool, task turns, stage times."""
    from coevolve.report import write_report
    from coevolve.store import StoreError

    st = open_store_or_fail(store)
    try:
        rep = write_report(st, runs=run, out=out)
    except StoreError as exc:  # a recorded part missing, truncated or not Parquet: named, one line
        fail(str(exc))
    for path in rep.files:
        console.print(f"  {path}")
    for note in rep.notes:
        console.print(f"  [dim]not plotted: {note}[/dim]")
    console.print(f"Report: {rep.out / 'report.md'}")
