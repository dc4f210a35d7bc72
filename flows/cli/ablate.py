"""``coevolve ablate``: the ladder zero-shot / static / random / signal-guided, N seeds, R rounds.

    coevolve ablate --config configs/tiny.yaml --seeds 2 --rounds 1 --store /tmp/abl
    coevolve ablate --config configs/ablate-cpu.yaml              # the CPU preset
    coevolve sql --store /tmp/abl "select * from ablations"        # the rows behind the table

Runs as a Prefect flow (conditions as subflows) like ``coevolve run``; ``--no-prefect`` runs
the same library calls directly. Rerunning in the same store skips finished runs.
"""

from __future__ import annotations

import os

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail, parse_sets, preflight


def summary_table(df):
    """The summary (polars) as a rich table: mean and min-max over seeds of the held-out success
    rate and of the held-out reward (partial credit, which moves where success stays 0)."""
    from rich import box
    from rich.table import Table

    def cell(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    table = Table(
        title="coevolve ablate: held-out success rate and reward over seeds", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in ("condition", "round", "seeds", "success", "min-max", "reward", "min-max"):
        table.add_column(col, justify="left" if col == "condition" else "right", no_wrap=True)
    for row in df.iter_rows(named=True):
        table.add_row(
            row["condition"],
            str(row["round"]),
            str(row["seeds"]),
            cell(row["mean"]),
            f"{cell(row['min'])}-{cell(row['max'])}",
            cell(row.get("mean_reward")),
            f"{cell(row.get('min_reward'))}-{cell(row.get('max_reward'))}",
        )
    return table


SHORT_METRICS = {
    "eval_score": "success",
    "eval_reward": "reward",
    "synth_score": "synth success",
    "synth_reward": "synth reward",
}


def print_comparisons(run) -> None:
    """The paired differences of neighbouring rungs at the last round, and the verdicts in words."""
    from rich import box
    from rich.table import Table

    from coevolve.ablate import ablation_store
    from coevolve.ablate_stats import compare, verdicts

    comps = compare(ablation_store(run).read("ablations").to_pylist())
    if comps:
        last = max(c.round for c in comps)
        short = {"zero-shot": "zero-shot", "static": "static", "random": "random", "signal-guided": "guided"}
        table = Table(
            title=f"round {last}: upper - lower rung, paired per seed (95% bootstrap CI)",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
            collapse_padding=True,
        )
        apart = {"above": "yes (+)", "below": "yes (-)", "not separated": "no", "too few seeds": "n < 3"}
        seeds = max(len(c.diffs) for c in comps)
        table.title = f"round {last}, {seeds} seeds: upper - lower rung, paired per seed (95% bootstrap CI)"
        for col in ("pair", "metric", "diff", "95% CI", "up/dn", "apart"):
            table.add_column(col, justify="left" if col in ("pair", "metric", "verdict") else "right", no_wrap=True)
        for c in (c for c in comps if c.round == last):
            table.add_row(
                f"{short.get(c.upper, c.upper)} - {short.get(c.lower, c.lower)}",
                SHORT_METRICS.get(c.metric, c.metric),
                f"{c.mean:+.3f}",
                f"[{c.lo:+.3f}, {c.hi:+.3f}]",
                f"{c.wins}/{c.losses}",
                apart[c.verdict],
            )
        console.print(table)
    for line in verdicts(comps):
        console.print(line, highlight=False)


def _print_run(event: str, run) -> None:
    what = {"skip": "[dim]skipped (finished)[/dim]", "start": "running", "done": "[green]done[/green]"}[event]
    console.print(f"  {run.run_id:<20} {what}")


@app.command()
def ablate(
    config: str = typer.Option(None, "--config", "-c", help="YAML run config every condition starts from."),
    seeds: int = typer.Option(None, help="Seeds per condition: config seed, seed+1, ... (default: ablate.seeds)."),
    rounds: int = typer.Option(None, help="Rounds per trained condition (default: the config's rounds)."),
    store: str = typer.Option(
        None, help="Ablation store (default: the config's store); runs live under <store>/conditions/."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override any field for every condition: --set train.steps=4."),
    prefect: bool = typer.Option(True, "--prefect/--no-prefect", help="Run as a Prefect flow (default) or directly."),
) -> None:
    """Run, or resume, the ablation ladder and print the held-out score per condition and round."""
    from coevolve.ablate import plan, run_ablation
    from coevolve.config import ConfigError

    overrides = {"store": store, **parse_sets(set_)}
    cfg = preflight(config, overrides)
    seeds = seeds or cfg.ablate.seeds
    try:
        runs = plan(cfg, seeds, rounds or cfg.rounds, cfg.store)
    except ConfigError as exc:
        fail(str(exc))
    console.print(
        f"[bold]coevolve[/bold] ablate: {len(runs)} runs ({seeds} seed(s) x "
        f"{len({r.condition.name for r in runs})} conditions), {rounds or cfg.rounds} round(s), store {cfg.store}"
    )

    for key, value in (
        ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
        ("DO_NOT_TRACK", "1"),
        ("PREFECT_LOGGING_LEVEL", "WARNING"),
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ):
        os.environ.setdefault(key, value)
    if prefect:
        from coevolve.ablate import ablation_store, is_done
        from flows.ablate import ablate_flow

        st = ablation_store(runs[0])
        for run in runs:
            console.print(f"  {run.run_id:<20} {'[dim]skipped (finished)[/dim]' if is_done(st, run) else 'to run'}")
        from flows.cli.run import StageStatus, prefect_api
        from coevolve.events import add_listener

        # a line per stage event (an ablation is long and draws no live table), and a private
        # Prefect API that dies with this process (Prefect's ephemeral one outlives a killed run)
        remove = add_listener(StageStatus(log=lambda line: console.print(f"  {line}", highlight=False)))
        try:
            with prefect_api():
                df = ablate_flow(
                    config=config,
                    seeds=seeds,
                    rounds=rounds or cfg.rounds,
                    store=cfg.store,
                    overrides=parse_sets(set_),
                )
        finally:
            remove()
    else:
        df = run_ablation(runs, on_run=_print_run)
    console.print(summary_table(df))
    print_comparisons(runs[0])
    console.print(
        f'Rows: coevolve sql --store {cfg.store} "select * from ablations"   Plots: coevolve report --store {cfg.store}'
    )
