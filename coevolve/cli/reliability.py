"""``coevolve bench reliability`` (``make chaos``): the fault campaign of ``coevolve.reliability``.

    coevolve bench reliability                                   # everything: kills, concurrency, S3 faults, fuzz
    coevolve bench reliability --kills 3 --fuzz 20000 --scenarios kill,fuzz   # a quick look

Prints, per scenario, tried / survived / rows lost / rows duplicated / corrupt pool versions,
and exits with status 1 if any scenario lost, duplicated or corrupted anything.
"""

from __future__ import annotations

import typer

from coevolve.cli.app import bench_app
from coevolve.cli.common import console, parse_sets


@bench_app.command("reliability")
def bench_reliability(
    scenarios: str = typer.Option(
        "kill,concurrent-local,concurrent-s3,s3-faults,fuzz", help="Comma-separated scenarios."
    ),
    config: str = typer.Option("configs/tiny.yaml", "--config", "-c", help="Run config of the kill and fault runs."),
    rounds: int = typer.Option(2, help="Rounds of each run of the kill scenario."),
    kills: int = typer.Option(20, help="SIGKILL points of the kill scenario."),
    procs: int = typer.Option(4, help="Processes committing at once."),
    commits: int = typer.Option(5, help="Commits per process."),
    fault_rate: float = typer.Option(0.1, help="Share of S3 requests the proxy breaks (5xx, resets, stalls)."),
    fault_rounds: int = typer.Option(1, help="Rounds of the run through the faulty S3 proxy (0 = commits only)."),
    fuzz: int = typer.Option(1_000_000, help="Fuzzed model outputs through the parser and the dispatcher."),
    seed: int = typer.Option(0, help="Seed of the kill points, faults and fuzz."),
    workdir: str = typer.Option("", help="Where the campaign's stores go (default: a temporary directory)."),
    set_: list[str] = typer.Option([], "--set", help="Override a run config field of the runs: --set train.steps=2."),
) -> None:
    """Kill runs at random points, commit concurrently, break S3, fuzz model output; count losses."""
    from coevolve.reliability import SMALL_RUN, CampaignConfig, format_table, run_campaign

    cc = CampaignConfig(
        scenarios=[s.strip() for s in scenarios.split(",") if s.strip()],
        config=config or None,
        overrides={**SMALL_RUN, **parse_sets(set_)},
        rounds=rounds,
        kills=kills,
        procs=procs,
        commits=commits,
        fault_rate=fault_rate,
        fault_rounds=fault_rounds,
        fuzz=fuzz,
        seed=seed,
        workdir=workdir,
    )
    results = run_campaign(cc, log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    print(format_table(results), flush=True)  # plain: never wrapped to the terminal's width
    if not all(r.ok for r in results):
        raise typer.Exit(1)
