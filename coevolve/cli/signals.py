"""``coevolve signals``: the feedback signals of a round (``coevolve bench signals``, the queries'
benchmark, is in ``coevolve/cli/bench.py``).

coevolve signals --store .coevolve/store --round 2            # print (mine if not stored yet)
coevolve signals --round 2 --run myrun --mine --set rare_n=1   # re-mine with other thresholds
"""

from __future__ import annotations

import json
from enum import Enum

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail, load_config_or_fail, open_store_or_fail, parse_sets


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def _signals_config(config: str | None, sets: list[str]):
    return load_config_or_fail(config, parse_sets(sets, prefix="signals."))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# one line of evidence per signal type, for people (``--format json`` has all of it)
_SUMMARY = {
    "forgetting": lambda e: (
        f"success {_num(e['before_rate'])} / reward {_num(e['before_reward'])} (n={e['before_n']}, round "
        f"{e['before_round']} step {e['before_step']}) -> {_num(e['now_rate'])} / {_num(e['now_reward'])} "
        f"(n={e['now_n']}); fails in {e['failing_episode_id']}"
    ),
    "boundary": lambda e: (
        f"rate {e['rate'] if e['rate'] is None else round(e['rate'], 2)} (n={e['n']}), "
        f"reward var {e['reward_var'] if e['reward_var'] is None else round(e['reward_var'], 3)}; "
        f"fails in {e['failing_episode_id']}"
    ),
    "rare": lambda e: (
        f"{e['n_occurrences']}x in {e['n_episodes']} episodes ({e['share']:.2%}, round cutoff {e['cutoff']}x); "
        f"tasks {', '.join(t for t in e['task_ids'][:3] if t)}"
    ),
    "uncertainty": lambda e: (
        f"mean token log-prob {e['mean_logprob']:.3f} over {e['n_tokens']} tool-call tokens "
        f"({e['low_token_share']:.0%} below even odds); rate {_num(e['rate'])} (n={e['n']}); "
        f"fails in {e['failing_episode_id']}"
    ),
    "reward_hacking": lambda e: (
        f"{e['kind']}: reward {_num(e['reward'])} (progress {_num(e['progress'])}, format {_num(e['format'])}) "
        f"at success {_num(e['rate'])} (n={e['n']}); before {_num(e['before_reward'])} at {_num(e['before_rate'])}"
    ),
}


def _check_rollouts(st, run_id: str, round_no: int) -> None:
    """Exit naming what the store has when it holds no rollouts of ``run_id`` in ``round_no``
    (mining them would write an empty signals part under a run or round that is not there)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    rounds = st.read("rollouts", filter=ds.field("run_id") == run_id, columns=["round"]).column("round")
    if round_no in set(rounds.to_pylist()):
        return
    if len(rounds):
        have = ", ".join(str(r) for r in sorted(set(rounds.to_pylist())))
        fail(f"run {run_id!r} has no rollouts in round {round_no} of {st.uri} (its rounds: {have}); nothing mined")
    runs = sorted(pc.unique(st.read("rollouts", columns=["run_id"]).column("run_id")).to_pylist())
    have = ", ".join(repr(r) for r in runs) if runs else "none"
    fail(
        f"{st.uri} has no rollouts of run {run_id!r} (runs there: {have}); pass --run NAME or the run's "
        "--config; nothing mined"
    )


@app.command()
def signals(
    round_no: int = typer.Option(..., "--round", "-r", help="The round whose signals to show."),
    store: str = typer.Option(
        "", "--store", "-s", help="Local directory or s3://bucket/prefix (default: the config's)."
    ),
    run: str = typer.Option("", "--run", help="Run name (default: the config's run_name, 'default')."),
    config: str = typer.Option(
        None, "--config", "-c", help="Run config YAML; its `signals` section sets the thresholds."
    ),
    sets: list[str] = typer.Option([], "--set", help="Override a signals threshold, KEY=VALUE (repeatable)."),
    mine: bool = typer.Option(False, "--mine", help="Mine again from the rollouts and rewrite the round's signals."),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="table (for people) or json."),
) -> None:
    """Print the signals of a round: the stored ones, or mined now if the round has none."""
    import pyarrow.dataset as ds

    from coevolve.signals import mine_signals

    cfg = _signals_config(config, sets)
    run_id = run or cfg.run_name
    st = open_store_or_fail(store or cfg.store, cfg.s3)
    table = st.read("signals", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no))
    if mine or table.num_rows == 0:
        _check_rollouts(st, run_id, round_no)
        table = mine_signals(st, cfg.signals, run_id, round_no)
        console.print(
            f"mined from the rollouts of run {run_id!r} round {round_no} and written to the store", style="dim"
        )
    rows = table.drop_columns(["round"]).to_pylist() if "round" in table.column_names else table.to_pylist()
    from coevolve.signals import signal_types

    order = {t: i for i, t in enumerate(signal_types(cfg.signals))}  # built-ins, then the user's files
    rows.sort(key=lambda r: (order.get(r["signal_type"], len(order)), r["rank"]))
    if format is OutputFormat.json:
        print(json.dumps(rows))
        return
    from rich.table import Table

    out = Table("type", "#", "task / pattern", "score", "new", "evidence")
    for r in rows:
        ev = json.loads(r["evidence"])
        try:
            summary = _SUMMARY[r["signal_type"]](ev)
        except (KeyError, TypeError):  # edited queries may return other evidence columns
            summary = json.dumps(ev)
        out.add_row(
            r["signal_type"],
            str(r["rank"]),
            r["task_id"] or r["pattern"],
            f"{r['score']:.4g}",
            "yes" if r["is_new"] else "no",
            summary,
        )
    console.print(out)
    counts = {t: sum(r["signal_type"] == t for r in rows) for t in order}
    console.print(f"run {run_id!r} round {round_no}: " + ", ".join(f"{n} {t}" for t, n in counts.items()))
